"""Pod annotations are data: they name zoo models and graph files under graph_dir, never code, unless the
operator opts in; a refused annotation is logged once, counted, and the sidecar goes on without it."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dprobe.forecaster.loading import open_forecaster
from dprobe.profiling.coldstart.predict import predict_job
from dprobe.services.sidecar.annotations import MODEL_GRAPH, TRAINING_JOB, AnnotationPolicy, Refused
from dprobe.services.sidecar.config import SidecarConfig, load_config
from dprobe.services.sidecar.graphs import GraphResolver
from dprobe.services.sidecar.jobs import JobProfiles, JobSpec
from dprobe.services.sidecar.service import Sidecar

RESULT = {"device_memory_bytes": {"p50": 5e9, "p90": 6e9}, "peak_memory_bytes": {"p50": 3e9, "p90": 3.2e9},
          "gpu_utilization": {"p50": 0.7, "p90": 0.9}, "step_time_seconds": {"p50": 0.1, "p90": 0.12}, "fits": "yes"}


def _job(text: str) -> dict[str, str]:
    return {"dprobe.io/training-job": text.replace('"', '\\"')}


def test_a_code_annotation_runs_nothing(annotate, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``module:subprocess:run`` with config_kwargs once ran a command in the sidecar; now it is refused before
    anything is imported or started, logged once and counted, and the pod's job gets no profile."""
    marker = tmp_path / "ran"
    ann = tmp_path / "annotations"
    annotate(ann, **_job(f"module:subprocess:run batch=1 config_kwargs='{{\"args\": [\"touch\", \"{marker}\"]}}'"))
    policy = AnnotationPolicy()
    with caplog.at_level(logging.WARNING, logger="dprobe"):
        jobs = JobProfiles(default="torchvision:resnet18 batch=2", annotations_file=str(ann), own_target="ml/a",
                           gpu="h200", policy=policy)
        assert jobs.profiles(["ml/a"]) == {}
        jobs.run_pending()  # the real predictor: it would run the command
        for _ in range(3):
            assert not jobs.refresh()  # unchanged: not refused (nor logged) again
    assert not marker.exists()
    assert jobs.default is None and jobs.spec("ml/a") is None and jobs.profiles(["ml/a"]) == {}
    assert policy.refused_total == {MODEL_GRAPH: 0, TRAINING_JOB: 1} and jobs.errors_total == 0
    [record] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert "module: spec" in record.getMessage() and "no cold-start profile" in record.getMessage()


@pytest.mark.parametrize("text", [
    "module:os:abort batch=1",
    "transformers:GPT2Config/GPT2LMHeadModel batch=1 config_kwargs='{\"n_layer\": 2}'",  # arguments to code
    "transformers:__class__/GPT2LMHeadModel batch=1",  # not a class name
    "timm:hf-hub:someone/model batch=1",  # a download, not a timm name
    "/etc/passwd batch=1",  # a file, and no graph_dir
])
def test_job_annotations_naming_code_or_files_are_refused(annotate, tmp_path: Path, text: str) -> None:
    ann = tmp_path / "annotations"
    annotate(ann, **_job(text))
    called: list[JobSpec] = []
    policy = AnnotationPolicy()
    jobs = JobProfiles(default="torchvision:resnet18 batch=2", annotations_file=str(ann), policy=policy,
                       predict=lambda spec: called.append(spec) or RESULT, gpu="h200")
    jobs.profiles(["ml/a"])
    jobs.run_pending()
    assert called == [] and policy.refused_total[TRAINING_JOB] == 1


def test_graph_annotations_naming_code_are_refused(annotate, tmp_path: Path) -> None:
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "module:os:abort"})
    policy = AnnotationPolicy()
    r = GraphResolver(graph_file="default.json", annotations_file=str(ann), policy=policy)
    assert r.reference("ml/a") == "" and not r.active and r.graph("ml/a") is None  # from its metrics alone
    assert policy.refused_total[MODEL_GRAPH] == 1
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"})
    assert r.refresh() and r.reference("ml/a") == "torchvision:resnet18 batch=2"  # a zoo name is followed
    annotate(ann, **{MODEL_GRAPH: "module:subprocess:run"})
    assert r.refresh() and r.reference("ml/a") == "" and policy.refused_total[MODEL_GRAPH] == 2


def test_graph_files_outside_graph_dir_are_refused(annotate, tmp_path: Path) -> None:
    graphs, outside = tmp_path / "graphs", tmp_path / "outside.json"
    (graphs / "sub").mkdir(parents=True)
    outside.write_text("{}")
    (graphs / "bert.json").write_text("{}")
    (graphs / "escape.json").symlink_to(outside)
    (graphs / "alias.json").symlink_to(graphs / "bert.json")
    (graphs / "loop.json").symlink_to(graphs / "loop.json")
    policy = AnnotationPolicy(graph_dir=str(graphs))
    bert = str(graphs.resolve() / "bert.json")
    for name in ("bert.json", str(graphs / "bert.json"), "sub/../bert.json", "alias.json"):
        assert policy.graph_file(name) == bert, name
    for name in (str(outside), "../outside.json", "sub/../../outside.json", "escape.json", "/etc/passwd",
                 "loop.json", "bert\x00.json"):
        with pytest.raises(Refused):
            policy.graph_file(name)
    with pytest.raises(Refused, match="graph_dir is not set"):
        AnnotationPolicy().graph_file(bert)
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "../outside.json"})
    r = GraphResolver(annotations_file=str(ann), policy=policy)
    assert r.reference("ml/a") == "" and policy.refused_total[MODEL_GRAPH] == 1
    annotate(ann, **{MODEL_GRAPH: "sub/net.onnx batch=8"})  # an ONNX file, with its batch
    assert r.refresh() and r.reference("ml/a") == f"{graphs.resolve()}/sub/net.onnx batch=8"
    annotate(ann, **{MODEL_GRAPH: "../net.onnx batch=8"})
    assert r.refresh() and r.reference("ml/a") == "" and policy.refused_total[MODEL_GRAPH] == 2
    with pytest.raises(ValueError, match="graph_dir .* is not a directory"):
        AnnotationPolicy(graph_dir=str(outside))


@pytest.mark.slow
def test_a_zoo_annotation_and_a_graph_file_still_work(annotate, tmp_path: Path) -> None:
    """A zoo name builds its graph and predicts its job (in the limited child) as before; a graph file in
    graph_dir is loaded."""
    from dprobe.graph import build_model_graph

    graphs = tmp_path / "graphs"
    graphs.mkdir()
    graph = build_model_graph("torchvision:resnet18", batch=2)
    graph.save(graphs / "resnet18.json")
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "torchvision:resnet18 batch=2"}, **_job("torchvision:resnet18 batch=2 gpu=h200"))
    policy = AnnotationPolicy(graph_dir=str(graphs))
    r = GraphResolver(annotations_file=str(ann), policy=policy)
    assert r.graph("ml/a") is None  # queued: built in a child process, not here
    r.run_pending()
    assert len(r.graph("ml/a").nodes) == len(graph.nodes)
    annotate(ann, **{MODEL_GRAPH: "resnet18.json"}, **_job("torchvision:resnet18 batch=2 gpu=h200"))
    assert r.refresh() and r.graph("ml/a") is None
    r.run_pending()
    assert len(r.graph("ml/a").nodes) == len(graph.nodes) and r.errors_total == 0
    jobs = JobProfiles(annotations_file=str(ann), policy=policy)
    jobs.profiles(["ml/a"])
    jobs.run_pending()
    [profile] = jobs.profiles(["ml/a"]).values()
    expected = predict_job("torchvision:resnet18", 2, gpu="h200")
    assert profile.values["gpu_memory_bytes"] == {"0.5": expected.device_memory_bytes.p50,
                                                  "0.9": expected.device_memory_bytes.p90}
    assert policy.refused_total == {MODEL_GRAPH: 0, TRAINING_JOB: 0} and jobs.errors_total == 0
    assert policy.model("timm:vit_base_patch16_224.augreg_in21k") == "timm:vit_base_patch16_224.augreg_in21k"


def test_the_operator_opts_in_to_code_annotations(annotate, tmp_path: Path) -> None:
    """With allow_code_annotations, module: specs and config_kwargs are taken from annotations; without it the
    operator's own configuration may still name module: specs."""
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "module:mymodels:net"},
              **_job("module:mymodels:net batch=4 config_kwargs='{\"width\": 8}'"))
    assert load_config({}, env={"DPROBE_SIDECAR_ALLOW_CODE_ANNOTATIONS": "true"}).allow_code_annotations
    config = SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann), allow_code_annotations=True)
    sc = Sidecar(config, sources=[], model=open_forecaster(None, "last_value"))
    assert sc.graphs.reference("ml/a") == "module:mymodels:net"
    assert (sc.jobs.spec("ml/a").model, sc.jobs.spec("ml/a").config_kwargs) == ("module:mymodels:net", '{"width": 8}')
    assert sc.annotation_policy.refused_total == {MODEL_GRAPH: 0, TRAINING_JOB: 0}
    config = SidecarConfig(listen_address="127.0.0.1", port=0, annotations_file=str(ann),
                           graphs={"ml/*": "module:mymodels:net"}, job="module:mymodels:net batch=2")
    sc = Sidecar(config, sources=[], model=open_forecaster(None, "last_value"))
    assert sc.graphs.reference("ml/a") == "module:mymodels:net" and sc.graphs.reference("other/b") == ""
    assert sc.jobs.spec("ml/a") is None and sc.jobs.configured.model == "module:mymodels:net"  # annotation refused
    assert sc.annotation_policy.refused_total == {MODEL_GRAPH: 1, TRAINING_JOB: 1}


def _by_series(samples: list) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


@pytest.mark.slow
def test_code_annotations_do_not_kill_the_sidecar(scrape, annotate, tmp_path: Path) -> None:
    """``module:os:abort`` in either annotation once killed the sidecar (at its first forecast, or at the job's
    prediction); now it serves forecasts, and exports the refusals."""
    ann = tmp_path / "annotations"
    annotate(ann, **{MODEL_GRAPH: "module:os:abort"}, **_job("module:os:abort batch=1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dprobe.cli", "sidecar", "--source", "synthetic", "--synthetic-targets", "2",
         "--model", "last_value", "--listen-address", "127.0.0.1", "--port", "0", "--annotations-file", str(ann),
         "--pod-name", "ml/trainer-0", "--sample-interval", "0.1", "--forecast-interval", "0.2",
         "--step-seconds", "0.2", "--min-points", "2", "--horizons", "1", "--stale-after", "2"],
        stderr=subprocess.PIPE, text=True)
    try:
        url = ""
        deadline = time.time() + 60
        while not url:
            line = proc.stderr.readline()
            assert line and time.time() < deadline, "the sidecar did not start"
            if found := re.search(r"serving (http://[\d.]+:\d+)/metrics", line):
                url = found.group(1)
        while not any(name == "dprobe_predicted_gpu_memory_bytes" for name, _ in _by_series(scrape(url))):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.1)
        time.sleep(1.0)  # a few more forecast cycles, and time for a job prediction
        got = _by_series(scrape(url))
        assert proc.poll() is None
        assert got[("dprobe_annotations_refused_total", (("annotation", MODEL_GRAPH),))] == 1
        assert got[("dprobe_annotations_refused_total", (("annotation", TRAINING_JOB),))] == 1
        assert got[("dprobe_job_profile_errors_total", (("reason", "error"),))] == 0
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
