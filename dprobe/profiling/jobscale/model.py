"""The job-scale network and what it predicts against: the anchors (what the first second shows, or the
cold-start prediction), residuals to them, and the quantiles they give."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch

from dprobe.graph.encoder import GraphEncoder
from dprobe.profiling.coldstart.model import standardise
from dprobe.profiling.jobscale.features import OBS_FEATURES, JobScaleDataset, logit

LEVELS = (0.5, 0.9, 0.99)
VARIANTS = ("persist", "no_graph", "graph")


def persist(obs: np.ndarray) -> np.ndarray:
    """The plateau is the largest memory seen so far; utilisation stays at its first-second mean."""
    return np.stack([np.exp(obs[:, OBS_FEATURES.index("log_mem_max")]), obs[:, OBS_FEATURES.index("util_mean")]],
                    axis=1)


def graph_anchor(ds: JobScaleDataset, idx: np.ndarray) -> np.ndarray:
    """Memory plateau from the graph: the larger of the memory seen so far and the replayed estimate."""
    return np.maximum(persist(ds.obs[idx])[:, 0], ds.replayed_memory[idx])


def anchors(ds: JobScaleDataset, idx: np.ndarray, variant: str) -> np.ndarray:
    """``(N, 2)``: what the network's residuals are taken from: :func:`persist`, but with the graph
    the cold-start profiler's utilisation prediction for utilisation (where the dataset has one)."""
    out = persist(ds.obs[idx])
    if variant == "graph" and ds.coldstart_util is not None:
        out[:, 1] = ds.coldstart_util[idx]
    return out


def to_residual(y: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """``y`` ``(N, 2)`` against ``anchor`` ``(N, 2)`` (:func:`anchors`): log ratio of memory, logit
    difference of utilisation."""
    return np.stack([np.log(y[:, 0] / anchor[:, 0]), logit(y[:, 1]) - logit(anchor[:, 1])], axis=1)


def from_residual(r: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """``r`` ``(N, 2, Q)`` -> bytes and utilisation ratio ``(N, 2, Q)``."""
    mem = anchor[:, 0, None] * np.exp(r[:, 0])
    util = 1 / (1 + np.exp(-(logit(anchor[:, 1])[:, None] + r[:, 1])))
    return np.stack([mem, util], axis=1)


class JobScaleNet(nn.Module):
    """Features ``[N, F]`` (+ graphs) -> ordered residual quantiles ``[N, 2, Q]``."""

    mu: torch.Tensor  # buffers: the training features' mean and spread (standardise)
    sd: torch.Tensor

    def __init__(self, n_features: int, hidden: int = 32, graph_dim: int = 0) -> None:
        super().__init__()
        self.encoder = GraphEncoder(hidden=hidden, out_dim=graph_dim, layers=2) if graph_dim else None
        self.register_buffer("mu", torch.zeros(n_features))
        self.register_buffer("sd", torch.ones(n_features))
        self.mlp = nn.Sequential(nn.Linear(n_features + graph_dim, hidden), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, 2 * len(LEVELS)))
        self.linear = nn.Linear(n_features, 2)  # a linear path keeps extrapolation tame

    def forward(self, feats: torch.Tensor, graphs: Batch | None = None) -> torch.Tensor:
        f = standardise(feats, self.mu, self.sd)
        z = self.encoder(graphs) if self.encoder is not None and graphs is not None else f[:, :0]
        out = self.mlp(torch.cat([f, z], dim=1)).view(-1, 2, len(LEVELS))
        p50 = out[..., :1] + self.linear(f).unsqueeze(-1)
        return torch.cat([p50, p50 + torch.cumsum(nn.functional.softplus(out[..., 1:]), dim=-1)], dim=-1)


def model_inputs(ds: JobScaleDataset, idx: np.ndarray, variant: str) -> np.ndarray:
    """The network's feature rows of the jobs ``idx``: the first second, and for the graph variant its
    graph-derived features."""
    parts = [ds.obs[idx]]
    if variant == "graph":
        parts.append(ds.graph_rows[idx])
    return np.concatenate(parts, axis=1)


@torch.no_grad()
def residual_quantiles(net: JobScaleNet, ds: JobScaleDataset, idx: np.ndarray, variant: str) -> np.ndarray:
    """The network's residual quantiles ``(N, 2, Q)`` (see :func:`to_residual`)."""
    x = torch.tensor(model_inputs(ds, idx, variant), dtype=torch.float32)
    graphs = Batch.from_data_list([ds.graph_list[i] for i in idx]) if net.encoder is not None else None
    return net(x, graphs).numpy().astype(np.float64)


def predict_quantiles(net: JobScaleNet, ds: JobScaleDataset, idx: np.ndarray, variant: str,
                      shifts: np.ndarray | None = None) -> np.ndarray:
    """Quantiles ``(N, 2, Q)``: memory plateau (bytes), mean utilisation (0-1).

    ``shifts`` ``(2, Q)`` are added to the residual quantiles (see
    :func:`dprobe.profiling.jobscale.train.calibrate_upper`).
    """
    r = residual_quantiles(net, ds, idx, variant)
    if shifts is not None:
        r = np.maximum.accumulate(r + np.asarray(shifts)[None], axis=-1)
    return from_residual(r, anchors(ds, idx, variant))
