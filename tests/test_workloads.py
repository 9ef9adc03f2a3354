"""Workload conditioning: workloads.csv, the workload vectors, and the unknown-workload embedding."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from dprobe.data.common import DatasetError
from dprobe.data.windows import SeriesDataModule
from dprobe.data.workloads import read_workloads, workload_dim, workload_vectors
from dprobe.models.features import N_STATS
from dprobe.models.forecaster import PatchForecaster


def _net(d_cond: int = 5) -> PatchForecaster:
    torch.manual_seed(0)
    net = PatchForecaster(n_features=6, n_stats=N_STATS, context_length=32, n_tasks=1, n_leads=3, d_model=16,
                          n_heads=2, n_layers=1, d_cond=d_cond)
    for head in net.heads:
        torch.nn.init.normal_(head.proj.weight, std=0.5)
    torch.nn.init.normal_(net.unknown_workload)
    return net.eval()


def test_unknown_rows_use_the_learned_embedding_and_known_rows_their_vector() -> None:
    net = _net()
    x, s, task = torch.randn(4, 32, 6), torch.randn(4, N_STATS), torch.zeros(4, dtype=torch.long)
    cond = torch.randn(4, 5)
    none_known = torch.zeros(4, dtype=torch.bool)
    with torch.no_grad():
        unknown = net(x, s, task)
        torch.testing.assert_close(net(x, s, task, cond, none_known), unknown)  # flags honoured
        known = torch.tensor([True, False, True, False])
        mixed = net(x, s, task, cond, known)
        torch.testing.assert_close(mixed[~known], unknown[~known])
        assert not torch.allclose(mixed[known], unknown[known])  # a known workload changes the forecast
        other = net(x, s, task, cond.flip(0), known)
        assert not torch.allclose(other[known], mixed[known])  # ... and which workload matters


def test_workloads_csv_gives_vectors_to_the_series_it_names(tmp_path, small_helios_dir) -> None:
    data = tmp_path / "helios"
    shutil.copytree(small_helios_dir, data)
    vcs = sorted(p.name.split(".")[0] for p in data.glob("vc*.csv.gz"))
    (data / "workloads.csv").write_text(f"series,model,batch,image\n{vcs[0]},torchvision:resnet18,4,64\n")
    vectors, known = workload_vectors(data, [*vcs, "nobody"], tmp_path / "cache")
    assert known.tolist() == [True] + [False] * len(vcs)
    assert vectors.shape == (len(vcs) + 1, workload_dim()) and np.abs(vectors[0]).sum() > 0
    assert not vectors[1:].any()

    dm = SeriesDataModule([str(data)], context_length=32, batch_size=64, samples_per_epoch=256, val_samples=64,
                          workload_cache=str(tmp_path / "cache"))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["c"].shape == (len(batch["x"]), workload_dim()) and batch["k"].dtype == torch.bool
    assert batch["k"].any() and (~batch["k"]).any()
    assert torch.all(batch["c"][~batch["k"]] == 0)


@pytest.mark.parametrize("text, message", [
    ("series,batch\nvc1,4\n", "missing column"),
    ("series,model,batch\nvc1,torchvision:resnet18,0\n", "row 2: batch must be a positive integer"),
    ("series,model,batch\nvc1,torchvision:resnet18,4\nvc1,torchvision:resnet18,8\n", "listed twice"),
])
def test_bad_workloads_csv_is_refused_by_row(tmp_path, text, message) -> None:
    (tmp_path / "workloads.csv").write_text(text)
    with pytest.raises(DatasetError, match=message):
        read_workloads(tmp_path)


def test_unknown_model_in_workloads_csv_names_the_series(tmp_path) -> None:
    (tmp_path / "workloads.csv").write_text("series,model,batch\nvc1,torchvision:nope,4\n")
    with pytest.raises(DatasetError, match="series 'vc1'.*unknown torchvision model"):
        workload_vectors(tmp_path, ["vc1"])
    assert read_workloads(tmp_path / "absent") is None


def test_workload_conditioned_model_exports_to_onnx(tmp_path) -> None:
    from dprobe.forecasting.base import ForecastInput
    from dprobe.forecasting.loading import open_forecaster, read_checkpoint
    from dprobe.forecasting.model import export_checkpoint, export_onnx
    from dprobe.forecasting.tasks import TaskSpec
    from dprobe.models.lightning_module import ForecasterModule

    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1, use_graph=True)
    torch.manual_seed(1)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    spec = TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 1.0)
    pt = export_checkpoint(module, [spec], tmp_path / "m.pt")
    onnx_path = export_onnx(read_checkpoint(pt), tmp_path / "m.onnx")
    batch = ForecastInput(values=np.random.default_rng(0).uniform(0, 50, (3, 40)), metric="gpu_demand",
                          leads=(6, 12, 24), step_seconds=300)
    ref = open_forecaster(str(pt)).forecaster.predict(batch).quantiles  # online: the unknown workload
    np.testing.assert_allclose(open_forecaster(str(onnx_path)).forecaster.predict(batch).quantiles, ref,
                               rtol=1e-4, atol=1e-4)
