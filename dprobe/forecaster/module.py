"""LightningModule around :class:`PatchForecaster`: pinball loss over p50 / p90 / p99, per-task metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from dprobe.core.metrics import pinball_terms
from dprobe.forecaster.base import QUANTILES
from dprobe.forecaster.network import build_network

if TYPE_CHECKING:
    from dprobe.forecaster.windows import WindowBatch

# the parts of the validation windows scored apart (ForecasterModule.on_validation_epoch_end)
VAL_PARTS = ("jobs", "jobs_unknown", "series")


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
                 graph_encoder: str | None = None, token_dropout: float = 0.0, selection_job_share: float = 0.2,
                 optimizer: Callable[..., Optimizer] | None = None,
                 scheduler: Callable[..., LRScheduler] | None = None) -> None:
        """``optimizer``: called with the parameters, ``scheduler`` with the optimizer and ``T_max`` (partials
        from ``conf/model/forecaster.yaml``; not needed to load a checkpoint, and not in its hyperparameters).
        ``workload_token``: what a known workload is given (:data:`dprobe.data.workloads.TOKENS`), with
        ``use_graph``; ``graph_encoder``: the pretrained graph encoder of a token with an embedding (None:
        the shipped one), recorded in the checkpoint. ``token_dropout``: dropout on the projected workload token in
        training (:class:`~dprobe.forecaster.network.PatchForecaster`). ``selection_job_share``: the share
        ``val/select`` gives the validation windows with a known workload (the left-out families' runs), the rest
        going to the series' validation span (:meth:`on_validation_epoch_end`)."""
        super().__init__()
        from dprobe.data.workloads import check_token

        check_token(workload_token)
        if not 0 <= token_dropout < 1:
            raise ValueError(f"token_dropout must be in [0, 1) (dropout on the workload token in training), "
                             f"got {token_dropout!r}")
        if not 0 <= selection_job_share <= 1:
            raise ValueError(f"selection_job_share must be in [0, 1] (the share of val/select given to the "
                             f"left-out families' windows), got {selection_job_share!r}")
        if use_graph and not d_graph:  # the checkpoint records the workload token's length
            from dprobe.data.workloads import token_dim

            d_graph = token_dim(workload_token, graph_encoder)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.make_optimizer = optimizer
        self.make_scheduler = scheduler
        self.net = build_network(n_tasks, n_leads, context_length, patch_len, stride, d_model, n_heads, n_layers,
                                 dropout, quantiles, use_graph, d_graph, token_dropout=token_dropout)
        self.register_buffer("levels", torch.tensor(quantiles, dtype=torch.float32), persistent=False)
        self.val_mae = torchmetrics.MeanMetric()
        # validation pinball of the windows whose workload is known (the left-out families' runs), with their
        # token and with the unknown one, and of the others (the series' validation span)
        self.val_parts = nn.ModuleDict({k: torchmetrics.MeanMetric() for k in VAL_PARTS})

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
        # the parts in the training loss's units (each task's windows weighed by its task weight), so that a task
        # whose windows move less counts as much as in training
        jobs = batch.known.bool()
        for part, rows in (("jobs", jobs), ("series", ~jobs)):
            n = (~torch.isnan(batch.target[rows]) * batch.weight[rows, None]).sum()
            if n > 0:
                self._part(part).update(pinball_loss(pred[rows], batch.target[rows], self.levels,
                                                     batch.weight[rows]), n)
        if jobs.any() and self.net.cond_proj is not None:  # the same windows told nothing of their workload
            blind = self(batch.features[jobs], batch.stats[jobs], batch.task[jobs], batch.workload[jobs],
                         torch.zeros_like(batch.known[jobs]))
            n = (~torch.isnan(batch.target[jobs]) * batch.weight[jobs, None]).sum()
            self._part("jobs_unknown").update(pinball_loss(blind, batch.target[jobs], self.levels,
                                                           batch.weight[jobs]), n)

    def _part(self, name: str) -> torchmetrics.MeanMetric:
        """The running mean of one part of the validation windows (:data:`VAL_PARTS`)."""
        return cast(torchmetrics.MeanMetric, self.val_parts[name])

    def on_validation_epoch_end(self) -> None:
        """Log ``val/mae_p50``, each part's pinball (``val/jobs_pinball``: the validation families' runs given
        their token; ``val/jobs_unknown_pinball``: the same told nothing; ``val/series_pinball``: the series'
        validation span) and ``val/select``, what the checkpoint is chosen and training stopped on
        (``conf/exp/gnn.yaml``): the parts' pinball, each task's windows weighed as in the training loss (its
        task weight), ``selection_job_share`` to the families' runs and the rest to the series, so that a
        token fitting the training families is noticed (either part alone where only it validated)."""
        self.log("val/mae_p50", self.val_mae.compute(), sync_dist=True)
        self.val_mae.reset()
        parts: dict[str, Tensor] = {}
        for part in VAL_PARTS:
            metric = self._part(part)
            if metric.update_count:
                parts[part] = metric.compute()
                self.log(f"val/{part}_pinball", parts[part], sync_dist=True)
            metric.reset()
        share = float(self.hparams["selection_job_share"])
        select: Tensor | None = parts.get("jobs", parts.get("series"))
        if "jobs" in parts and "series" in parts:
            select = share * parts["jobs"] + (1 - share) * parts["series"]
        if select is not None:
            self.log("val/select", select, prog_bar=True, sync_dist=True)

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
