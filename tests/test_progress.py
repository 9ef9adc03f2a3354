"""Progress lines of a fit whose output is not a terminal (dprobe.forecaster.progress)."""

from __future__ import annotations

import logging

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from dprobe.forecaster.progress import EpochProgress


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/pinball", torch.nn.functional.l1_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g)), batch_size=8)


def fit(callback: EpochProgress, epochs: int = 2) -> None:
    trainer = pl.Trainer(max_epochs=epochs, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Tiny(), train_dataloaders=loader(), val_dataloaders=loader())


def test_a_fit_without_a_terminal_logs_each_epoch_with_its_metrics(caplog):
    with caplog.at_level(logging.INFO, logger="dprobe.training"):
        fit(EpochProgress(every_seconds=1e-9))
    lines = [r.getMessage() for r in caplog.records if r.name == "dprobe.training"]
    done = [line for line in lines if " done in " in line]
    assert [line.split(" done")[0] for line in done] == ["epoch 1/2", "epoch 2/2"]
    assert all("train/loss" in line and "val/pinball" in line for line in done)
    assert any(line.startswith("epoch 0: batch 4/4") for line in lines)  # within the epoch, at every_seconds


def test_on_a_terminal_it_leaves_the_progress_bar_alone(caplog, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    with caplog.at_level(logging.INFO, logger="dprobe.training"):
        fit(EpochProgress(every_seconds=1e-9), epochs=1)
    assert not [r for r in caplog.records if r.name == "dprobe.training"]


def test_a_period_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="every_seconds"):
        EpochProgress(every_seconds=0)
