"""Metric sources: dcgm-exporter text, Prometheus query_range, NVML (faults injected), trace replay."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pynvml
import pytest

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.service import Scaler
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample, SourceError, registry, screen_samples, target_name
from dprobe.services.sources.dcgm import DcgmSource, parse_dcgm_text
from dprobe.services.sources.http import http_get
from dprobe.services.sources.nvml import NvmlSource, gpu_names, pod_of_cgroup
from dprobe.services.sources.prometheus import PrometheusSource
from dprobe.services.sources.registry import SourceContext, build_source, register, source_names
from dprobe.services.sources.replay import ReplaySource
from dprobe.services.sources.synthetic import SyntheticOptions, SyntheticSource

MIB = 1024 * 1024
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H200",Hostname="n1",container="trainer",namespace="team-a",pod="train-0"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H200",Hostname="n1",container="trainer",namespace="team-a",pod="train-0"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H200",Hostname="n1",container="",namespace="",pod=""} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H200",Hostname="n1",container="trainer",namespace="team-a",pod="train-0"} 1000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H200",Hostname="n1",container="trainer",namespace="team-a",pod="train-0"} 3000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H200",Hostname="n1",container="",namespace="",pod=""} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaa",container="trainer",namespace="team-a",pod="train-0"} 142771
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-bbb",container="trainer",namespace="team-a",pod="train-0"} 140771
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-ccc",container="",namespace="",pod=""} 143771
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaa",container="trainer",namespace="team-a",pod="train-0"} 400.5
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbb",container="trainer",namespace="team-a",pod="train-0"} 300
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-aaa",container="trainer",namespace="team-a",pod="train-0"} 0.75
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-bbb",container="trainer",namespace="team-a",pod="train-0"} 0.25
"""


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


# dcgm -------------------------------------------------------------------------------------------
def test_dcgm_text_pods_and_base_units() -> None:
    samples = {s.target: s for s in parse_dcgm_text(DCGM_TEXT, ts=100.0)}
    assert set(samples) == {"team-a/train-0", "GPU-ccc"}
    pod = samples["team-a/train-0"]
    assert pod.memory_bytes == 4000 * MIB  # MiB summed over the pod's two GPUs, in bytes
    assert pod.utilization_ratio == pytest.approx(0.6)
    assert pod.extra["memory_total_bytes"] == (1000 + 142771 + 3000 + 140771) * MIB
    assert pod.extra["power_watts"] == pytest.approx(700.5)
    assert pod.extra["gr_engine_active_ratio"] == pytest.approx(0.5)
    assert pod.labels["namespace"] == "team-a" and pod.labels["container"] == "trainer"
    assert pod.labels["UUID"] == "GPU-aaa,GPU-bbb"
    free_gpu = samples["GPU-ccc"]
    assert free_gpu.memory_bytes == 0 and free_gpu.labels["gpu"] == "2" and pod.ts == 100.0
    assert pod.gpu_model == free_gpu.gpu_model == "NVIDIA H200"  # modelName, for the jobs' cold-start profiles


def test_dcgm_gpu_targets_and_engine_active() -> None:
    gpus = {s.target: s for s in parse_dcgm_text(DCGM_TEXT, 1.0, targets="gpu", utilization="gr_engine_active")}
    assert set(gpus) == {"GPU-aaa", "GPU-bbb", "GPU-ccc"}
    assert gpus["GPU-aaa"].utilization_ratio == 0.75 and gpus["GPU-bbb"].memory_bytes == 3000 * MIB
    assert gpus["GPU-ccc"].utilization_ratio == 0.0  # no GR_ENGINE_ACTIVE there: GPU_UTIL instead
    both = {s.target for s in parse_dcgm_text(DCGM_TEXT, 1.0, targets="both")}
    assert both == {"team-a/train-0", "GPU-aaa", "GPU-bbb", "GPU-ccc"}


def _dcgm_line(field: str, gpu: int, pod: str, value: str) -> str:
    ns = "team-a" if pod else ""
    return f'{field}{{gpu="{gpu}",UUID="GPU-{gpu}",container="",namespace="{ns}",pod="{pod}"}} {value}\n'


def test_dcgm_nan_and_impossible_readings_are_missing_never_zero() -> None:
    """A NaN utilisation is missing (it read 0 % before: min(1, max(0, nan))); a pod whose GPU reads NaN,
    negative or 5,500 % has no value for it (not the other GPU's alone), and the reason is kept for the count."""
    text = "".join([
        _dcgm_line("DCGM_FI_DEV_GPU_UTIL", 0, "p", "NaN"), _dcgm_line("DCGM_FI_DEV_GPU_UTIL", 1, "p", "80"),
        _dcgm_line("DCGM_FI_DEV_FB_USED", 0, "p", "-5"), _dcgm_line("DCGM_FI_DEV_FB_USED", 1, "p", "1000"),
        _dcgm_line("DCGM_FI_DEV_GPU_UTIL", 2, "", "5500"), _dcgm_line("DCGM_FI_DEV_FB_USED", 2, "", "+Inf"),
        _dcgm_line("DCGM_FI_DEV_GPU_UTIL", 3, "", "100.5"), _dcgm_line("DCGM_FI_DEV_FB_USED", 3, "", "0"),
    ])
    by = {s.target: s for s in parse_dcgm_text(text, ts=100.0)}
    pod = by["team-a/p"]
    assert pod.utilization_ratio is None and pod.memory_bytes is None  # not 0.4 (80 % / 2), not 1000 MiB
    assert sorted(pod.rejected) == ["nan", "negative"]
    assert by["GPU-2"].utilization_ratio is None and by["GPU-2"].memory_bytes is None
    assert sorted(by["GPU-2"].rejected) == ["infinite", "ratio_above_one"]
    assert by["GPU-3"].utilization_ratio == 1.0 and by["GPU-3"].memory_bytes == 0.0  # rounding, and a real 0
    kept, refused = screen_samples(by.values(), now=100.0, max_skew=5.0)
    assert [s.target for s in kept] == ["GPU-3"] and kept[0].rejected == ()
    assert refused == {"nan": 1, "negative": 1, "infinite": 1, "ratio_above_one": 1}


def test_screen_samples_refuses_and_counts() -> None:
    samples = [
        Sample("a", 100.0, float("nan"), 0.5),       # memory missing, utilisation kept
        Sample("b", 100.0, -1.0, 1.5),               # both impossible: nothing left of it
        Sample("c", 100.0, float("inf"), 1.004),     # within the ratio tolerance: 1.0
        Sample("d", 104.0, 1e9, 0.2),                # 4 s ahead: within max_skew
        Sample("e", 106.0, 1e9, 0.2),                # 6 s ahead: refused
        Sample("f", float("nan"), 1e9, 0.2),
        Sample("g", 100.0, None, None),              # measures nothing: says nothing of its target
        Sample("h", 100.0, 0.0, 0.0),                # a real zero stays
    ]
    kept, refused = screen_samples(samples, now=100.0, max_skew=5.0)
    assert [(s.target, s.memory_bytes, s.utilization_ratio) for s in kept] == [
        ("a", None, 0.5), ("c", None, 1.0), ("d", 1e9, 0.2), ("h", 0.0, 0.0)]
    assert refused == {"nan": 1, "negative": 1, "ratio_above_one": 1, "infinite": 1, "future_timestamp": 1,
                       "bad_timestamp": 1}


@pytest.mark.parametrize("text", ["<html>502 Bad Gateway</html>", "DCGM_FI_DEV_GPU_UTIL{gpu=0 80\n",
                                  "# only comments\nother_metric 1\n", ""])
def test_dcgm_garbage_is_a_source_error(text: str) -> None:
    with pytest.raises(SourceError):
        parse_dcgm_text(text, 0.0)


def test_dcgm_source_over_http_and_faults(http_peer) -> None:
    state = {"reply": (200, DCGM_TEXT, 0.0)}
    with http_peer(lambda path: state["reply"]) as url:
        src = DcgmSource(url + "/metrics", timeout=0.5)
        assert {s.target for s in src.poll()} == {"team-a/train-0", "GPU-ccc"}
        state["reply"] = (500, "boom", 0.0)
        with pytest.raises(SourceError, match="HTTP 500"):
            src.poll()
        state["reply"] = (200, "\x00\x01garbage", 0.0)
        with pytest.raises(SourceError):
            src.poll()
        state["reply"] = (200, DCGM_TEXT, 1.0)  # slower than the timeout
        with pytest.raises(SourceError, match="timed out"):
            src.poll()
    with pytest.raises(SourceError):
        DcgmSource(closed_port_url(), timeout=0.5).poll()


# prometheus -------------------------------------------------------------------------------------
def _matrix(series: list[tuple[dict, list]]) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": m, "values": [[t, str(v)] for t, v in vals]} for m, vals in series]}})


def test_prometheus_source_query_range(http_peer) -> None:
    now = time.time()
    seen = []

    def reply(path: str):
        seen.append(path)
        if "FB_USED" in path:
            return 200, _matrix([({"namespace": "ns", "pod": "p1", "modelName": "NVIDIA L4"},
                                  [(now - 20, 1e9), (now - 10, 2e9)])]), 0.0
        return 200, _matrix([({"namespace": "ns", "pod": "p1"}, [(now - 10, 0.5)]),
                             ({"UUID": "GPU-x"}, [(now - 10, "NaN")])]), 0.0

    with http_peer(reply) as url:
        src = PrometheusSource(url, step=10, lookback=600)
        samples = src.poll()
    assert all("/api/v1/query_range?" in p for p in seen) and len(seen) == 2
    samples, refused = screen_samples(samples, now, max_skew=5.0)  # as the sidecar takes them
    assert [(s.target, s.memory_bytes, s.utilization_ratio, s.gpu_model) for s in samples] == [
        ("ns/p1", 1e9, None, "NVIDIA L4"), ("ns/p1", 2e9, 0.5, "NVIDIA L4")]
    assert refused == {"nan": 1}  # GPU-x's NaN: missing, counted, and no sample of it
    assert src._since == pytest.approx(now - 10)


def test_prometheus_source_never_asks_for_a_range_ending_before_it_starts(http_peer) -> None:
    """Points stamped 600 s ahead (a server clock ahead of this one) must not push the next query's start
    past its end, which Prometheus refuses ("end timestamp must not be before start time")."""
    import urllib.parse

    asked = []

    def reply(path: str):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        start, end = float(q["start"][0]), float(q["end"][0])
        asked.append((start, end))
        if start > end:
            return 400, '{"status":"error","error":"end timestamp must not be before start time"}', 0.0
        return 200, _matrix([({"namespace": "ns", "pod": "p1"}, [(time.time() + 600, 1e9)])]), 0.0

    with http_peer(reply) as url:
        src = PrometheusSource(url, utilization_query="", step=10, lookback=60)
        first = src.poll()
        second = src.poll()  # raised SourceError (HTTP 400) when the start followed the future point
    assert first[0].ts > time.time() + 500 and second  # handed on: the sidecar refuses them (see test_sidecar)
    assert len(asked) == 2 and all(start <= end for start, end in asked)


def test_prometheus_source_splits_a_long_backfill(http_peer) -> None:
    """A window longer than Prometheus's points-per-query limit is asked for in spans on the same grid:
    every point comes back once, in order, and no request exceeds the limit."""
    import urllib.parse

    spans = []

    def reply(path: str):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        start, end, step = (float(q[k][0]) for k in ("start", "end", "step"))
        spans.append((start, end, step))
        grid = np.arange(start, end + 1e-6, step)
        return 200, _matrix([({"namespace": "ns", "pod": "p1"}, [(t, t % 1000) for t in grid])]), 0.0

    with http_peer(reply) as url:
        src = PrometheusSource(url, utilization_query="", step=10, lookback=600)
        src.max_points = 7
        samples = src.poll()
    assert len(spans) > 5 and all((end - start) / step + 1 <= 7 + 1e-9 for start, end, step in spans)
    ts = [s.ts for s in samples]
    assert len(ts) == 61 and np.allclose(np.diff(ts), 10)  # 600 s at 10 s, each point once
    assert [s.memory_bytes for s in samples] == pytest.approx([t % 1000 for t in ts])
    spans.clear()
    with http_peer(reply) as url:  # a window that ends less than a step after a span: no empty request after it
        src = PrometheusSource(url, utilization_query="", step=10, lookback=65)
        src.max_points = 7
        samples = src.poll()
    assert len(samples) == 7 and len(spans) == 1 and all(start <= end for start, end, _ in spans)


# answers shaped unlike the HTTP API's: data not an object, a result not a list
NOT_THE_API = ['{"status":"success","data":"matrix"}', '{"status":"success","data":[{"metric":{},"values":[]}]}',
               '{"status":"success","data":{"resultType":"matrix","result":"none"}}']


@pytest.mark.parametrize("reply", [(200, "not json", 0.0), (400, '{"status":"error","error":"bad"}', 0.0),
                                   (200, '{"status":"success","data":{"resultType":"vector","result":[]}}', 0.0),
                                   (200, "{}", 1.0), *((200, text, 0.0) for text in NOT_THE_API)])
def test_prometheus_source_faults(reply, http_peer) -> None:
    with http_peer(lambda path: reply) as url, pytest.raises(SourceError):
        PrometheusSource(url, timeout=0.5).poll()


@pytest.mark.parametrize("text", [t.replace("matrix", "vector") for t in NOT_THE_API])
def test_an_answer_not_shaped_as_the_api_is_a_counted_failed_query_and_counts_hold(text: str, http_peer) -> None:
    """Prometheus answering the scaler's queries with ``data`` that is not an object (or a result that is not a
    list): a failed query, counted in dprobe_scaler_errors_total{stage="query"} and said by /readyz, never a
    failed cycle; the count is held."""
    pods = {"llm-7d9f8c6b5d-aaaaa": 0.9, "llm-7d9f8c6b5d-bbbbb": 0.9}
    bad = [False]

    def reply(path: str) -> tuple[int, str, float]:
        if bad[0]:
            return 200, text, 0.0
        if "dprobe_predicted" in path:
            rows = [{"metric": {"target": f"serving/{p}", "namespace": "serving", "pod": p}, "value": [0, str(v)]}
                    for p, v in pods.items()]
        elif "kube_deployment_spec_replicas" in path:
            rows = [{"metric": {"namespace": "serving", "workload": "llm"}, "value": [0, "2"]}]
        else:
            rows = [{"metric": {"namespace": "serving", "pod": p}, "value": [0, "1"]} for p in pods]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": rows}}), 0.0

    clock = iter(range(0, 10**6, 30))
    with http_peer(reply) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0,
                                     workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 8}]),
                        clock=lambda: float(next(clock)))
        for _ in range(2):
            scaler.cycle()
        before = scaler.decisions[("serving", "llm")].replicas
        assert before >= 2 and scaler.ready()[0] and scaler.errors_total["query"] == 0
        bad[0] = True
        for _ in range(2):
            scaler.cycle()
        ready, why = scaler.ready()
        assert not ready and "expected a vector, got" in why, why
        assert scaler.errors_total["query"] >= 2 and scaler.errors_total["cycle"] == 0
        assert scaler.decisions[("serving", "llm")].replicas == before


def test_prometheus_unreachable() -> None:
    with pytest.raises(SourceError):
        PrometheusSource(closed_port_url().rsplit("/", 1)[0], timeout=0.5).poll()


# nvml -------------------------------------------------------------------------------------------
class FakeNvml:
    """Stand-ins for the pynvml calls NvmlSource makes (two GPUs, one process each)."""

    def __init__(self) -> None:
        self.inits = 0

    def install(self, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(pynvml, "nvmlInit", self.init)
        mp.setattr(pynvml, "nvmlShutdown", lambda: None)
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        mp.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=(h + 1) * 1e9, total=80e9))
        mp.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=50 + h, memory=0))
        mp.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 250_000)
        mp.setattr(pynvml, "nvmlDeviceGetClockInfo", lambda h, c: 1980)
        mp.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses",
                   lambda h: [SimpleNamespace(pid=100 + h, usedGpuMemory=int(5e8))])

    def init(self) -> None:
        self.inits += 1


def test_nvml_gpus_and_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)
    uid = "1234abcd-0000-1111-2222-333344445555"
    src = NvmlSource(pod_names={uid: "team-b/serve-0"},
                     pod_resolver=lambda pid: (uid, "c" * 64) if pid == 100 else None)
    by = {s.target: s for s in src.poll()}
    assert set(by) == {"GPU-0", "GPU-1", "team-b/serve-0"}
    assert by["GPU-1"].memory_bytes == 2e9 and by["GPU-1"].utilization_ratio == pytest.approx(0.51)
    assert by["GPU-0"].extra == {"memory_total_bytes": 80e9, "power_watts": 250.0, "sm_clock_hertz": 1.98e9}
    assert by["team-b/serve-0"].memory_bytes == 5e8 and by["team-b/serve-0"].labels["UUID"] == "GPU-0"


def test_nvml_pod_with_a_process_of_unknown_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod one of whose processes NVML cannot size has no memory reading, not the sum of the others."""
    FakeNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses",
                        lambda h: [SimpleNamespace(pid=100, usedGpuMemory=int(5e8)),
                                   SimpleNamespace(pid=101, usedGpuMemory=None)])
    uid = "1234abcd-0000-1111-2222-333344445555"
    src = NvmlSource(pod_names={uid: "team-b/serve-0"}, pod_resolver=lambda pid: (uid, ""))
    by = {s.target: s for s in src.poll()}
    assert by["team-b/serve-0"].memory_bytes is None and by["GPU-0"].memory_bytes == 1e9
    kept, _ = screen_samples(by.values(), now=time.time(), max_skew=5.0)
    assert {s.target for s in kept} == {"GPU-0", "GPU-1"}  # the pod is not refreshed by it


def test_nvml_gpu_names(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: [b"NVIDIA H100 80GB HBM3", "NVIDIA L4"][h])
    assert gpu_names() == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]

    def broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    assert gpu_names() == []


def test_nvml_absent_or_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    src = NvmlSource()  # construction never fails: the first poll reports it
    with pytest.raises(SourceError, match="NVML init failed"):
        src.poll()
    fake = FakeNvml()
    fake.install(monkeypatch)
    assert len(src.poll()) == 2  # recovered: re-initialised on the next poll

    def gpu_lost(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", gpu_lost)
    with pytest.raises(SourceError, match="NVML"):
        src.poll()
    assert not src._initialised and fake.inits == 1


def test_pod_of_cgroup() -> None:
    v1 = "12:memory:/kubepods/burstable/pod0f6b2c1e-1111-2222-3333-444455556666/" + "a" * 64
    v2 = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f6b2c1e_1111_2222_3333_"
          "444455556666.slice/cri-containerd-" + "b" * 64 + ".scope")
    assert pod_of_cgroup(v1) == ("0f6b2c1e-1111-2222-3333-444455556666", "a" * 64)
    assert pod_of_cgroup(v2) == ("0f6b2c1e-1111-2222-3333-444455556666", "b" * 64)
    assert pod_of_cgroup("0::/user.slice/session-1.scope") is None


# replay -----------------------------------------------------------------------------------------
def test_replay_alibaba_layout(tmp_path: Path, alibaba_layout) -> None:
    path = alibaba_layout(tmp_path / "trace", {
        "podA": [(i * 57.0, 10.0 * i, 1e9 * (i + 1)) for i in range(10)],
        "podB": [(i * 57.0, 50.0, 2e9) for i in range(5, 10)],
    })
    clock = [1000.0]
    src = ReplaySource("alibaba", path, speed=57.0, loop=False, clock=lambda: clock[0])
    first = src.poll()
    assert [(s.target, s.memory_bytes, s.utilization_ratio, s.ts) for s in first] == [("podA", 1e9, 0.0, 1000.0)]
    clock[0] += 5.0  # trace time 285 s: step 5
    by = {s.target: s for s in src.poll()}
    assert by["podA"].memory_bytes == 6e9 and by["podA"].utilization_ratio == pytest.approx(0.5)
    assert by["podB"].memory_bytes == 2e9
    clock[0] += 100.0  # past the end, no loop: every pod is gone
    assert src.poll() == []


def test_replay_gaps_are_missing(tmp_path: Path, alibaba_layout) -> None:
    """A gap (NaN) in the replayed trace is missing once screened, never 0, and counted."""
    path = alibaba_layout(tmp_path / "trace", {"podA": [(0.0, float("nan"), 1e9), (57.0, 50.0, float("nan"))]})
    clock = [1000.0]
    src = ReplaySource("alibaba", path, speed=57.0, loop=False, clock=lambda: clock[0])
    kept, refused = screen_samples(src.poll(), now=1000.0, max_skew=5.0)
    assert [(s.memory_bytes, s.utilization_ratio) for s in kept] == [(1e9, None)] and refused == {"nan": 1}
    clock[0] += 1.0
    kept, refused = screen_samples(src.poll(), now=1001.0, max_skew=5.0)
    assert [(s.memory_bytes, s.utilization_ratio) for s in kept] == [(None, 0.5)] and refused == {"nan": 1}


def test_replay_loops_and_h200() -> None:
    clock = [0.0]
    src = ReplaySource("h200", speed=1.0, clock=lambda: clock[0])
    seen = set()
    for step in range(0, 700, 7):
        clock[0] = float(step)
        seen |= {s.target for s in src.poll()}
    assert len(seen) >= 10 and all(t.startswith("h200/") for t in seen)
    assert src.trace_time(src.trace.span + 3.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="replay dataset"):
        ReplaySource("nope")


def test_synthetic_and_target_names() -> None:
    samples = SyntheticSource(n_targets=5, clock=lambda: 10.0).poll()
    assert len(samples) == 5 and all(isinstance(s, Sample) and 0 <= s.utilization_ratio <= 1 for s in samples)
    assert target_name({"pod": "p", "namespace": "n"}) == "n/p"
    assert target_name({"pod": "", "UUID": "GPU-1"}) == "GPU-1"
    assert target_name({"gpu": "3"}) == "gpu3" and target_name({}) is None


# the registry -----------------------------------------------------------------------------------
def test_sources_are_made_by_name_and_a_new_one_registers_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from dprobe.services.sidecar.config import SOURCES, SidecarConfig, load_config

    assert source_names() == SOURCES == ("auto", "nvml", "dcgm", "prometheus", "replay", "synthetic")
    sources = SidecarConfig(dcgm_url="http://dcgm:9400/metrics", dcgm_targets="gpu", http_timeout=1.5).sources
    dcgm = build_source("dcgm", sources, SourceContext(http_timeout=sources.http_timeout))  # from its own group
    assert isinstance(dcgm, DcgmSource) and (dcgm.url, dcgm.targets, dcgm.timeout) == (
        "http://dcgm:9400/metrics", "gpu", 1.5)
    synthetic = build_source("synthetic", SimpleNamespace(synthetic=SyntheticOptions(targets=3)))  # any holder
    assert isinstance(synthetic, SyntheticSource) and synthetic.n_targets == 3
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        build_source("nope", SidecarConfig().sources)
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    register("scripted", lambda options, context: SyntheticSource(3, period=60.0))
    assert source_names()[-1] == "scripted" and build_source("scripted", SidecarConfig().sources).period == 60.0
    with pytest.raises(ValueError, match="registered already"):
        register("dcgm", lambda options, context: SyntheticSource())
    with pytest.raises(ValueError, match="option source must be one of auto, nvml, dcgm"):
        load_config({}, env={"DPROBE_SIDECAR_SOURCE": "nope"})



# a source that answers a byte at a time -----------------------------------------------------------
@pytest.mark.slow  # each request is cut off after 0.5 s
@pytest.mark.parametrize("how", ["head", "body"])
def test_http_timeout_bounds_the_whole_request_however_slowly_it_comes(how: str, drip_peer) -> None:
    """A server answering a byte every 0.1 s (each byte well within the timeout) is cut off once http_timeout has
    passed since the request began, whether it drips its status line and headers or its body; the poll is then a
    failed one, and the same server answering at once is read."""
    state = {"how": how}
    with drip_peer(lambda path: (DCGM_TEXT, state["how"]), gap=0.1, most=5.0) as url:
        for get in (lambda: http_get(url + "/metrics", 0.5), lambda: DcgmSource(url + "/metrics", timeout=0.5).poll(),
                    lambda: PrometheusSource(url, timeout=0.5).poll()):
            started = time.monotonic()
            with pytest.raises(SourceError, match=r"timed out after 0\.5 s"):
                get()
            assert 0.45 < time.monotonic() - started < 1.5
        state["how"] = "now"
        assert {s.target for s in DcgmSource(url + "/metrics", timeout=0.5).poll()} == {"team-a/train-0", "GPU-ccc"}


def _readyz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow  # a source slowed down and back, seconds
def test_a_dripping_source_fails_the_poll_at_the_deadline_and_the_sidecar_recovers(drip_peer) -> None:
    """A dcgm-exporter that starts answering a byte every 0.1 s: the sidecar's poll fails once http_timeout has
    passed (counted, /readyz 503 saying it timed out) instead of waiting on the answer; once the exporter answers
    at once again, the next poll succeeds and /readyz is 200 with no trace of the failure."""
    state = {"how": "now"}
    with drip_peer(lambda path: (DCGM_TEXT, state["how"]), gap=0.1, most=10.0) as url:
        sidecar = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.2,
                                        max_backoff=0.4, http_timeout=0.5, forecast_interval=0.5, step_seconds=0.5,
                                        window_seconds=30, horizons=[5], min_points=2, model="ewma"),
                          sources=[DcgmSource(url + "/metrics", timeout=0.5)], model=open_forecaster(None, "ewma"))
        sidecar.start()
        try:
            base = sidecar.server.url
            deadline = time.monotonic() + 5
            while _readyz(base)[0] != 200:
                assert time.monotonic() < deadline, _readyz(base)
                time.sleep(0.05)
            state["how"] = "body"
            slowed = time.monotonic()
            while (answer := _readyz(base))[0] == 200:
                assert time.monotonic() - slowed < 3.0, "the poll waited on the dripping answer"
                time.sleep(0.05)
            assert time.monotonic() - slowed < 0.2 + 0.5 + 1.0
            assert answer[0] == 503 and "source dcgm failing" in answer[1] and "timed out after 0.5 s" in answer[1]
            assert sidecar.pollers[0].errors_total >= 1
            state["how"] = "now"
            healthy = time.monotonic()
            while (answer := _readyz(base))[0] != 200:
                assert time.monotonic() - healthy < 3.0, answer
                time.sleep(0.05)
            assert time.monotonic() - healthy < 0.5 + 0.4 + 1.0  # the poll under way, the backoff, the next poll
            assert answer[1].startswith("ready: model") and "fail" not in answer[1] and "timed out" not in answer[1]
            assert sidecar.pollers[0].up
        finally:
            sidecar.stop()


def test_replay_without_the_data_set_replays_the_packaged_sample_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Installed from the package (no $DPROBE_DATA_DIR, no ./datasets, no checkout), the replay reads the sample
    of alibaba-genai-2026 that ships in the package and logs it; with the data set in reach, the data set."""
    from dprobe.data import registry as data_registry

    monkeypatch.delenv("DPROBE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data_registry, "CHECKOUT_DATASETS", tmp_path / "no-checkout")
    with caplog.at_level("INFO", logger="dprobe.services.sources.replay"):
        src = ReplaySource("alibaba", clock=lambda: 0.0)
    assert src.path == data_registry.SAMPLES_DIR / "alibaba-genai-2026"
    assert 3 <= len(src.trace.t) <= 20 and src.poll()
    assert "the sample in the package" in caplog.text and str(src.path) in caplog.text
    with pytest.raises(FileNotFoundError, match=r"h200-profiles not found .* set DPROBE_DATA_DIR or the replay "
                                                r"path \(--replay-path\)"):
        ReplaySource("h200")
    caplog.clear()
    monkeypatch.setenv("DPROBE_DATA_DIR", str(Path(__file__).resolve().parents[1] / "datasets"))
    with caplog.at_level("INFO", logger="dprobe.services.sources.replay"):
        src = ReplaySource("alibaba", max_targets=3, clock=lambda: 0.0)
    assert src.path.parent.name == "datasets" and len(src.trace.t) == 3
    assert "the sample in the package" not in caplog.text and "(3 targets)" in caplog.text
