"""Forecasts -> Prometheus -> scaler with sharing -> Prometheus: GPU shares, the packing plan per virtual cluster
and the DprobeOOMAhead alert (dprobe's rules loaded), on a real Prometheus."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.demand import previous_recommendations
from dprobe.services.scaler.service import Scaler
from dprobe.services.scaler.sharing import previous_limits

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "dprobe-rules.yaml"

# namespace serving, one GPU each: (pod, p99 memory forecast in GB or None, p90 utilisation, GPU memory it sees in GB)
PODS = [("emb-5f6d7c8b9a-aaaaa", 15, 0.2, 80), ("emb-5f6d7c8b9a-bbbbb", 15, 0.2, 80),
        ("emb-5f6d7c8b9a-ccccc", 15, 0.2, 80), ("llm-7d9f8c6b5d-aaaaa", 30, 0.3, 80),
        ("small-6c7d8e9f0a-aaaaa", 30, 0.3, 20),  # on a 20 GB MIG instance: its forecast does not fit
        ("train-0", None, 0.5, 80)]  # no memory forecast, in no workload (no Deployment-like name)


def sidecar_text(pods: list[tuple[str, float | None, float, float]]) -> str:
    """What sidecars, dcgm-exporter and kube-state-metrics would export for ``pods`` (memory forecasts at 60, 300
    and 900 s; each pod running, with a GPU)."""
    lines = []
    for pod, memory, util, total in pods:
        ident = f'target="serving/{pod}",namespace="serving",pod="{pod}"'
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",namespace="serving",pod="{pod}"}} {util * 100}')
        lines.append(f'kube_pod_container_resource_requests{{namespace="serving",pod="{pod}",container="main",'
                     f'resource="nvidia_com_gpu",unit="integer"}} 1')
        lines.append(f'kube_pod_status_phase{{namespace="serving",pod="{pod}",phase="Running"}} 1')
        lines.append(f'dprobe_predicted_gpu_utilization_ratio{{{ident},horizon_seconds="300",quantile="0.9"}} {util}')
        lines.append(f"dprobe_observed_gpu_memory_total_bytes{{{ident}}} {total * 1e9}")
        if memory is not None:
            for horizon, scale in (("60", 0.9), ("300", 1.0), ("900", 2.0)):  # 900 s: beyond the scaler's 300 s
                lines.append(f'dprobe_predicted_gpu_memory_bytes{{{ident},horizon_seconds="{horizon}",'
                             f'quantile="0.99"}} {memory * scale * 1e9}')
    return "\n".join(lines) + "\n"


def _wait(prom, query: str, timeout: float = 40) -> list[dict]:
    deadline = time.time() + timeout
    while not (rows := prom.query(query)):
        assert time.time() < deadline, f"no answer to {query}"
        time.sleep(0.5)
    return rows


def _value(prom, query: str) -> float:
    return float(_wait(prom, query)[0]["value"][1])


def test_scaler_recommends_shares_and_warns_of_an_oom_ahead(prometheus_server, http_peer, free_port) -> None:
    state = {"pods": list(PODS)}
    with http_peer(lambda path: (200, sidecar_text(state["pods"]), 0.0)) as sidecars:
        port = free_port()
        with prometheus_server([sidecars.removeprefix("http://"), f"127.0.0.1:{port}"], honor_labels=True,
                               rule_files=[RULES]) as prom:
            scaler = Scaler(ScalerConfig(
                prometheus_url=str(prom), listen_address="127.0.0.1", port=port, interval=0.5, restore_seconds=0,
                replicas_query="", owners_query="", scale_down_stabilization_seconds=0, sharing_enabled=True,
                sharing_gpu_model="H100-80GB",
                sharing_stabilization_seconds=3600))
            scaler.start()
            try:
                # six pods on six GPUs; packed (34.5 GB for llm and small, 17.25 GB for each emb replica):
                # llm + small on one GPU, the three emb replicas on another, train-0 keeps its own
                assert _value(prom, 'dprobe_recommended_gpus{vc="serving",sharing="none"}') == 6
                assert _value(prom, 'dprobe_recommended_gpus{vc="serving",sharing="shared"}') == 3
                assert _value(prom, 'dprobe_recommended_gpu_memory_bytes{workload="emb"}') == pytest.approx(17.25e9)
                assert _value(prom, 'dprobe_recommended_gpu_fraction{workload="emb"}') == pytest.approx(0.22)
                assert _value(prom, 'dprobe_scaler_unplaced_pods{workload="",reason="no_memory_forecast"}') == 1  # train-0
                plan = _wait(prom, "dprobe_colocation_plan_pods")
                assert sorted((r["metric"]["workload"], float(r["value"][1])) for r in plan) == [
                    ("emb", 3.0), ("llm", 1.0), ("small", 1.0)]
                assert len({r["metric"]["gpu"] for r in plan if r["metric"]["workload"] != "emb"}) == 1
                # the count without sharing, as before: 1.7 GPUs of forecast utilisation at target 0.8 and margin 0.1;
                # a restarted scaler reads it back (not the 6 of sharing="none"), and the memory limits
                unshared = _value(prom, 'dprobe_recommended_gpus{vc="serving",sharing=""} == 3')  # ceil(1.7 * 1.1 / 0.8)
                config = ScalerConfig(prometheus_url=str(prom))
                assert previous_recommendations(config.queries)[1]["serving"] == unshared < 6
                assert previous_limits(config.queries)[("serving", "emb")] == pytest.approx(17.25e9)
                # small's forecast (30 GB) above what its MIG instance gives it (20 GB): an OOM ahead, only there
                alerts = _wait(prom, 'ALERTS{alertname="DprobeOOMAhead"}')
                assert {(a["metric"]["workload"], a["metric"]["alertstate"]) for a in alerts} <= {
                    ("small", "pending"), ("small", "firing")}
                # llm's sidecar stops forecasting memory: its limit is held and its pod keeps a GPU of its own
                state["pods"] = [(p, None if p.startswith("llm") else m, u, t) for p, m, u, t in PODS]
                _wait(prom, 'dprobe_scaler_unplaced_pods{workload="llm",reason="no_memory_forecast"} == 1')
                assert _value(prom, 'dprobe_recommended_gpu_memory_bytes{workload="llm"}') == pytest.approx(34.5e9)
                # small and the three emb replicas (86.25 GB) no longer fit one GPU: one more GPU, never fewer
                assert _value(prom, 'dprobe_recommended_gpus{vc="serving",sharing="shared"}') == 4
            finally:
                scaler.stop()
