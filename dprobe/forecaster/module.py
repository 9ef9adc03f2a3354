"""LightningModule around :class:`PatchForecaster`: pinball loss over p50 / p90 / p99, per-task metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from dprobe.core.metrics import pinball_terms
from dprobe.forecaster.base import QUANTILES
from dprobe.forecaster.network import build_network

if TYPE_CHECKING:
    from dprobe.forecaster.windows import WindowBatch


def pinball_loss(pred: Tensor, target: Tensor, levels: Tensor, weight: Tensor | None = None) -> Tensor:
    """Mean pinball loss; pred ``[B, H, Q]``, target ``[B, H]`` with NaN where unknown (ignored).

    ``weight`` ``[B]`` rescales rows (tasks whose errors are larger in window units count less).
    """
    mask = ~torch.isnan(target)
    if weight is not None:
        mask = mask * weight.unsqueeze(-1)
    diff = torch.nan_to_num(target).unsqueeze(-1) - pred  # [B, H, Q]
    loss = pinball_terms(diff, levels)
    loss = loss * mask.unsqueeze(-1)
    return loss.sum() / (mask.sum() * len(levels)).clamp(min=1)


class ForecasterModule(pl.LightningModule):
    """Trains one global forecaster over every task (metric of a data set) in the data module."""

    levels: Tensor  # the quantile levels (a buffer, not saved)

    def __init__(self, n_tasks: int, n_leads: int = 3, context_length: int = 128, patch_len: int = 16,
                 stride: int = 8, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, dropout: float = 0.1,
                 lr: float = 1e-3, weight_decay: float = 1e-4, quantiles: tuple[float, ...] = QUANTILES,
                 use_graph: bool = False, d_graph: int = 0, workload_token: str = "vector",
                 graph_encoder: str | None = None, optimizer: Callable[..., Optimizer] | None = None,
                 scheduler: Callable[..., LRScheduler] | None = None) -> None:
        """``optimizer``: called with the parameters, ``scheduler`` with the optimizer and ``T_max`` (partials
        from ``conf/model/forecaster.yaml``; not needed to load a checkpoint, and not in its hyperparameters).
        ``workload_token``: what a known workload is given (:data:`dprobe.data.workloads.TOKENS`), with
        ``use_graph``; ``graph_encoder``: the pretrained graph encoder of a token with an embedding (None:
        the shipped one), recorded in the checkpoint."""
        super().__init__()
        from dprobe.data.workloads import check_token

        check_token(workload_token)
        if use_graph and not d_graph:  # the checkpoint records the workload token's length
            from dprobe.data.workloads import token_dim

            d_graph = token_dim(workload_token, graph_encoder)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.make_optimizer = optimizer
        self.make_scheduler = scheduler
        self.net = build_network(n_tasks, n_leads, context_length, patch_len, stride, d_model, n_heads, n_layers,
                                 dropout, quantiles, use_graph, d_graph)
        self.register_buffer("levels", torch.tensor(quantiles, dtype=torch.float32), persistent=False)
        self.val_mae = torchmetrics.MeanMetric()

    def forward(self, x: Tensor, stats: Tensor, task: Tensor, cond: Tensor | None = None,
                known: Tensor | None = None) -> Tensor:
        return self.net(x, stats, task, cond, known)

    def training_step(self, batch: WindowBatch, batch_idx: int) -> Tensor:
        pred = self(batch.features, batch.stats, batch.task, batch.workload, batch.known)
        loss = pinball_loss(pred, batch.target, self.levels, batch.weight)
        self.log("train/pinball", loss, prog_bar=True, batch_size=len(batch.features))
        return loss

    def validation_step(self, batch: WindowBatch, batch_idx: int) -> None:
        pred = self(batch.features, batch.stats, batch.task, batch.workload, batch.known)
        loss = pinball_loss(pred, batch.target, self.levels)
        mask = ~torch.isnan(batch.target)
        err = (pred[..., 0] - torch.nan_to_num(batch.target)).abs()[mask]
        self.val_mae.update(err)
        self.log("val/pinball", loss, prog_bar=True, batch_size=len(batch.features), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self.log("val/mae_p50", self.val_mae.compute(), sync_dist=True)
        self.val_mae.reset()

    def configure_optimizers(self):
        if self.make_optimizer is None:
            raise ValueError("ForecasterModule needs an optimizer to train: optimizer=partial(torch.optim.AdamW, ...) "
                             "(model.optimizer in conf/model/forecaster.yaml)")
        opt = self.make_optimizer(self.parameters())
        if (self.make_scheduler is None or self.trainer is None or not self.trainer.max_epochs
                or self.trainer.max_epochs < 0):
            return opt
        sched = self.make_scheduler(opt, T_max=max(1, self.trainer.max_epochs))
        return {"optimizer": opt, "lr_scheduler": sched}
