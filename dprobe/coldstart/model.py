"""The learned residual model: graph embedding + job features -> log-ratios to the analytical estimate."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch

from dprobe.graph.encoder import GraphEncoder

TARGETS = ["peak_memory_bytes", "device_memory_bytes", "gpu_utilization", "step_time_seconds"]
QUANTILES = (0.5, 0.9)


class ColdStartModel(nn.Module):
    """Outputs ``[n, 4, 2]``: per target the p50 residual and p90 residual (p90 >= p50 by construction).

    Residuals: log(measured / analytical) for memory and step time; logit of utilisation.
    """

    def __init__(self, n_features: int, hidden: int = 32, graph_dim: int = 8, layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = GraphEncoder(hidden=hidden, out_dim=graph_dim, layers=layers) if graph_dim > 0 else None
        self.register_buffer("mu", torch.zeros(n_features))
        self.register_buffer("sd", torch.ones(n_features))
        self.head = nn.Sequential(nn.Linear(n_features + graph_dim, hidden), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(hidden, 2 * len(TARGETS)))
        self.linear = nn.Linear(n_features, len(TARGETS))  # a linear path keeps extrapolation tame

    def forward(self, graphs: Batch | None, feats: torch.Tensor) -> torch.Tensor:
        f = (feats - self.mu) / self.sd
        z = self.encoder(graphs) if self.encoder is not None else f[:, :0]
        out = self.head(torch.cat([f, z], dim=1)).view(-1, len(TARGETS), 2)
        p50 = out[..., 0] + self.linear(f)
        p90 = p50 + nn.functional.softplus(out[..., 1])
        return torch.stack([p50, p90], dim=-1)


class ColdStartEnsemble(nn.Module):
    """Members trained from different seeds; their residual quantiles are averaged.

    With a few dozen runs to learn from, one network's errors depend on its seed
    as much as on the data; the average of a handful is steadier on new families.
    """

    def __init__(self, members: list[ColdStartModel]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.encoder = members[0].encoder  # whether graphs are needed at all
        # added to each target's p90 residual so that it covers 90 % of unseen families (see train.calibrate_p90)
        self.register_buffer("p90_shift", torch.zeros(len(TARGETS)))

    def forward(self, graphs: Batch | None, feats: torch.Tensor) -> torch.Tensor:  # -> [n, 4, 2]
        out = torch.stack([m(graphs, feats) for m in self.members]).mean(dim=0)
        p90 = torch.maximum(out[..., 1] + self.p90_shift, out[..., 0])
        return torch.stack([out[..., 0], p90], dim=-1)


def pinball(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    loss = 0.0
    for i, q in enumerate(QUANTILES):
        err = target - pred[..., i]
        loss = loss + (torch.maximum(q * err, (q - 1) * err) * weights).mean()
    return loss
