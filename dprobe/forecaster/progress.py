"""Progress lines for a fit whose output is not a terminal (a log file, CI, a batch job): the progress bar
draws nothing useful there, so this callback logs a line at least every ``every_seconds`` and one per epoch
with its metrics."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import pytorch_lightning as pl

log = logging.getLogger("dprobe.training")


class EpochProgress(pl.Callback):
    """Log the fit's progress: a line per epoch (its logged metrics, seconds taken), and within an epoch a
    line once ``every_seconds`` have passed since the last. ``only_without_tty``: stay quiet when stderr is
    a terminal (the progress bar shows it there)."""

    def __init__(self, every_seconds: float = 60.0, only_without_tty: bool = True) -> None:
        if not every_seconds > 0:
            raise ValueError(f"every_seconds must be positive, got {every_seconds}")
        self.every_seconds = float(every_seconds)
        self.only_without_tty = only_without_tty
        self._epoch_start = self._last = 0.0

    def _active(self, trainer: pl.Trainer) -> bool:
        tty = getattr(sys.stderr, "isatty", lambda: False)()
        return trainer.is_global_zero and not (self.only_without_tty and tty)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = self._last = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.monotonic()
        if not self._active(trainer) or now - self._last < self.every_seconds:
            return
        self._last = now
        total = trainer.num_training_batches
        of = f"/{total}" if isinstance(total, int) else ""
        log.info("epoch %d: batch %d%s, %.0f s into the epoch", trainer.current_epoch, batch_idx + 1, of,
                 now - self._epoch_start)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active(trainer):
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        last = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "?"
        log.info("epoch %d/%s done in %.0f s%s", trainer.current_epoch + 1, last,
                 time.monotonic() - self._epoch_start, f": {shown}" if shown else "")
        self._last = time.monotonic()
