"""The sidecar's job profiles: job specs, one cold-start prediction per job, and their export."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dprobe.forecaster.loading import open_forecaster
from dprobe.profiling.coldstart.predict import predict_job
from dprobe.services.sidecar.config import SidecarConfig, load_config
from dprobe.services.sidecar.jobs import JobLimits, JobProfiles, JobSpec
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample, SourceError

RESULT = {"device_memory_bytes": {"p50": 5e9, "p90": 6e9}, "peak_memory_bytes": {"p50": 3e9, "p90": 3.2e9},
          "gpu_utilization": {"p50": 0.7, "p90": 0.9}, "step_time_seconds": {"p50": 0.1, "p90": 0.12}, "fits": "yes"}


def test_job_spec_parses_what_dprobe_predict_takes() -> None:
    spec = JobSpec.parse("transformers:GPT2Config/GPT2LMHeadModel batch=8 seq=512 precision=BF16 "
                         "config_kwargs='{\"n_layer\": 2, \"n_embd\": 64}' gpu=a100 host_stall=0.01")
    assert (spec.model, spec.batch, spec.seq, spec.precision, spec.optimizer, spec.gpu, spec.host_stall_s) == (
        "transformers:GPT2Config/GPT2LMHeadModel", 8, 512, "bf16", "adamw", "a100", 0.01)
    assert spec.config_kwargs == '{"n_embd": 64, "n_layer": 2}'  # canonical: one profile per job
    assert JobSpec.parse("torchvision:resnet50 batch=4") == JobSpec("torchvision:resnet50", 4)
    assert JobSpec.parse("timm:resnet50 batch=64 gpu=rtx3090 stack=timm-2022").stack == "timm-2022"


def test_a_jobs_stack_reaches_the_prediction(monkeypatch) -> None:
    """``stack=`` is dprobe predict's --stack; unset, the prediction takes the GPU's default (None)."""
    import dprobe.profiling.coldstart.predict as coldstart_predict

    seen: list = []
    monkeypatch.setattr(coldstart_predict, "predict_job",
                        lambda *a, **kw: seen.append((kw.get("stack"), kw.get("mode"))))
    JobSpec.parse("timm:resnet50 batch=64 gpu=rtx3090 stack=h200-profiles").predict()
    JobSpec.parse("timm:resnet50 batch=64 gpu=rtx3090").predict()
    JobSpec.parse("timm:resnet50 batch=64 mode=inference").predict()
    assert seen == [("h200-profiles", "train"), (None, "train"), (None, "inference")]


def test_a_serving_job_gets_an_inference_profile() -> None:
    """``mode=inference``: the forward pass alone, as dprobe predict --mode inference gives it."""
    import dataclasses

    from dprobe.profiling.coldstart.predict import predict_job
    from dprobe.services.sidecar.jobs import predict_fields

    spec = JobSpec.parse("torchvision:resnet18 batch=32 image=64 precision=fp16 gpu=rtx4090 mode=inference")
    fields = predict_fields(dataclasses.asdict(spec), None)
    direct = predict_job("torchvision:resnet18", 32, "fp16", image=64, gpu="rtx4090", mode="inference")
    assert fields["step_time_seconds"] == dataclasses.asdict(direct.step_time_seconds)
    assert fields["peak_memory_bytes"]["p50"] < predict_job("torchvision:resnet18", 32, "fp16", "sgd", image=64,
                                                            gpu="rtx4090").peak_memory_bytes.p50


@pytest.mark.parametrize(("text", "message"), [
    ("torchvision:resnet50", "batch=N"),
    ("torchvision:resnet50 batch=0", "batch=N"),
    ("torchvision:resnet50 batch=four", "batch: invalid literal"),
    ("torchvision:resnet50 batch=4 precision=int8", "precision must be one of"),
    ("torchvision:resnet50 batch=4 gpu=v100", "gpu must be one of"),
    ("torchvision:resnet50 batch=4 lr=0.1", "unknown key 'lr'"),
    ("torchvision:resnet50 batch=4 stack=pytorch-3000", "stack must be one of"),
    ("torchvision:resnet50 batch=4 mode=serve", "mode must be one of train, inference"),
    ("torchvision:resnet50 batch=4 mode=inference optimizer=sgd", "optimizer is a training setting"),
    ("torchvision:resnet50 batch=4 config_kwargs=[1]", "must be a JSON object"),
    ("torchvision:resnet50 batch=4 'x", "No closing quotation"),
    ("  ", "empty; expected MODEL batch=N"),
])
def test_bad_job_specs_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobSpec.parse(text)


def test_one_prediction_per_job_and_failures_counted() -> None:
    calls: list[JobSpec] = []

    def predict(spec: JobSpec) -> dict:
        calls.append(spec)
        if spec.model == "timm:no_such_model":
            raise ValueError("unknown timm model")
        return RESULT

    jobs = JobProfiles({"team-a/*": "timm:no_such_model batch=2"}, default="torchvision:resnet50 batch=4",
                       own_target="team-b/trainer-0", predict=predict)
    assert jobs.profiles(["team-b/x", "team-b/y"]) == {}  # queued, not computed at scrape time
    jobs.run_pending()
    ready = jobs.profiles(["team-b/x", "team-b/y", "team-a/z"])
    assert set(ready) == {"team-b/x", "team-b/y", "team-b/trainer-0"}  # the own pod before any sample
    assert ready["team-b/x"].values["gpu_memory_bytes"] == {"0.5": 5e9, "0.9": 6e9}
    assert ready["team-b/x"].values["step_seconds"]["0.9"] == 0.12 and ready["team-b/x"].fits == "yes"
    jobs.run_pending()
    assert set(jobs.profiles(["team-a/z"])) == {"team-b/trainer-0"} and jobs.errors_total == 1  # not retried
    assert [c.model for c in calls] == ["torchvision:resnet50", "timm:no_such_model"]


def test_annotation_names_the_job(tmp_path: Path) -> None:
    ann = tmp_path / "annotations"
    ann.write_text('dprobe.io/training-job="torchvision:resnet18 batch=16 precision=bf16"\nother="x"\n')
    jobs = JobProfiles(default="torchvision:resnet50 batch=4", annotations_file=str(ann), gpu="a100")
    assert jobs.spec("any/pod") == JobSpec("torchvision:resnet18", 16, "bf16", gpu="a100")
    ann.write_text('dprobe.io/training-job="torchvision:resnet18 batch=x"\n')
    with pytest.raises(ValueError, match=r"annotations: annotation dprobe.io/training-job: .*batch: invalid literal"):
        JobProfiles(annotations_file=str(ann))


def test_a_changed_annotation_changes_the_job_without_a_restart(annotate, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    ann = tmp_path / "annotations"
    annotate(ann, 'other="x"\n')
    jobs = JobProfiles(default="torchvision:resnet50 batch=4", annotations_file=str(ann), gpu="a100")
    assert jobs.spec("ml/a").model == "torchvision:resnet50" and not jobs.refresh()  # unchanged: no re-read
    annotate(ann, 'other="x"\ndprobe.io/training-job="timm:resnet18 batch=16 precision=bf16"\n')
    assert jobs.refresh() and jobs.spec("ml/a") == JobSpec("timm:resnet18", 16, "bf16", gpu="a100")
    annotate(ann, 'dprobe.io/training-job="timm:resnet18 batch=sixteen"\n')
    with caplog.at_level(logging.WARNING, logger="dprobe"):
        assert not jobs.refresh()  # a bad annotation is logged, and the job stays what it was
    assert jobs.spec("ml/a").batch == 16 and "batch=sixteen" in caplog.text and "stays timm:resnet18" in caplog.text
    annotate(ann, 'other="y"\n')
    assert jobs.refresh() and jobs.spec("ml/a").model == "torchvision:resnet50"  # removed: the configured job
    ann.unlink()
    assert not jobs.refresh() and jobs.spec("ml/a").model == "torchvision:resnet50"


@pytest.mark.parametrize(("names", "expected"), [
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"], "a100"), (["NVIDIA H100 80GB HBM3"], "h100"),
    (["Tesla K80"], "h200"), ([], "h200")])
def test_a_job_without_gpu_is_predicted_for_the_gpu_nvml_sees(monkeypatch: pytest.MonkeyPatch, names: list[str],
                                                             expected: str) -> None:
    import dprobe.services.sources.nvml

    monkeypatch.setattr(dprobe.services.sources.nvml, "gpu_names", lambda: names)
    jobs = JobProfiles({"a/*": "timm:resnet18 batch=2 gpu=l4"}, default="torchvision:resnet50 batch=4")
    assert (jobs.spec("b/x").gpu, jobs.spec("a/x").gpu) == (expected, "l4")


def test_a_job_without_gpu_is_predicted_for_the_gpu_its_samples_name() -> None:
    """dcgm-exporter's modelName of a target's GPU names the GPU its job is predicted for (one profile per
    job and GPU); a name dprobe has no figures for, or none, falls back to this node's GPU, looked up once."""
    asked: list[str] = []
    local = ["l4"]

    def node_gpu() -> str:
        asked.append("nvml")
        return local[0]

    jobs = JobProfiles({"a/pinned-*": "timm:resnet18 batch=2 gpu=a10"}, default="torchvision:resnet50 batch=4",
                       predict=lambda spec: RESULT, gpu=node_gpu)
    models = {"a/x": "NVIDIA H100 80GB HBM3", "a/y": "NVIDIA A100-SXM4-80GB", "a/z": "Tesla K80",
              "a/pinned-0": "NVIDIA H100 80GB HBM3"}
    jobs.profiles(sorted(models) + ["a/w"], models)
    jobs.run_pending()
    ready = jobs.profiles(sorted(models) + ["a/w"], models)
    assert {t: p.spec.gpu for t, p in ready.items()} == {"a/x": "h100", "a/y": "a100", "a/z": "l4", "a/w": "l4",
                                                          "a/pinned-0": "a10"}
    assert asked == ["nvml"]
    assert len({p.spec for p in ready.values()}) == 4  # resnet50 on h100, a100, l4; resnet18 on a10


def test_sidecar_predicts_a_targets_job_for_the_gpu_its_samples_name() -> None:
    config = SidecarConfig(listen_address="127.0.0.1", port=0, job="torchvision:resnet50 batch=4")
    sc = Sidecar(config, sources=[OnePod()], model=open_forecaster(None, "last_value"))
    sc.jobs._predict = lambda spec: RESULT  # the prediction itself is tested elsewhere
    sc._sink([Sample("ml/trainer-0", time.time(), 2e9, 0.5, {"namespace": "ml", "pod": "trainer-0"},
                     gpu_model="NVIDIA A100-SXM4-80GB")], "dcgm")
    assert sc.job_rows(sc.latest_samples(), {"ml/trainer-0"}) == []  # queued
    sc.jobs.run_pending()
    [row] = sc.job_rows(sc.latest_samples(), {"ml/trainer-0"})
    assert (row.target, row.info["gpu"], row.labels["pod"]) == ("ml/trainer-0", "a100", "trainer-0")


def test_sidecar_follows_a_job_annotated_after_its_start(annotate, tmp_path: Path) -> None:
    """No job at the start; ``kubectl annotate`` names one: the own pod's profile is computed and exported."""
    ann = tmp_path / "annotations"
    annotate(ann, 'app="trainer"\n')
    config = SidecarConfig(listen_address="127.0.0.1", port=0, pod_name="ml/trainer-0", annotations_file=str(ann))
    sc = Sidecar(config, sources=[OnePod()], model=open_forecaster(None, "last_value"))
    sc.jobs._predict = lambda spec: RESULT  # the prediction itself is tested elsewhere
    assert not sc.jobs.active and sc.job_rows({}, set()) == []
    annotate(ann, 'app="trainer"\ndprobe.io/training-job="torchvision:resnet18 batch=8 gpu=l4"\n')
    sc.refresh_annotations()
    sc.jobs.run_pending()
    [row] = sc.job_rows({}, set())
    assert (row.target, row.info["model"], row.info["batch"], row.info["gpu"]) == (
        "ml/trainer-0", "torchvision:resnet18", "8", "l4")


@pytest.mark.slow
def test_bad_job_stops_the_start_with_its_place() -> None:
    with pytest.raises(ValueError, match=r"jobs\['team-a/\*'\]: 'resnet50': batch=N"):
        load_config({}, env={"DPROBE_SIDECAR_JOBS": '{"team-a/*": "resnet50"}'})
    run = subprocess.run([sys.executable, "-m", "dprobe.cli", "sidecar", "--job", "torchvision:resnet50 batch=4 opt=sgd"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "job: 'torchvision:resnet50 batch=4 opt=sgd': unknown key 'opt'" in run.stderr


PATHOLOGICAL = """
import mmap, os, pathlib, time

def _mark(name):
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    pathlib.Path(os.environ["DPROBE_TEST_MARKS"], name).write_text(f"{os.getpid()} GPUs: {gpus!r}")

def sleepy():
    _mark("sleepy")
    time.sleep(600)

def spinning():
    _mark("spinning")
    while True:
        pass

def hungry():
    _mark("hungry")
    return [mmap.mmap(-1, 2**30) for _ in range(1024)]  # address space only: no page is touched
"""


@pytest.fixture
def pathological(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module of model factories that sleep, spin or allocate without end (the operator's own module: specs);
    each leaves a file named after it, holding its pid and the GPUs it sees, in the directory returned."""
    (tmp_path / "pathological_models.py").write_text(PATHOLOGICAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DPROBE_TEST_MARKS", str(marks))
    return marks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "limits", "reason", "message"), [
    ("sleepy", JobLimits(timeout_s=10), "timeout", "still running after 10 s (job_timeout), killed"),
    ("spinning", JobLimits(cpu_s=20), "cpu", "past its 20 CPU seconds (job_cpu_limit), killed"),
    ("hungry", JobLimits(memory_gib=6), "memory", "out of its 6 GiB of address space (job_memory_limit)"),
])
def test_a_job_past_its_limits_is_killed_and_counted(pathological: Path, factory: str, limits: JobLimits,
                                                     reason: str, message: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The prediction runs in a child process within CPU, memory and time limits: a model that sleeps, spins
    or allocates without end is stopped there, counted by reason and logged; the sidecar goes on."""
    jobs = JobProfiles(default=f"module:pathological_models:{factory} batch=1", gpu="h200", limits=limits)
    jobs.profiles(["ml/a"])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dprobe"):
        jobs.run_pending()
    took = time.monotonic() - started
    pid, seen = (pathological / factory).read_text().split(" ", 1)  # the factory ran, in a child
    assert int(pid) != os.getpid() and not _alive(int(pid)) and seen == "GPUs: ''"  # and saw no GPU
    assert jobs.profiles(["ml/a"]) == {} and jobs.errors_total == 1 and jobs.failures_total[reason] == 1
    assert message in caplog.text and took < 60
    [family] = jobs.collect()
    assert {s.labels["reason"]: s.value for s in family.samples} == {
        r: float(r == reason) for r in ("error", "timeout", "cpu", "memory", "killed")}


@pytest.mark.slow
def test_a_stopped_sidecar_kills_the_prediction_under_way(pathological: Path) -> None:
    jobs = JobProfiles(default="module:pathological_models:sleepy batch=1", gpu="h200")
    jobs.profiles(["ml/a"])
    jobs.start()
    deadline = time.monotonic() + 60
    while not (pathological / "sleepy").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    jobs.stop()
    pid = int((pathological / "sleepy").read_text().split()[0])
    while _alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert jobs.errors_total == 0  # stopping is no failure


@pytest.mark.parametrize(("option", "value"), [("job_timeout", 0), ("job_cpu_limit", -1),
                                               ("job_memory_limit", float("inf"))])
def test_job_limits_must_be_positive(option: str, value: float) -> None:
    config = SidecarConfig(listen_address="127.0.0.1", port=0, **{option: value})
    with pytest.raises(ValueError, match=f"{option} must be positive"):
        Sidecar(config, sources=[], model=open_forecaster(None, "last_value"))


class OnePod:
    """A source with one pod that starts sampling only when told to."""

    name = "onepod"

    def __init__(self) -> None:
        self.started = threading.Event()

    def poll(self) -> list[Sample]:
        if not self.started.is_set():
            raise SourceError("pod not running yet")
        return [Sample("ml/trainer-0", time.time(), 2e9, 0.5, {"namespace": "ml", "pod": "trainer-0"})]

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_sidecar_exports_the_own_pods_profile_before_its_first_sample(scrape) -> None:
    job = "torchvision:resnet18 batch=8 precision=bf16 gpu=h200"
    config = SidecarConfig(listen_address="127.0.0.1", port=0, sample_interval=0.05, forecast_interval=0.1,
                           step_seconds=0.1, window_seconds=5.0, horizons=[1], stale_after=0.6, max_backoff=0.2,
                           pod_name="ml/trainer-0", job=job)
    src = OnePod()
    sc = Sidecar(config, sources=[src], model=open_forecaster(None, "last_value"))
    sc.start()
    try:
        deadline = time.time() + 120  # the replay of a training step takes seconds
        while not any(s.name == "dprobe_job_predicted_gpu_memory_bytes" for s in scrape(sc.server.url)):
            assert time.time() < deadline, "no job profile exported"
            time.sleep(0.2)
        got = scrape(sc.server.url)
        expected = predict_job("torchvision:resnet18", 8, "bf16")  # what `dprobe predict` says of the job
        mem = {s.labels["quantile"]: s.value for s in got if s.name == "dprobe_job_predicted_gpu_memory_bytes"}
        assert mem == {"0.5": expected.device_memory_bytes.p50, "0.9": expected.device_memory_bytes.p90}
        step = {s.labels["quantile"]: s.value for s in got if s.name == "dprobe_job_predicted_step_seconds"}
        assert step["0.5"] == pytest.approx(expected.step_time_seconds.p50)
        [info] = [s for s in got if s.name == "dprobe_job_info"]
        assert (info.labels["target"], info.labels["namespace"], info.labels["pod"], info.labels["model"],
                info.labels["batch"], info.labels["fits"]) == ("ml/trainer-0", "ml", "trainer-0",
                                                               "torchvision:resnet18", "8", expected.fits)
        assert not any(s.name == "dprobe_predicted_gpu_memory_bytes" for s in got)  # no forecast without samples
        src.started.set()
        while not any(s.name == "dprobe_predicted_gpu_memory_bytes" for s in scrape(sc.server.url)):
            assert time.time() < deadline
            time.sleep(0.05)
        got = scrape(sc.server.url)
        assert {s.labels["target"] for s in got if s.name == "dprobe_job_predicted_gpu_utilization_ratio"} == {
            "ml/trainer-0"}
        assert sc.jobs.errors_total == 0
    finally:
        sc.stop()
