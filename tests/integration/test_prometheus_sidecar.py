"""The sidecar in replay mode, scraped by a real Prometheus: the stored forecasts are the model's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from dprobe.core.names import SIDECAR_METRICS as METRICS
from dprobe.forecaster.base import ForecastInput
from dprobe.forecaster.baselines import make_baseline
from dprobe.forecaster.loading import open_forecaster
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.dcgm import DcgmSource
from dprobe.services.sources.replay import ReplaySource

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test


def trace_rows() -> dict[str, list[tuple[float, float, float]]]:
    """Three pods with different, changing memory and duty cycle: pod -> [(t, duty %, bytes)]."""
    rng = np.random.default_rng(0)
    return {pod: [(57.0 * i, round((20 * p + 30 * np.sin(i / 7) + 40) % 100, 3),
                   (p + 1) * 2**30 + int(rng.integers(0, 2**28))) for i in range(400)]
            for p, pod in enumerate(("pod-a", "pod-b", "pod-c"))}


def test_prometheus_scrapes_the_forecasts(prometheus_server, alibaba_layout, tmp_path: Path) -> None:
    config = SidecarConfig(listen_address="127.0.0.1", port=0, source="replay", sample_interval=0.1,
                           forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[2, 5, 10],
                           min_points=4, stale_after=120, drop_after=300, model="ewma")
    source = ReplaySource("alibaba", alibaba_layout(tmp_path / "trace", trace_rows()), speed=57 * 4)
    sidecar = Sidecar(config, sources=[source], model=open_forecaster(None, "ewma"))
    sidecar.start()
    try:
        # scraped as the PodMonitor in deploy/ does: Kubernetes attaches the scraped pod's own labels to the
        # target, and honor_labels keeps the labels the sidecar gives each forecast
        with prometheus_server([f"127.0.0.1:{sidecar.server.port}"], honor_labels=True,
                               target_labels={"namespace": "gpu-operator", "pod": "dprobe-node-agent-x"}) as prom:
            deadline = time.time() + 40
            while len(prom.query("dprobe_predicted_gpu_memory_bytes")) < 3 * 3 * 3:
                assert time.time() < deadline, "Prometheus never stored the predicted series"
                time.sleep(0.5)
            # freeze: stop sampling and the forecast loop, forecast once more, keep serving that
            sidecar.stop_event.set()
            for t in sidecar._threads:
                t.join(5)
            snap = sidecar.engine.cycle()
            time.sleep(2.5)  # at least two scrapes of the frozen state

            windows = sidecar.store.windows(list(snap.targets))
            for metric in METRICS:
                name = f"dprobe_{'predicted_' + metric}"
                result = prom.query(name)
                assert len(result) == len(snap.targets) * 3 * 3
                got = {}
                for r in result:
                    labels = r["metric"]
                    # the replayed pods have a pod label and no namespace (empty labels are not stored)
                    assert set(labels) == {"__name__", "target", "pod", "horizon_seconds", "quantile",
                                           "instance", "job"}
                    assert labels["pod"] == labels["target"]
                    got[(labels["target"], labels["horizon_seconds"], labels["quantile"])] = float(r["value"][1])
                assert {k[0] for k in got} == {"pod-a", "pod-b", "pod-c"}
                # what the model produces for the replayed window, computed here independently
                fc = make_baseline("ewma").predict(ForecastInput(
                    values=windows[metric], metric=metric, leads=(4, 10, 20), step_seconds=0.5))
                lo, hi = (0.0, 1.0) if "utilization" in metric else (0.0, np.inf)
                expected = np.sort(np.clip(fc.quantiles, lo, hi), axis=-1)
                for i, target in enumerate(snap.targets):
                    for j, h in enumerate(("2", "5", "10")):
                        for k, q in enumerate(("0.5", "0.9", "0.99")):
                            assert got[(target, h, q)] == pytest.approx(expected[i, j, k], rel=1e-9)
            observed = prom.query("dprobe_observed_gpu_utilization_ratio")
            assert {r["metric"]["target"] for r in observed} == {"pod-a", "pod-b", "pod-c"}
            # joins on the identity labels work as with dcgm-exporter's series
            headroom = prom.query('dprobe_predicted_gpu_memory_bytes{horizon_seconds="5",quantile="0.9"}'
                                  " - on(namespace, pod) dprobe_observed_gpu_memory_bytes")
            assert {r["metric"]["pod"] for r in headroom} == {"pod-a", "pod-b", "pod-c"}
            assert all(0.0 <= float(r["value"][1]) <= 1.0 for r in observed)
            info = prom.query("dprobe_model_info")
            assert info[0]["metric"]["kind"] == "baseline:ewma"
            hist = prom.query("dprobe_forecast_seconds_count")
            assert float(hist[0]["value"][1]) >= 1
    finally:
        sidecar.stop()


RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "dprobe-rules.yaml"
DASHBOARD = RULES.parents[1] / "grafana" / "dprobe-sidecar.json"


def dcgm_text(step: int) -> str:
    """dcgm-exporter's /metrics on a node with one pod on two GPUs and an unassigned GPU, changing a little."""
    lines = []
    for field, values in (("DCGM_FI_DEV_FB_USED", (1000 + 10 * (step % 7), 3000, 0)),
                          ("DCGM_FI_DEV_FB_FREE", (142000 - 10 * (step % 7), 140000, 143000)),
                          ("DCGM_FI_DEV_GPU_UTIL", (80 - step % 5, 40, 0))):
        lines.append(f"# TYPE {field} gauge")
        for gpu, (uuid, pod) in enumerate((("GPU-aaa", "train-0"), ("GPU-bbb", "train-0"), ("GPU-ccc", ""))):
            ns, container = ("team-a", "trainer") if pod else ("", "")
            lines.append(f'{field}{{gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA H200",Hostname="n1",'
                         f'container="{container}",namespace="{ns}",pod="{pod}"}} {values[gpu]}')
    return "\n".join(lines) + "\n"


def test_forecasts_join_dcgm_exporter_series(prometheus_server, http_peer, check_dashboard) -> None:
    """Fed by dcgm-exporter and scraped beside it, the forecasts join its series on(namespace, pod) and
    on(UUID), with the query docs/sidecar.md gives."""
    polls = iter(range(10**6))
    with http_peer(lambda path: (200, dcgm_text(next(polls)), 0.0)) as dcgm_url:
        config = SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.1,
                               forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[5],
                               min_points=4, stale_after=120, drop_after=300, model="ewma",
                               jobs={"team-a/train-*": "torchvision:resnet18 batch=8 precision=bf16"})
        sidecar = Sidecar(config, sources=[DcgmSource(dcgm_url + "/metrics", targets="pod")],
                          model=open_forecaster(None, "ewma"))
        sidecar.start()
        try:
            scraped = [dcgm_url.removeprefix("http://"), f"127.0.0.1:{sidecar.server.port}"]
            with prometheus_server(scraped, honor_labels=True, rule_files=[RULES],
                                   target_labels={"namespace": "monitoring", "pod": "dprobe-node-x"}) as prom:
                query = ('dprobe_predicted_gpu_memory_bytes{horizon_seconds="5",quantile="0.9"}'
                         " - on(namespace, pod) group_left sum by (namespace, pod) (DCGM_FI_DEV_FB_USED * 1048576)")
                deadline = time.time() + 40
                while "team-a/train-0" not in (joined := {r["metric"]["target"]: r for r in prom.query(query)}):
                    assert time.time() < deadline, "the forecasts never joined dcgm-exporter's series"
                    time.sleep(0.5)
                row = joined.pop("team-a/train-0")
                assert (row["metric"]["namespace"], row["metric"]["pod"]) == ("team-a", "train-0")
                # the unassigned GPU has no pod: its series say so (pod=""), so it does not take the scraped
                # pod's labels either, and joins only dcgm-exporter's series without a pod
                assert [(r["metric"]["UUID"], "pod" in r["metric"]) for r in joined.values()] == [("GPU-ccc", False)]
                # the p90 of the pod's memory (both GPUs, 4,000-4,060 MiB) against what it holds now: close
                assert abs(float(row["value"][1])) < 100 * 2**20
                labels = prom.query('dprobe_observed_gpu_memory_bytes{target="team-a/train-0"}')[0]["metric"]
                assert (labels["container"], labels["gpu"], labels["UUID"]) == ("trainer", "0,1", "GPU-aaa,GPU-bbb")
                # the unassigned GPU is a target of its own, joined by UUID
                gpu = prom.query("dprobe_observed_gpu_utilization_ratio * 100 - on(UUID) DCGM_FI_DEV_GPU_UTIL")
                assert [(r["metric"]["UUID"], float(r["value"][1])) for r in gpu] == [("GPU-ccc", 0.0)]
                check_dashboard(prom, DASHBOARD, {"namespace": ".*", "pod": "train-0", "horizon": "5"})
                # the training job's cold-start profile against the pod's GPUs (143,000 MiB each): it fits
                [room] = prom.query('dprobe:gpu_memory_per_gpu_bytes:by_pod - on(namespace, pod) '
                                    'max by (namespace, pod) (dprobe_job_predicted_gpu_memory_bytes{quantile="0.9"})')
                assert room["metric"]["pod"] == "train-0" and 0 < float(room["value"][1]) < 143000 * 2**20
                assert not prom.query('ALERTS{alertname="DprobeJobExceedsGPUMemory"}')
                # the KEDA example's query: tests/integration/test_keda_queries.py
        finally:
            sidecar.stop()
