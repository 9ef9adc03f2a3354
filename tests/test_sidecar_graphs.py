"""The sidecar's model graphs: built or read in a child process (never PyTorch in the sidecar itself), cached,
never in the way of a forecast cycle or a scrape, and a graph file over graph_max_mib refused and counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dprobe.core.names import QUANTILES
from dprobe.data.workloads import graph_vector
from dprobe.forecaster.base import Forecast, ForecastInput
from dprobe.forecaster.loading import LoadedModel, open_forecaster
from dprobe.graph.schema import GraphNode, ModelGraph
from dprobe.services.sidecar.annotations import MODEL_GRAPH, AnnotationPolicy
from dprobe.services.sidecar.child import TaskRefused
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.graphs import GraphRequest, GraphResolver, GraphSummary, summarise
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample

REPO = Path(__file__).resolve().parent.parent


def _graph(n: int = 40, name: str = "toy") -> ModelGraph:
    """A model graph of ``n`` nodes of several kinds (one unknown), as ``dprobe graph`` writes them."""
    kinds = ["conv", "norm", "act", "matmul", "other"]
    nodes = [GraphNode(id=i, name=f"n{i}", kind=kinds[i % 5], op=f"aten.op{i % 5}", shapes=[[2, 8, 4 + i % 3]],
                       dtypes=["float32"], params=10 * i, param_bytes=40 * i, flops=1e6 * i, saved_bytes=8 * i)
             for i in range(n)]
    return ModelGraph(name=name, source="test", nodes=nodes, edges=[(i, i + 1) for i in range(n - 1)],
                      inputs={"batch": 2})


class GraphReader:
    """A forecaster conditioned on model graphs (as ``+exp=gnn`` with workloads): the last value, and the
    graphs of each batch kept."""

    name = "graph-reader"
    conditioned = True

    def __init__(self) -> None:
        self.graphs: list[object] = []

    def predict(self, batch: ForecastInput) -> Forecast:
        self.graphs.extend(batch.graphs or [])
        last = np.array([row[~np.isnan(row)][-1] for row in batch.values])
        q = last[:, None, None] * np.ones((1, len(batch.leads), len(QUANTILES)))
        return Forecast(point=q[..., 0], quantiles=q, leads=batch.leads)


def _reader() -> LoadedModel:
    return LoadedModel(GraphReader(), "graph-reader", "test", "")


def test_the_summary_gives_the_forecaster_the_same_workload_vector() -> None:
    """What comes back from the child is a summary, not the graph's nodes: the forecaster reads the same
    workload vector from it, and it travels as a few hundred bytes of JSON."""
    graph = _graph()
    summary = GraphSummary.from_dict(json.loads(json.dumps(GraphSummary.of(graph).to_dict())))
    assert np.array_equal(graph_vector(summary), graph_vector(graph))
    assert len(summary.nodes) == len(graph.nodes) and summary.kind_counts() == graph.kind_counts()
    assert len(json.dumps(summary.to_dict())) < 1000


def test_requests_are_the_cache_key() -> None:
    """Whatever the spelling, the same model at the same sizes is one request; a file is another."""
    assert GraphRequest.of("torchvision:resnet18 batch=2") == GraphRequest.of("torchvision:resnet18   batch=2  ")
    assert GraphRequest.of("torchvision:resnet18") == GraphRequest.of("torchvision:resnet18 batch=1")
    assert GraphRequest.of("torchvision:resnet18 batch=2") != GraphRequest.of("torchvision:resnet18 batch=4")
    assert GraphRequest.of("/graphs/bert.json") == GraphRequest(path="/graphs/bert.json")
    assert GraphRequest.of("/graphs/net.onnx seq=128").model == "/graphs/net.onnx"
    with pytest.raises(ValueError, match="batch must be a whole number"):
        GraphRequest.of("torchvision:resnet18 batch=two")


def test_the_same_model_is_built_once(annotate, tmp_path: Path) -> None:
    """Targets, patterns and annotations naming the same model share one build; a graph is built by the
    background worker, never in the forecast cycle's call; an annotation changing back costs no build."""
    built: list[GraphRequest] = []

    def build(req: GraphRequest) -> GraphSummary:
        built.append(req)
        return GraphSummary.of(_graph(name=req.model))

    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    r = GraphResolver({"team-a/*": "torchvision:resnet18  batch=2"}, annotations_file=str(ann), build=build)
    targets = ["team-a/x", "team-a/y", "team-b/z", "team-b/w"]
    assert [r.graph(t) for t in targets] == [None] * 4 and built == []  # queued, not built here
    r.run_pending()
    assert all(isinstance(r.graph(t), GraphSummary) for t in targets)
    assert built == [GraphRequest(model="torchvision:resnet18", batch=2)] and r.builds_total == 1
    annotate(ann, **{MODEL_GRAPH: "timm:resnet50 batch=2"})
    assert r.refresh() and r.graph("team-b/z") is None
    r.run_pending()
    assert r.graph("team-b/z").name == "timm:resnet50" and len(built) == 2
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    assert r.refresh() and r.graph("team-b/z").name == "torchvision:resnet18"  # from the cache
    r.run_pending()
    assert len(built) == 2 and r.errors_total == 0


def test_an_oversize_graph_file_is_refused_and_counted(annotate, tmp_path: Path, scrape) -> None:
    """A graph JSON larger than graph_max_mib is not read (no child is started for it): the target is
    forecast from its metrics alone, the refusal logged and counted in dprobe_graph_errors_total."""
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    big = _graph(2000).save(graphs / "big.json")
    assert big.stat().st_size > 0.1 * 2**20
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "big.json"})

    class One:
        name = "one"

        def poll(self) -> list[Sample]:
            return [Sample("ml/a", time.time(), 1e9, 0.5, {"namespace": "ml", "pod": "a"})]

        def close(self) -> None:
            pass

    config = SidecarConfig(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.1,
                           step_seconds=0.1, window_seconds=5.0, horizons=[1], stale_after=0.6, max_backoff=0.2,
                           annotations_file=str(ann), graph_dir=str(graphs), graph_max_mib=0.1)
    sc = Sidecar(config, sources=[One()], model=_reader())
    sc.start()
    try:
        deadline = time.time() + 30
        while not sc.graphs.failures_total["too_large"]:
            assert time.time() < deadline, "the oversize file was not refused"
            time.sleep(0.05)
        got = {s.labels["reason"]: s.value for s in scrape(sc.server.url) if s.name == "dprobe_graph_errors_total"}
        assert got["too_large"] == 1 and sum(got.values()) == 1
        assert sc.graphs.graph("ml/a") is None and sc.engine.snapshot is not None  # forecast from its metrics
    finally:
        sc.stop()
    # the child reads no more than the limit either (a file that grew after it was checked)
    with pytest.raises(TaskRefused, match="larger than graph_max_mib") as refused:
        summarise({"path": str(big)}, max_bytes=2**16)
    assert refused.value.reason == "too_large"
    with pytest.raises(ValueError, match="graph_max_mib must be positive"):
        Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, graph_max_mib=0), sources=[],
                model=open_forecaster(None, "last_value"))


@pytest.mark.slow
def test_a_graph_file_within_the_limit_is_read_in_a_child(tmp_path: Path) -> None:
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    graph = _graph(300)
    graph.save(graphs / "net.json")
    (graphs / "broken.json").write_text("{not json")
    r = GraphResolver({"ml/*": str(graphs / "net.json"), "bad/*": str(graphs / "broken.json")},
                      policy=AnnotationPolicy(graph_dir=str(graphs)))
    assert r.graph("ml/a") is None and r.graph("bad/b") is None
    r.run_pending()
    assert np.array_equal(graph_vector(r.graph("ml/a")), graph_vector(graph))
    assert r.graph("bad/b") is None and r.failures_total["error"] == 1


def test_a_forecaster_that_reads_no_graph_gets_none_built(annotate, tmp_path: Path) -> None:
    """The baselines do not read graphs: none is built for them, whatever the annotation names. The shipped
    forecaster does (its workload token: the graph encoder's embedding and the vector), and its graphs'
    children embed them with the encoder its metadata records."""
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    sc = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann)), sources=[],
                 model=open_forecaster(None, "last_value"))
    assert not sc.reads_graphs and sc.engine.graphs is None
    assert sc.graphs.reference("ml/a") == "torchvision:resnet18 batch=2"
    sc = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann)), sources=[],
                 model=_reader())
    assert sc.reads_graphs and sc.engine.graphs is sc.graphs
    assert sc.graphs.encoder is None  # a forecaster without a graph encoder: summaries without embeddings
    # the shipped forecaster reads a graph where its task trained with one: the job tasks' 0.1 s step, not
    # the GenAI pods' tasks that serve a scrape every 10 s
    shipped = open_forecaster(None, "dprobe")
    sc = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann)), sources=[],
                 model=shipped)
    assert not sc.reads_graphs and sc.engine.graphs is None
    sc = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann), step_seconds=0.1,
                               horizons=[1, 5], sample_interval=0.1, stale_after=5.0, max_backoff=1.0),
                 sources=[], model=shipped)
    assert sc.reads_graphs and sc.engine.graphs is sc.graphs and sc.graphs.encoder["mode"] == "graph"


SLOW_MODELS = """
import os, pathlib, time

def sleepy():
    pathlib.Path(os.environ["DPROBE_TEST_MARKS"], "sleepy").write_text(str(os.getpid()))
    time.sleep(600)
"""


@pytest.mark.slow
def test_scrapes_and_forecasts_go_on_while_a_graph_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            scrape) -> None:
    """A model whose graph takes minutes to build (here: a factory that sleeps) holds up neither /metrics nor
    the forecast cycles: its targets are forecast from their metrics meanwhile; stopping kills its child."""
    (tmp_path / "slow_models.py").write_text(SLOW_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DPROBE_TEST_MARKS", str(tmp_path))

    class One:
        name = "one"

        def poll(self) -> list[Sample]:
            return [Sample("ml/a", time.time(), 1e9, 0.5, {"namespace": "ml", "pod": "a"})]

        def close(self) -> None:
            pass

    config = SidecarConfig(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.1,
                           step_seconds=0.1, window_seconds=5.0, horizons=[1], stale_after=0.6, max_backoff=0.2,
                           graphs={"ml/*": "module:slow_models:sleepy"})
    model = _reader()
    sc = Sidecar(config, sources=[One()], model=model)
    sc.start()
    try:
        started, worst, forecasts = time.monotonic(), 0.0, 0
        while time.monotonic() - started < 8:
            t = time.monotonic()
            got = scrape(sc.server.url, timeout=5)
            worst = max(worst, time.monotonic() - t)
            forecasts += any(s.name == "dprobe_predicted_gpu_memory_bytes" for s in got)
            time.sleep(0.2)
        assert sc.graphs.graph("ml/a") is None and sc.graphs._queued  # still being built
        assert worst < 1.0 and forecasts >= 10, (worst, forecasts)
        assert sc.engine.cycles_total >= 20 and model.forecaster.graphs and not any(model.forecaster.graphs)
    finally:
        sc.stop()
    mark = tmp_path / "sleepy"
    if mark.exists():  # the child got as far as the factory: it is gone with the sidecar
        pid = int(mark.read_text())
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, "the graph's child outlived the sidecar"
            time.sleep(0.05)
    assert sc.graphs.errors_total == 0  # stopping is no failure


ZOO_SIDECAR = """
import json, sys, time
from pathlib import Path

import numpy as np

from dprobe.core.names import QUANTILES
from dprobe.forecaster.base import Forecast
from dprobe.forecaster.loading import LoadedModel
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample


def rss_mb():
    return int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmRSS")).split()[1]) / 1024


class Reader:
    name, conditioned = "graph-reader", True

    def __init__(self):
        self.graphs = []

    def predict(self, batch):
        self.graphs.extend(g for g in batch.graphs or [] if g is not None)
        last = np.array([row[~np.isnan(row)][-1] for row in batch.values])
        q = last[:, None, None] * np.ones((1, len(batch.leads), len(QUANTILES)))
        return Forecast(point=q[..., 0], quantiles=q, leads=batch.leads)


class Pods:
    name = "pods"

    def poll(self):
        return [Sample(t, time.time(), 1e9, 0.5) for t in ("ml/a", "team-a/b")]

    def close(self):
        pass


annotations, = sys.argv[1:]
config = SidecarConfig(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.2,
                       step_seconds=0.1, window_seconds=5.0, horizons=[1], stale_after=2.0, max_backoff=0.2,
                       annotations_file=annotations, graphs={"team-a/*": "torchvision:resnet18 batch=2"})
reader = Reader()
sc = Sidecar(config, sources=[Pods()], model=LoadedModel(reader, "graph-reader", "test", ""))
sc.start()
before = rss_mb()
deadline = time.time() + 400
while time.time() < deadline and not (reader.graphs and all(sc.graphs.graph(t) for t in ("ml/a", "team-a/b"))):
    time.sleep(0.2)
time.sleep(1.0)
graph = sc.graphs.graph("ml/a")
print(json.dumps({"before_mb": before, "after_mb": rss_mb(), "torch": "torch" in sys.modules,
                  "nodes": len(graph.nodes) if graph else None, "kind": type(graph).__name__,
                  "builds": sc.graphs.builds_total, "errors": sc.graphs.failures_total,
                  "read": len(reader.graphs)}))
sc.stop()
"""


@pytest.mark.slow
def test_a_zoo_annotation_does_not_bring_torch_into_the_sidecar(annotate, tmp_path: Path) -> None:
    """A pod annotated with a zoo model once imported PyTorch into the sidecar (RSS 156 MB -> 809 MB for
    ResNet-18 at batch 2, over the pods' 512Mi limit): its graph is traced in a child now; the sidecar's RSS
    stays where it was, its forecaster gets the graph, and the same model named twice is traced once."""
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    script = tmp_path / "zoo_sidecar.py"
    script.write_text(textwrap.dedent(ZOO_SIDECAR))
    run = subprocess.run([sys.executable, str(script), str(ann)], cwd=REPO, capture_output=True, text=True,
                         timeout=500, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["kind"] == "GraphSummary" and got["nodes"] > 50 and got["read"] > 0, (got, run.stderr[-2000:])
    assert not got["torch"], got  # never imported by the sidecar
    assert got["after_mb"] - got["before_mb"] < 100, got  # PyTorch alone is about 600 MB
    assert got["builds"] == 1 and sum(got["errors"].values()) == 0, got  # the annotation and the pattern: one trace


def test_graph_workers_stop_with_the_sidecar() -> None:
    """Stopping ends the graph worker's thread too (nothing left running in the background)."""
    sc = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, graphs={"*": "/nonexistent.json"}), sources=[],
                 model=_reader())
    sc.start(serve=False)
    [worker] = [t for t in threading.enumerate() if t.name == "model-graphs"]
    sc.stop()
    worker.join(3)
    assert not worker.is_alive()
