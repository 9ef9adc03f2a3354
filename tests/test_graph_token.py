"""The forecaster's graph token: the pretrained GNN's pooled output over a workload's model graph, then the
hand-made vector; trained by +exp=gnn, exported to ONNX with its encoder recorded, and served by the sidecar,
whose child process embeds each pod's graph (cached by graph hash) while the unknown token stands in."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dprobe.data.workloads import TOKENS, graph_vector, token_dim, token_vector, workload_dim
from dprobe.forecaster.base import ForecastInput
from dprobe.graph.embed import WorkloadEmbedder
from dprobe.graph.encoder import GraphEncoder, graph_to_data, rewire_edges
from dprobe.graph.identity import DEFAULT_ENCODER, graph_hash
from dprobe.graph.schema import GraphNode, ModelGraph
from dprobe.services.sidecar.annotations import MODEL_GRAPH
from dprobe.services.sidecar.graphs import GraphRequest, GraphResolver, GraphSummary, summarise
from dprobe.services.sources import Sample


def _graph(n: int = 30, name: str = "toy", chain: bool = True) -> ModelGraph:
    kinds = ["conv", "norm", "act", "matmul", "pool"]
    nodes = [GraphNode(id=i, name=f"n{i}", kind=kinds[(i * 7) % 5], op=f"aten.op{i % 5}",
                       shapes=[[2, 8 + i % 4, 4 + i % 3]], dtypes=["float32"], params=10 * i, param_bytes=40 * i,
                       flops=1e6 * (i + 1), saved_bytes=8 * i) for i in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)] if chain else [(0, i) for i in range(1, n)]
    return ModelGraph(name=name, source="test", nodes=nodes, edges=edges, inputs={"batch": 2})


def test_the_encoder_takes_a_batch_and_pools_explicitly() -> None:
    """A PyG Batch in, one row per graph out; without message passing only the nodes count, so two graphs of
    the same nodes and other edges differ with it and not without; rewiring keeps nodes, edge count and
    edge features."""
    from torch_geometric.data import Batch

    torch.manual_seed(0)
    enc = GraphEncoder(hidden=16, out_dim=8, layers=2, conv="gatv2", heads=2).eval()
    a, b = graph_to_data(_graph(chain=True)), graph_to_data(_graph(chain=False))
    batch = Batch.from_data_list([a, b])
    with torch.no_grad():
        on, off = enc(batch), enc(batch, message_passing=False)
    assert on.shape == off.shape == (2, 8)
    assert not torch.allclose(on[0], on[1]) and torch.allclose(off[0], off[1])
    shuffled = rewire_edges(a, seed=3)
    assert shuffled.edge_index.shape == a.edge_index.shape and torch.equal(shuffled.edge_attr, a.edge_attr)
    assert torch.equal(shuffled.x, a.x) and not torch.equal(shuffled.edge_index, a.edge_index)
    assert torch.equal(rewire_edges(a, seed=3).edge_index, shuffled.edge_index)  # seeded


def test_embeddings_are_cached_by_graph_hash_on_disk_and_in_memory(tmp_path: Path, monkeypatch) -> None:
    g = _graph()
    renamed = replace(g, name="another name")
    assert graph_hash(g) == graph_hash(renamed) != graph_hash(_graph(chain=False))
    emb = WorkloadEmbedder(cache_dir=tmp_path)
    z = emb.embed(g)
    assert z.shape == (emb.dim,) and len(list(tmp_path.glob("embedding-graph-*.npy"))) == 1
    fresh = WorkloadEmbedder(cache_dir=tmp_path)
    monkeypatch.setattr(fresh.encoder, "embed_data", lambda *a, **k: pytest.fail("embedded again"))
    np.testing.assert_array_equal(fresh.embed(renamed), z)  # the same graph under another name: read back
    modes = {m: WorkloadEmbedder(mode=m).embed(g) for m in ("graph", "no_message_passing", "shuffled_edges")}
    assert not np.allclose(modes["graph"], modes["no_message_passing"])
    assert not np.allclose(modes["graph"], modes["shuffled_edges"])
    with pytest.raises(ValueError, match="embedding mode must be one of"):
        WorkloadEmbedder(mode="bogus")


def test_more_graphs_than_the_memory_cache_holds_are_embedded_at_once() -> None:
    """``embed_many`` of more graphs than ``max_cached`` (no cache directory): every row comes back, as
    each graph alone embeds, though the cache keeps the last one only."""
    graphs = [_graph(), _graph(chain=False)]
    emb = WorkloadEmbedder(max_cached=1)
    z = emb.embed_many(graphs)
    assert z.shape == (2, emb.dim) and z.dtype == np.float32 and len(emb._cache) == 1
    alone = np.stack([emb.embed(g) for g in graphs])  # one at a time (the cache holds one)
    np.testing.assert_allclose(z, alone, atol=1e-5)  # batched: float32 rounding apart
    # one cached, one not, one twice
    np.testing.assert_allclose(emb.embed_many([graphs[1], graphs[0], graphs[1]]), z[[1, 0, 1]], atol=1e-5)


def test_the_graph_token_is_the_embedding_then_the_vector() -> None:
    g = _graph()
    emb = WorkloadEmbedder()
    assert token_dim("vector") == workload_dim() and token_dim("graph") == workload_dim() + emb.dim
    np.testing.assert_array_equal(token_vector(g, "vector"), graph_vector(g))
    tok = token_vector(g, "graph", emb)
    np.testing.assert_allclose(tok, np.concatenate([emb.embed(g), graph_vector(g)]))
    summary = GraphSummary.of(g, embedding=emb.embed(g))  # what the sidecar's child sends back
    np.testing.assert_allclose(token_vector(summary, "graph"), tok, rtol=1e-6)
    assert token_vector(GraphSummary.of(g), "graph") is None  # no embedding (yet): unknown
    assert set(TOKENS) == {"vector", "graph", "graph_no_mp", "graph_shuffled"}
    with pytest.raises(ValueError, match="workload_token must be one of"):
        token_dim("bogus")


def _graph_model(tmp_path: Path, trained: bool = True):
    """A small forecaster with the graph token, its dprobe.pt and dprobe.onnx."""
    from dprobe.forecaster.checkpoint import export_checkpoint
    from dprobe.forecaster.loading import read_checkpoint
    from dprobe.forecaster.module import ForecasterModule
    from dprobe.forecaster.onnx_export import export_onnx
    from dprobe.forecaster.tasks import TaskSpec

    module = ForecasterModule(n_tasks=1, context_length=32, d_model=16, n_heads=2, n_layers=1, use_graph=True,
                              workload_token="graph")
    torch.manual_seed(1)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    spec = TaskSpec("gpu_memory_bytes", "alibaba-genai-2026", (5, 15, 30), 57.0, (), 1e9)
    pt = export_checkpoint(module, [spec], tmp_path / "m.pt", workloads_trained=trained)
    return pt, export_onnx(read_checkpoint(pt), tmp_path / "m.onnx")


@pytest.mark.slow
def test_the_graph_token_survives_export_and_loads_with_weights_only(tmp_path: Path) -> None:
    """dprobe.pt loads with weights_only=True and records the encoder; the ONNX export carries the same
    metadata; given a graph (whole, or as the sidecar's summary with its embedding) both forecast alike,
    and without one they use the unknown token."""
    import onnxruntime as ort

    from dprobe.forecaster.loading import open_forecaster

    pt, onnx_path = _graph_model(tmp_path)
    ckpt = torch.load(pt, weights_only=True)
    assert ckpt["hparams"]["workload_token"] == "graph" and ckpt["hparams"]["d_graph"] == token_dim("graph")
    assert ckpt["graph_encoder"]["path"] == DEFAULT_ENCODER and ckpt["graph_encoder"]["mode"] == "graph"
    meta = json.loads(ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
                      .get_modelmeta().custom_metadata_map["dprobe"])
    assert meta["workloads_trained"] is True and meta["graph_encoder"] == ckpt["graph_encoder"]
    torch_model, onnx_model = open_forecaster(str(pt)).forecaster, open_forecaster(str(onnx_path)).forecaster
    batch = ForecastInput(values=np.random.default_rng(0).uniform(1e9, 4e9, (3, 40)), metric="gpu_memory_bytes",
                          leads=(5, 15), step_seconds=57.0)
    g = _graph()
    summary = GraphSummary.of(g, embedding=WorkloadEmbedder().embed(g))
    ref = torch_model.predict(batch).quantiles
    got = torch_model.predict(replace(batch, graphs=[g, None, g])).quantiles
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6)
    assert not np.allclose(got[[0, 2]], ref[[0, 2]])
    served = onnx_model.predict(replace(batch, graphs=[summary, None, GraphSummary.of(g)])).quantiles
    np.testing.assert_allclose(served[:2], got[:2], rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(served[2], ref[2], rtol=1e-4, atol=1e-2)  # no embedding yet: unknown
    assert [onnx_model.token_of(x) for x in (summary, None, GraphSummary.of(g))] == ["graph", "unknown", "unknown"]
    assert torch_model.token_of(g) == "graph"


def test_a_checkpoint_whose_encoder_changed_is_refused(tmp_path: Path) -> None:
    from dprobe.forecaster.loading import read_checkpoint
    from dprobe.forecaster.runtime import OnnxForecaster

    pt, onnx_path = _graph_model(tmp_path)
    obj = read_checkpoint(pt)
    other = tmp_path / "other_encoder.pt"
    other.write_bytes(b"not the encoder")
    obj["graph_encoder"] = {**obj["graph_encoder"], "path": str(other)}
    from dprobe.forecaster.checkpoint import ModelForecaster

    with pytest.raises(ValueError, match="not the one it was trained with"):
        ModelForecaster(obj)
    assert OnnxForecaster(onnx_path).embeds_graphs


def test_the_child_embeds_a_graph_unless_its_hash_is_cached(tmp_path: Path) -> None:
    g = _graph()
    g.save(tmp_path / "g.json")
    enc = {"path": DEFAULT_ENCODER, "mode": "graph"}
    out = summarise({"path": str(tmp_path / "g.json")}, max_bytes=2**24, encoder=enc)
    np.testing.assert_allclose(out["embedding"], WorkloadEmbedder().embed(g), rtol=1e-5)
    assert out["graph_hash"] == graph_hash(g)
    again = summarise({"path": str(tmp_path / "g.json")}, max_bytes=2**24, encoder=enc, cached=[graph_hash(g)])
    assert again["embedding"] is None
    assert summarise({"path": str(tmp_path / "g.json")}, max_bytes=2**24)["embedding"] is None  # no encoder


def test_the_resolver_caches_embeddings_by_graph_hash() -> None:
    """Two requests whose graphs are the same share one embedding: the second child is told it is cached,
    brings none, and the summary gets the cached one."""
    g = _graph()
    z = WorkloadEmbedder().embed(g)
    asked: list[list[str]] = []

    class Runner:  # stands in for the child: answers as summarise does
        peak_rss_bytes = 0
        stopping = False

        def run(self, task: str, args: dict) -> dict:
            asked.append(list(args["cached"]))
            return GraphSummary.of(g, None if graph_hash(g) in args["cached"] else z).to_dict()

    r = GraphResolver({"a/*": "torchvision:resnet18 batch=2", "b/*": "timm:resnet18 batch=2"}, runner=Runner(),
                      encoder={"path": DEFAULT_ENCODER, "mode": "graph"})
    assert r.graph("a/x") is None and r.graph("b/y") is None
    r.run_pending()
    assert asked == [[], [graph_hash(g)]] and r.embeddings_total == 1
    for target in ("a/x", "b/y"):
        np.testing.assert_allclose(r.graph(target).embedding, z, rtol=1e-6)
    assert GraphRequest.of("torchvision:resnet18 batch=2") != GraphRequest.of("timm:resnet18 batch=2")


@pytest.mark.slow
def test_the_sidecar_uses_the_graph_token_where_annotated_and_the_unknown_one_elsewhere(
        annotate, tmp_path: Path, scrape) -> None:
    """A pod whose annotation names a graph: its forecasts use its embedding once the child has made it, and
    /metrics says token="graph"; a target without a graph says token="unknown"."""
    from dprobe.forecaster.loading import LoadedModel, open_forecaster
    from dprobe.services.sidecar.config import SidecarConfig
    from dprobe.services.sidecar.service import Sidecar

    _, onnx_path = _graph_model(tmp_path)
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    _graph().save(graphs / "net.json")
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "net.json"})

    class Two:
        name = "two"

        def poll(self) -> list[Sample]:
            now = time.time()
            return [Sample("ml/a", now, 2e9, 0.5, {"namespace": "ml", "pod": "a"}),
                    Sample("ml/b", now, 3e9, 0.5, {"namespace": "ml", "pod": "b"})]

        def close(self) -> None:
            pass

    config = SidecarConfig(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.1,
                           step_seconds=57.0, window_seconds=57.0 * 40, horizons=[60], stale_after=120.0,
                           max_backoff=0.2, min_points=1, annotations_file=str(ann), graph_dir=str(graphs),
                           graphs={"ml/b": ""}, job_timeout=600, job_cpu_limit=600)
    model = open_forecaster(str(onnx_path))
    sc = Sidecar(config, sources=[Two()], model=LoadedModel(model.forecaster, model.kind, model.version, ""))
    assert sc.reads_graphs and sc.graphs.encoder["mode"] == "graph"
    sc.start()
    try:
        deadline = time.time() + 600  # the child imports torch and PyG: seconds, minutes on a busy machine
        while True:
            snap = sc.engine.snapshot
            if snap is not None and dict(zip(snap.targets, snap.tokens, strict=True)).get("ml/a") == "graph":
                break
            assert time.time() < deadline, "the annotated pod's graph was never embedded"
            time.sleep(0.1)
        got = {s.labels["target"]: s.labels["token"] for s in scrape(sc.server.url)
               if s.name == "dprobe_forecast_workload_info"}
        assert got == {"ml/a": "graph", "ml/b": "unknown"}
        assert sc.graphs.graph("ml/a").embedding is not None and sc.graphs.embeddings_total == 1
    finally:
        sc.stop()


@pytest.mark.slow
def test_gnn_experiment_trains_the_graph_token_on_job_series(tmp_path: Path, small_alibaba_dir: Path,
                                                             small_jobs_dir: Path) -> None:
    """+exp=gnn composed from the real configs with tiny settings (fast_dev_run) beside a data set of whole jobs:
    the checkpoint loads with weights_only=True, says its workload path was trained with the graph token and
    records the encoder; its ONNX export carries the same."""
    from dprobe.config import compose
    from dprobe.forecaster.loading import load_forecaster
    from dprobe.training import run

    cfg = compose(["+exp=gnn", f"paths.output_dir={tmp_path}", f"data.datasets=[{small_alibaba_dir},{small_jobs_dir}]",
                   "data.samples_per_epoch=256", "data.val_samples=64", "data.batch_size=32", "model.d_model=16",
                   "model.n_layers=1", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
                   "trainer.fast_dev_run=true", "evaluate.enabled=false", "coldstart.enabled=false",
                   "jobscale.enabled=false", "kernel_gnn.enabled=false"])
    assert cfg.model.workload_token == cfg.data.workload_token == "graph"
    summary = run(cfg)
    ckpt = torch.load(summary["checkpoint"], weights_only=True)
    assert ckpt["workloads_trained"] is True and ckpt["hparams"]["workload_token"] == "graph"
    assert ckpt["graph_encoder"]["path"] == DEFAULT_ENCODER
    assert any(Path(tmp_path, "cache").glob("embedding-graph-*.npy"))  # embedded once, kept beside the graphs
    served = load_forecaster(str(Path(summary["checkpoint"]).with_suffix(".onnx")))
    assert served.conditioned and served.embeds_graphs and served.workload_token == "graph"


def test_metrics_say_which_token_each_forecast_used_in_both_renderings() -> None:
    """One info series a forecast target, dprobe_forecast_workload_info{..., token}: the fast text and
    client_python render the same; a target gone stale leaves with its forecasts."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from dprobe.services.sidecar.collector import SidecarCollector
    from dprobe.services.sidecar.state import ForecastSnapshot, Latest, SourceStatus

    now = 1000.0
    targets = ("ml/a", "ml/b", "ml/old")

    class State:
        stale_after, forecast_max_age = 30.0, 60.0

        def forecast_snapshot(self):
            q = np.ones((3, 1, 3))
            return ForecastSnapshot(made_at=now - 1, targets=targets, input_ts=np.full(3, now - 1), horizons=(60,),
                                    levels=(0.5, 0.9, 0.99), quantiles={"gpu_memory_bytes": q,
                                                                        "gpu_utilization_ratio": q / 10},
                                    labels=({"pod": "a"}, {"pod": "b"}, {}), tokens=("graph", "unknown", "vector"))

        def latest_samples(self):
            return {"ml/a": Latest(now - 1, 1.0, 0.1, "x", {"pod": "a"}), "ml/b": Latest(now - 1, 1.0, 0.1, "x"),
                    "ml/old": Latest(now - 99, 1.0, 0.1, "x")}

        def source_status(self):
            return [SourceStatus("x", True, 0)]

        def forecast_errors(self) -> int:
            return 0

        def model_labels(self):
            return {"version": "0", "checkpoint": "", "kind": "dprobe-forecaster (onnx)"}

        def job_rows(self, latest, fresh):
            return []

    collector = SidecarCollector(State(), clock=lambda: now)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)

    def tokens(text: str) -> dict[str, str]:
        return {s.labels["target"]: s.labels["token"] for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.name == "dprobe_forecast_workload_info"}

    assert tokens(collector.render_text().decode()) == tokens(generate_latest(reg).decode()) == {
        "ml/a": "graph", "ml/b": "unknown"}


def test_the_benchmark_ships_graph_unless_it_is_surely_worse_or_breaks_the_anonymous_bound(monkeypatch) -> None:
    """The rule docs/training.md wrote down first: graph if not surely worse than vector on the test families
    and the anonymous series within 1 % of the reference; else the better of vector and unknown within it;
    else keep the shipped model."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "forecaster_graph_token.py"
    spec = importlib.util.spec_from_file_location("forecaster_graph_token", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)

    def job(ratio_ci: tuple[float, float]) -> dict:
        return {"method": "graph", "target": "gpu_memory_bytes", "lead": 0, "pinball_ratio": sum(ratio_ci) / 2,
                "pinball_ratio_ci": ratio_ci}

    def anon(method: str, ratio: float) -> dict:
        return {"method": method, "target": "alibaba/gpu_memory_bytes", "lead": 0, "pinball_ratio": ratio}

    def blind(ratio: float) -> dict:  # the graph model told nothing of the workload
        return {"method": "graph|unknown", "target": "gpu_memory_bytes", "lead": 0, "pinball_ratio": ratio,
                "pinball_ratio_ci": (ratio - 0.05, ratio + 0.05)}

    assert bench.verdict([job((0.9, 1.05))])[0] == "graph"
    assert bench.verdict([job((1.001, 1.05))])[0] == "vector"
    # graph surely worse and vector past the anonymous bound: unknown if measured, else the shipped model stays
    assert bench.verdict([job((1.001, 1.05))], [anon("vector", 1.02), anon("graph", 1.0)])[0] == "keep"
    assert bench.verdict([job((1.001, 1.05)), blind(1.1)], [anon("vector", 1.02), anon("graph", 1.0)])[0] == "unknown"
    # graph past the bound: vector, or unknown where it beats vector, but never unknown past graph's bound
    assert bench.verdict([job((0.9, 0.95))], [anon("graph", 1.02), anon("vector", 1.0)])[0] == "vector"
    assert bench.verdict([job((1.001, 1.05)), blind(0.9)], [anon("vector", 1.0)])[0] == "unknown"
    assert bench.verdict([job((1.001, 1.05)), blind(1.1)], [anon("vector", 1.0)])[0] == "vector"
    assert bench.verdict([job((0.9, 0.95)), blind(0.8)], [anon("graph", 1.02), anon("vector", 1.0)])[0] == "vector"
    assert bench.verdict([job((0.9, 1.05))], [anon("graph", 1.02), anon("vector", 1.02)])[0] == "keep"


def test_a_task_never_trained_with_a_known_workload_ignores_graphs(tmp_path: Path) -> None:
    """The shipped forecaster's anonymous tasks (GenAI pods, Helios VCs) never saw a known workload: a graph
    given for their windows is left out (the unknown token, and /metrics says so); the job tasks read it."""
    from dprobe.forecaster.loading import open_forecaster

    shipped = open_forecaster(None, "dprobe").forecaster
    assert shipped.conditioned and shipped.graph_encoder["mode"] == "graph"
    trained = {f"{t.dataset}/{t.name}" for t, k in zip(shipped.tasks, shipped.workload_tasks, strict=True) if k}
    assert trained == {"h200-profiles/gpu_memory_bytes", "h200-profiles/gpu_duty_cycle_pct"}
    g = _graph()
    summary = GraphSummary.of(g, embedding=WorkloadEmbedder().embed(g))
    assert shipped.token_of(summary, "gpu_memory_bytes", 15.0) == "unknown"
    assert shipped.token_of(summary, "gpu_memory_bytes", 0.1) == "graph"
    window = ForecastInput(values=np.linspace(2e9, 3e9, 60)[None, :], metric="gpu_memory_bytes", leads=(1, 2),
                           step_seconds=57.0)
    np.testing.assert_array_equal(shipped.predict(replace(window, graphs=[summary])).quantiles,
                                  shipped.predict(window).quantiles)
    job = ForecastInput(values=np.linspace(2e9, 3e9, 60)[None, :], metric="gpu_memory_bytes", leads=(10, 50),
                        step_seconds=0.1)
    assert not np.allclose(shipped.predict(replace(job, graphs=[summary])).quantiles, shipped.predict(job).quantiles)
