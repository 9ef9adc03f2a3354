"""The DProbe forecaster network: a patch transformer over the recent metric window.

Per sample: a window of one metric (``(L, F)`` features from
:mod:`dprobe.forecaster.features`), the task (which metric / data set) and, with
``use_graph``, the workload: its token where the series' model is known (a
hand-made summary of its model graph, after the pooled output of a pretrained
GNN over the graph with ``workload_token: graph``: :mod:`dprobe.data.workloads`),
a learned "unknown workload" embedding where not. The window is
cut into overlapping patches, embedded, and read by a transformer encoder
together with a conditioning token; each task has its own quantile head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class QuantileHead(nn.Module):
    """Linear head giving ordered quantiles: q0, then q0 + cumulative softplus increments."""

    def __init__(self, d_in: int, n_stats: int, n_leads: int, n_quantiles: int) -> None:
        super().__init__()
        self.n_leads, self.n_quantiles = n_leads, n_quantiles
        self.proj = nn.Linear(d_in, n_leads * n_quantiles)
        self.skip = nn.Linear(n_stats, n_leads * n_quantiles)  # linear path from the window's statistics
        for layer in (self.proj, self.skip):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, h: Tensor, stats: Tensor) -> Tensor:  # h: [B, d_in], stats: [B, S] -> [B, H, Q]
        raw = (self.proj(h) + self.skip(stats)).view(-1, self.n_leads, self.n_quantiles)
        base = raw[..., :1]
        steps = F.softplus(raw[..., 1:])
        return torch.cat([base, base + torch.cumsum(steps, dim=-1)], dim=-1)


class PatchForecaster(nn.Module):
    """Window ``[B, L, F]`` + stats ``[B, S]`` + task id ``[B]`` + condition ``[B, d_cond]`` -> quantiles."""

    def __init__(self, n_features: int, n_stats: int, context_length: int, n_tasks: int, n_leads: int, n_quantiles: int = 3,
                 patch_len: int = 16, stride: int = 8, d_model: int = 64, n_heads: int = 4,
                 n_layers: int = 2, dropout: float = 0.1, d_cond: int = 0, token_dropout: float = 0.0) -> None:
        """``token_dropout``: dropout on the projected workload token of known workloads, in training only (so
        that the forecast never leans on the token more than it carries over to workloads not trained on)."""
        super().__init__()
        self.token_dropout = token_dropout
        self.patch_len, self.stride = patch_len, stride
        n_patches = (context_length - patch_len) // stride + 1
        self.patch_embed = nn.Linear(patch_len * n_features, d_model)
        self.pos = nn.Parameter(torch.zeros(1, n_patches + 1, d_model))
        self.task_embed = nn.Embedding(n_tasks, d_model)
        self.stats_proj = nn.Linear(n_stats, d_model)
        # the workload: its vector where known, a learned "unknown workload" embedding where not
        self.cond_proj = nn.Sequential(nn.LayerNorm(d_cond), nn.Linear(d_cond, d_model)) if d_cond else None
        self.unknown_workload = nn.Parameter(torch.zeros(d_model)) if d_cond else None
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=2 * d_model, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.heads = nn.ModuleList([QuantileHead(2 * d_model, n_stats, n_leads, n_quantiles) for _ in range(n_tasks)])

    def workload_token(self, b: int, cond: Tensor | None, known: Tensor | None) -> Tensor:
        """``[B, d]``: the projected workload vector where ``known``, else the unknown-workload embedding."""
        if self.unknown_workload is None or self.cond_proj is None:
            raise ValueError("this network takes no workload (built with d_cond=0): it has no workload token")
        unknown = self.unknown_workload.expand(b, -1)
        if cond is None:
            return unknown
        if known is None:
            known = torch.ones(b, device=cond.device)
        token = F.dropout(self.cond_proj(cond), self.token_dropout, self.training)
        return torch.where(known.unsqueeze(-1) > 0.5, token, unknown)  # known: bool or 0 / 1

    def forward(self, x: Tensor, stats: Tensor, task: Tensor, cond: Tensor | None = None,
                known: Tensor | None = None) -> Tensor:
        """x: [B, L, F], stats: [B, S], task: [B] (long), cond: [B, d_cond], known: [B] (bool)
        -> each row's quantiles [B, H, Q]. Without ``cond`` every row is an unknown workload."""
        b = x.shape[0]
        patches = x.unfold(1, self.patch_len, self.stride)  # [B, P, F, patch_len]
        tokens = self.patch_embed(patches.flatten(2))  # [B, P, d]
        first = self.task_embed(task) + self.stats_proj(stats)  # [B, d]: the conditioning token
        if self.cond_proj is not None:
            first = first + self.workload_token(b, cond, known)
        h = torch.cat([first.unsqueeze(1), tokens], dim=1) + self.pos
        h = self.norm(self.encoder(h))  # [B, 1 + P, d]
        pooled = torch.cat([h[:, 0], h[:, 1:].mean(dim=1)], dim=-1)  # [B, 2d]
        every = torch.stack([head(pooled, stats) for head in self.heads])  # [T, B, H, Q]
        return every[task, torch.arange(b, device=x.device)]


def build_network(n_tasks: int, n_leads: int = 3, context_length: int = 128, patch_len: int = 16, stride: int = 8,
                  d_model: int = 64, n_heads: int = 4, n_layers: int = 2, dropout: float = 0.1,
                  quantiles: tuple[float, ...] = (0.5, 0.9, 0.99), use_graph: bool = False, d_graph: int = 0,
                  token_dropout: float = 0.0, **_training_only: object) -> PatchForecaster:
    """The network of a ``ForecasterModule`` from its hyperparameters (training-only ones are ignored; the
    workload token's length is ``d_graph``, the vector's when not given)."""
    from dprobe.data.workloads import workload_dim
    from dprobe.forecaster.features import N_COVARIATES, N_STATS

    return PatchForecaster(n_features=2 + N_COVARIATES, n_stats=N_STATS, context_length=context_length,
                           n_tasks=n_tasks, n_leads=n_leads, n_quantiles=len(quantiles), patch_len=patch_len,
                           stride=stride, d_model=d_model, n_heads=n_heads, n_layers=n_layers, dropout=dropout,
                           d_cond=(d_graph or workload_dim()) if use_graph else 0, token_dropout=token_dropout)
