"""Workload conditioning: workloads.csv, the workload vectors, and the unknown-workload embedding."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dprobe.data.common import DatasetError
from dprobe.data.workloads import read_workloads, workload_dim, workload_vectors
from dprobe.forecaster.features import N_STATS
from dprobe.forecaster.network import PatchForecaster
from dprobe.forecaster.windows import SeriesDataModule


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
    assert batch.workload.shape == (len(batch.features), workload_dim()) and batch.known.dtype == torch.bool
    assert batch.known.any() and (~batch.known).any()
    assert torch.all(batch.workload[~batch.known] == 0)


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
    from dprobe.forecaster.base import ForecastInput
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.loading import open_forecaster, read_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.onnx_export import export_onnx
    from dprobe.forecaster.tasks import TaskSpec

    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1, use_graph=True)
    torch.manual_seed(1)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    spec = TaskSpec("gpu_demand", "helios-earth-vc", (6, 12, 24), 300.0, (), 1.0)
    pt = export_checkpoint(module, [spec], tmp_path / "m.pt", workloads_trained=True)
    onnx_path = export_onnx(read_checkpoint(pt), tmp_path / "m.onnx")
    batch = ForecastInput(values=np.random.default_rng(0).uniform(0, 50, (3, 40)), metric="gpu_demand",
                          leads=(6, 12, 24), step_seconds=300)
    torch_model, onnx_model = open_forecaster(str(pt)).forecaster, open_forecaster(str(onnx_path)).forecaster
    ref = torch_model.predict(batch).quantiles  # no graphs: every row is an unknown workload
    np.testing.assert_allclose(onnx_model.predict(batch).quantiles, ref, rtol=1e-4, atol=1e-4)

    from dataclasses import replace

    from dprobe.graph import build_model_graph

    graph = build_model_graph("torchvision:resnet18", batch=2, image=64)
    with_graphs = replace(batch, graphs=[graph, None, graph])  # what the sidecar passes for its targets
    got = torch_model.predict(with_graphs).quantiles
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6)  # no graph: unchanged
    assert not np.allclose(got[[0, 2]], ref[[0, 2]])  # a known graph conditions the forecast
    np.testing.assert_allclose(onnx_model.predict(with_graphs).quantiles, got, rtol=1e-4, atol=1e-4)

    # a model whose known-workload path never saw a known workload ignores graphs
    untrained = export_checkpoint(module, [spec], tmp_path / "u.pt", workloads_trained=False)
    for path in (untrained, export_onnx(read_checkpoint(untrained), tmp_path / "u.onnx")):
        np.testing.assert_allclose(open_forecaster(str(path)).forecaster.predict(with_graphs).quantiles, ref,
                                   rtol=1e-4, atol=1e-4)


def test_graph_vector_is_torch_free_and_reads_the_graph(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from dprobe.data.workloads import graph_vector
    from dprobe.graph import build_model_graph

    small = build_model_graph("torchvision:resnet18", batch=2, image=64)
    large = build_model_graph("torchvision:resnet18", batch=8, image=64)
    v_small, v_large = graph_vector(small), graph_vector(large)
    assert v_small.shape == (workload_dim(),) and np.isfinite(v_small).all()
    assert v_large[2] > v_small[2] and v_large[6] > v_small[6]  # more FLOPs, larger batch
    small.save(tmp_path / "g.json")
    code = ("import json, sys\n"
            "from dprobe.graph import load_model_graph\n"
            "from dprobe.data.workloads import graph_vector\n"
            f"v = graph_vector(load_model_graph({str(tmp_path / 'g.json')!r}))\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'v': v.tolist()}))\n")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out["torch"] is False
    np.testing.assert_allclose(out["v"], v_small, rtol=1e-6)


@pytest.mark.slow
def test_training_with_workloads_csv_conditions_the_checkpoint(tmp_path, small_helios_dir) -> None:
    """`+exp=gnn` on series with a workloads.csv: the checkpoint says its workload path was trained,
    and its forecasts for a series then depend on the graph given for it."""
    from dataclasses import replace

    from dprobe.config import compose
    from dprobe.forecaster.base import ForecastInput
    from dprobe.forecaster.loading import load_forecaster
    from dprobe.graph import build_model_graph
    from dprobe.training import run

    data = tmp_path / "helios"
    shutil.copytree(small_helios_dir, data)
    vcs = sorted(p.name.split(".")[0] for p in data.glob("vc*.csv.gz"))
    (data / "workloads.csv").write_text(f"series,model,batch,image\n{vcs[0]},torchvision:resnet18,4,64\n")
    out = tmp_path / "run"
    cfg = compose(["+exp=gnn", f"paths.output_dir={out}", f"data.datasets=[{data}]", "data.samples_per_epoch=256",
                   "data.val_samples=64", "data.batch_size=32", "model.d_model=16", "model.n_layers=1",
                   "trainer.max_epochs=1", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
                   "evaluate.enabled=false", "coldstart.enabled=false", "jobscale.enabled=false"])
    summary = run(cfg)
    ckpt = torch.load(summary["checkpoint"], weights_only=True)
    assert ckpt["workloads_trained"] is True and ckpt["hparams"]["use_graph"] is True
    assert any(out.joinpath("cache").glob("graph-*.json"))  # the graph was built once and cached
    model = load_forecaster(str(Path(summary["checkpoint"]).with_suffix(".onnx")))
    window = ForecastInput(values=np.linspace(10, 20, 50)[None, :], metric="gpu_demand", leads=(6,),
                           step_seconds=300)
    graph = build_model_graph("torchvision:resnet18", batch=4, image=64)
    assert not np.allclose(model.predict(replace(window, graphs=[graph])).quantiles,
                           model.predict(window).quantiles)


def test_evaluation_gives_each_listed_series_its_graph(tmp_path, small_helios_dir) -> None:
    """`dprobe evaluate` on a directory with workloads.csv: the model sees the graph of the series it
    lists and none for the others."""
    from dprobe.data import load_series_dataset
    from dprobe.data.workloads import workload_graphs
    from dprobe.evaluation import EvalConfig, evaluate_dataset
    from dprobe.forecaster.baselines import make_baseline

    data = tmp_path / "helios"
    shutil.copytree(small_helios_dir, data)
    vcs = sorted(p.name.split(".")[0] for p in data.glob("vc*.csv.gz"))
    (data / "workloads.csv").write_text(f"series,model,batch,image\n{vcs[0]},torchvision:resnet18,4,64\n")
    ds = load_series_dataset(data)
    seen: dict[int, set] = {}
    base = make_baseline("last_value")

    class Recording:
        name = "recording"

        def predict(self, batch):
            names = {getattr(g, "name", None) for g in (batch.graphs or [None])}
            seen.setdefault(len(seen), set()).update(names)
            return base.predict(batch)

    graphs = workload_graphs(data, cache_dir=tmp_path / "cache")
    assert set(graphs) == {vcs[0]}
    evaluate_dataset(ds, models={"recording": Recording()}, graphs=graphs,
                     cfg=EvalConfig(baselines=("last_value",), progress=False, batch_size=10_000))
    calls = list(seen.values())
    assert any(None not in c for c in calls) and any(c == {None} for c in calls)
