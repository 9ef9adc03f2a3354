"""Choosing the forecaster's epoch on left-out families (``val/select``) and regularising its workload token
(``model.token_dropout``), as ``+exp=gnn`` configures them."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from dprobe.forecaster.module import ForecasterModule
from dprobe.forecaster.network import PatchForecaster


def _net(token_dropout: float) -> PatchForecaster:
    torch.manual_seed(0)
    net = PatchForecaster(n_features=3, n_stats=4, context_length=32, n_tasks=1, n_leads=2, patch_len=8, stride=8,
                          d_model=16, n_heads=2, n_layers=1, dropout=0.0, d_cond=5, token_dropout=token_dropout)
    for p in net.parameters():  # the heads start at zero: give every layer weights that pass the token on
        torch.nn.init.normal_(p, std=0.3)
    return net


def test_token_dropout_drops_the_known_token_in_training_only() -> None:
    """In training, two passes over the same known windows differ (units of the token dropped) and the unknown
    windows' do not; in evaluation, and with token_dropout 0, every pass is the same."""
    x, stats, task = torch.randn(6, 32, 3), torch.randn(6, 4), torch.zeros(6, dtype=torch.long)
    cond, known = torch.randn(6, 5), torch.tensor([True, True, True, False, False, False])
    net = _net(0.5).train()
    a, b = net(x, stats, task, cond, known), net(x, stats, task, cond, known)
    assert not torch.allclose(a[:3], b[:3]) and torch.equal(a[3:], b[3:])
    net.eval()
    torch.testing.assert_close(net(x, stats, task, cond, known), net(x, stats, task, cond, known))
    plain = _net(0.0).train()
    torch.testing.assert_close(plain(x, stats, task, cond, known), plain(x, stats, task, cond, known))
    with pytest.raises(ValueError, match="token_dropout must be in"):
        ForecasterModule(n_tasks=1, token_dropout=1.0)
    with pytest.raises(ValueError, match="selection_job_share must be in"):
        ForecasterModule(n_tasks=1, selection_job_share=1.5)


@pytest.mark.slow
def test_gnn_keeps_the_epoch_best_on_the_left_out_families_and_the_series(tmp_path: Path, small_alibaba_dir: Path,
                                                                          small_jobs_dir: Path) -> None:
    """+exp=gnn over series and whole jobs, two epochs: every window of the validation families' runs is among
    those each epoch validates on (however few val_samples are), each epoch logs the parts of val/select,
    and the checkpoint kept is the epoch with the lowest val/select, a share of the families' part beside
    the series'."""
    from hydra.utils import instantiate

    from dprobe.config import compose
    from dprobe.training import run

    cfg = compose(["+exp=gnn", f"paths.output_dir={tmp_path}", f"data.datasets=[{small_alibaba_dir},{small_jobs_dir}]",
                   "data.samples_per_epoch=256", "data.val_samples=600", "data.batch_size=64", "model.d_model=16",
                   "model.n_layers=1", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
                   "trainer.max_epochs=2", "evaluate.enabled=false", "coldstart.enabled=false",
                   "jobscale.enabled=false", "kernel_gnn.enabled=false"])
    assert cfg.callbacks.model_checkpoint.monitor == cfg.callbacks.early_stopping.monitor == "val/select"
    assert cfg.model.token_dropout == 0 and cfg.model.selection_job_share == cfg.data.job_share
    summary = run(cfg)
    dm = instantiate(cfg.data, _convert_="all")
    dm.setup("fit")
    jobs = [k for k, j in enumerate(dm.job_tasks) if j]
    family_rows = {tuple(r) for r in dm.calibration_rows.tolist() if r[0] in jobs}
    val_rows = {tuple(r) for r in dm._set_up(dm._val_rows).tolist()}
    assert 0 < len(family_rows) <= cfg.data.val_samples // 2 < len(dm.calibration_rows) - len(family_rows)
    assert family_rows <= val_rows and len(val_rows) == cfg.data.val_samples
    [metrics] = list(tmp_path.glob("logs/**/metrics.csv"))
    epochs = [r for r in csv.DictReader(metrics.open()) if r.get("val/select")]
    assert len(epochs) == 2
    share = cfg.model.selection_job_share
    for r in epochs:
        parts = {k: float(r[f"val/{k}_pinball"]) for k in ("jobs", "jobs_unknown", "series")}
        assert float(r["val/select"]) == pytest.approx(share * parts["jobs"] + (1 - share) * parts["series"],
                                                       rel=1e-5)
    best = min(float(r["val/select"]) for r in epochs)
    assert summary["val_pinball"] == pytest.approx(best, rel=1e-6)
    kept = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    chosen = next(c for k, c in kept["callbacks"].items() if "ModelCheckpoint" in k)
    assert chosen["monitor"] == "val/select" and float(chosen["best_model_score"]) == pytest.approx(best, rel=1e-6)
