"""The learned residual model: graph embedding + job features -> log-ratios to the analytical estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from dprobe.core.metrics import pinball_terms
from dprobe.profiling.coldstart.features import FEATURES, MEMORY_FEATURES

if TYPE_CHECKING:  # PyG is imported only by a model with a graph encoder: the shipped one has none
    from torch_geometric.data import Batch

TARGETS = ["peak_memory_bytes", "device_memory_bytes", "gpu_utilization", "step_time_seconds"]
QUANTILES = (0.5, 0.9)
SD_FLOOR = 1e-3  # a feature whose spread over the training runs is at most this is taken as constant


def fit_standardisation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and spread of the training rows ``x`` ``[n, F]`` (spread floored at ``SD_FLOOR``)."""
    return x.mean(0), x.std(0).clamp_min(SD_FLOOR)


def standardise(feats: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """``(feats - mu) / sd``; a feature that was constant in training is held at its training value
    (0), since the network learnt nothing of it: a GPU or precision no training run had (the one value
    of a constant feature divided by the floor would be a thousandfold extrapolation)."""
    return torch.where(sd > SD_FLOOR, (feats - mu) / sd, torch.zeros_like(feats))


class Standardised(Protocol):
    """A network holding its training features' spread (its ``sd`` buffer)."""

    sd: torch.Tensor


def constant_features(mu_sd_holder: Standardised) -> list[int]:
    """Indices of the features that were constant over a model's training runs (see :func:`standardise`)."""
    return torch.nonzero(mu_sd_holder.sd <= SD_FLOOR).flatten().tolist()


class ResidualHead(nn.Module):
    """MLP + linear path from a subset of the features to ``[n, k, 2]`` raw residual outputs of k targets."""

    features: torch.Tensor  # a buffer: the indices of the features it sees

    def __init__(self, features: list[int], n_targets: int, hidden: int, graph_dim: int, dropout: float) -> None:
        super().__init__()
        self.register_buffer("features", torch.tensor(features, dtype=torch.long))
        self.mlp = nn.Sequential(nn.Linear(len(features) + graph_dim, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, 2 * n_targets))
        self.linear = nn.Linear(len(features), n_targets)  # a linear path keeps extrapolation tame

    def forward(self, f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x = f[:, self.features]  # [n, len(features)]
        out = self.mlp(torch.cat([x, z], dim=1)).view(x.shape[0], -1, 2)
        return torch.stack([out[..., 0] + self.linear(x), out[..., 1]], dim=-1)


class ColdStartModel(nn.Module):
    """Outputs ``[n, 4, 2]``: per target the p50 residual and p90 residual (p90 >= p50 by construction).

    Residuals: log(measured / analytical) for memory and step time; logit of utilisation. Each group of
    targets has a head of its own that sees only its features (``groups``: (target indices, feature
    indices) pairs; default one head for all), so that e.g. timing features cannot bend memory residuals.
    """

    mu: torch.Tensor  # buffers: the training features' mean and spread (standardise)
    sd: torch.Tensor

    def __init__(self, n_features: int, hidden: int = 32, graph_dim: int = 8, layers: int = 2,
                 dropout: float = 0.1, groups: list[tuple[list[int], list[int]]] | None = None) -> None:
        super().__init__()
        self.encoder = None
        if graph_dim > 0:
            from dprobe.graph.encoder import GraphEncoder

            self.encoder = GraphEncoder(hidden=hidden, out_dim=graph_dim, layers=layers)
        self.register_buffer("mu", torch.zeros(n_features))
        self.register_buffer("sd", torch.ones(n_features))
        groups = groups or [(list(range(len(TARGETS))), list(range(n_features)))]
        self.targets = [t for ts, _ in groups for t in ts]
        if sorted(self.targets) != list(range(len(TARGETS))):
            raise ValueError(f"groups must cover each of the {len(TARGETS)} targets once")
        self.heads = nn.ModuleList(ResidualHead(fs, len(ts), hidden, graph_dim, dropout) for ts, fs in groups)

    def forward(self, graphs: Batch | None, feats: torch.Tensor) -> torch.Tensor:
        f = standardise(feats, self.mu, self.sd)  # [n, n_features]
        z = self.encoder(graphs) if self.encoder is not None else f[:, :0]  # [n, graph_dim]
        out = torch.cat([head(f, z) for head in self.heads], dim=1)  # [n, 4, 2], targets in self.targets order
        out = out[:, torch.tensor(self.targets).argsort()]
        p50 = out[..., 0]
        p90 = p50 + nn.functional.softplus(out[..., 1])
        return torch.stack([p50, p90], dim=-1)


class ColdStartEnsemble(nn.Module):
    """Members trained from different seeds; their residual quantiles are averaged.

    With a few dozen runs to learn from, one network's errors depend on its seed
    as much as on the data; the average of a handful is steadier on new families.
    """

    p90_shift: torch.Tensor  # a buffer

    def __init__(self, members: list[ColdStartModel]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.encoder = members[0].encoder  # whether graphs are needed at all
        # added to each target's p90 residual so that it covers 90 % of unseen families (see fit.fit)
        self.register_buffer("p90_shift", torch.zeros(len(TARGETS)))

    def forward(self, graphs: Batch | None, feats: torch.Tensor) -> torch.Tensor:  # -> [n, 4, 2]
        out = torch.stack([m(graphs, feats) for m in self.members]).mean(dim=0)
        p90 = torch.maximum(out[..., 1] + self.p90_shift, out[..., 0])
        return torch.stack([out[..., 0], p90], dim=-1)


def target_groups(features: list[str]) -> list[tuple[list[int], list[int]]]:
    """Memory targets see the memory features only; utilisation and step time see all of them."""
    memory = [i for i, name in enumerate(features) if name in MEMORY_FEATURES]
    return [([0, 1], memory), ([2, 3], list(range(len(features))))]


def build_member(hp: dict[str, Any], n_features: int) -> ColdStartModel:
    """An untrained ensemble member of the hyperparameters ``hp`` (``hidden``, ``graph_dim``, ``layers``,
    ``dropout``), with a head per group of :func:`target_groups`."""
    return ColdStartModel(n_features, hidden=hp["hidden"], graph_dim=hp["graph_dim"], layers=hp["layers"],
                          dropout=hp["dropout"], groups=target_groups(FEATURES))


def pinball(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return torch.stack([(pinball_terms(target - pred[..., i], q) * weights).mean()
                        for i, q in enumerate(QUANTILES)]).sum()
