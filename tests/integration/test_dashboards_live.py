"""Both Grafana dashboards on the whole chain, as a cluster runs it: dcgm-exporter and kube-state-metrics
stand-ins, the sidecar and the scaler, all scraped by one real Prometheus with dprobe's rules loaded. Every
query of both dashboards runs and answers (the kube-state-metrics ones included), and the panels that put
the real replicas beside the recommendation show the right numbers."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.service import Scaler
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.dcgm import DcgmSource

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SIDECAR_BOARD = DEPLOY / "grafana" / "dprobe-sidecar.json"
SCALER_BOARD = DEPLOY / "grafana" / "dprobe-scaler.json"
RULES = DEPLOY / "prometheus" / "dprobe-rules.yaml"
PENDING_QUERY = yaml.safe_load(yaml.safe_load((DEPLOY / "scaler" / "configmap.yaml").read_text())["data"]["scaler.yaml"])[
    "vc_pending_query"]

# (namespace, pod, GPU utilisation %) per GPU: two replicas of the Deployment llm, a training pod on two GPUs
GPUS = [("serving", "llm-7d9f8c6b5d-aaaaa", 90), ("serving", "llm-7d9f8c6b5d-bbbbb", 90),
        ("team-a", "train-0", 50), ("team-a", "train-0", 50)]


def dcgm_text() -> str:
    lines = []
    for field, value in (("DCGM_FI_DEV_GPU_UTIL", lambda u: u), ("DCGM_FI_DEV_FB_USED", lambda u: 400 * u),
                         ("DCGM_FI_DEV_FB_FREE", lambda u: 143000 - 400 * u)):
        lines.append(f"# TYPE {field} gauge")
        for gpu, (ns, pod, util) in enumerate(GPUS):
            lines.append(f'{field}{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H200",Hostname="n1",'
                         f'container="main",namespace="{ns}",pod="{pod}"}} {value(util)}')
    return "\n".join(lines) + "\n"


def kube_state_text(available: int) -> str:
    """kube-state-metrics' series: the Deployment llm (spec 2, ``available`` of them available) and its pods'
    owners, a StatefulSet, a pod of team-c waiting for 3 GPUs and one of team-a running on 2."""
    rows = [
        ("kube_deployment_spec_replicas", 'namespace="serving",deployment="llm"', 2),
        ("kube_deployment_status_replicas_available", 'namespace="serving",deployment="llm"', available),
        ("kube_statefulset_replicas", 'namespace="serving",statefulset="kv"', 3),
        ("kube_statefulset_status_replicas_ready", 'namespace="serving",statefulset="kv"', 3),
        ("kube_pod_container_resource_requests", 'namespace="team-c",pod="queued-0",container="main",'
                                                 'resource="nvidia_com_gpu",unit="integer"', 3),
        ("kube_pod_status_phase", 'namespace="team-c",pod="queued-0",phase="Pending"', 1),
        # team-a's training pod, running on 2 GPUs: where its virtual cluster's count starts
        ("kube_pod_container_resource_requests", 'namespace="team-a",pod="train-0",container="main",'
                                                 'resource="nvidia_com_gpu",unit="integer"', 2),
        ("kube_pod_status_phase", 'namespace="team-a",pod="train-0",phase="Running"', 1),
        # who owns the replicas: their ReplicaSet, and the Deployment that owns it
        *(("kube_pod_owner", f'namespace="serving",pod="llm-7d9f8c6b5d-{s}",owner_kind="ReplicaSet",'
                             'owner_name="llm-7d9f8c6b5d",owner_is_controller="true"', 1) for s in ("aaaaa", "bbbbb")),
        ("kube_replicaset_owner", 'namespace="serving",replicaset="llm-7d9f8c6b5d",owner_kind="Deployment",'
                                  'owner_name="llm",owner_is_controller="true"', 1),
    ]
    families: dict[str, list[str]] = {}
    for name, labels, value in rows:
        families.setdefault(name, []).append(f"{name}{{{labels}}} {value}\n")
    return "".join(f"# TYPE {name} gauge\n" + "".join(lines) for name, lines in families.items())


def _panel(board: Path, title_part: str) -> dict:
    [panel] = [p for p in json.loads(board.read_text())["panels"] if title_part in p["title"]]
    return panel


def _expr(target: dict, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], target["expr"])


def _wait(prom, query: str, until=bool, timeout: float = 40) -> list[dict]:
    deadline = time.time() + timeout
    while not until(rows := prom.query(query)):
        assert time.time() < deadline, f"no answer as expected to {query}: {rows}"
        time.sleep(0.5)
    return rows


def test_both_dashboards_answer_on_the_whole_chain(prometheus_server, http_peer, free_port, check_dashboard) -> None:
    ksm = {"available": 2}
    with http_peer(lambda path: (200, dcgm_text(), 0.0)) as dcgm_url, \
            http_peer(lambda path: (200, kube_state_text(ksm["available"]), 0.0)) as ksm_url:
        sidecar = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.1,
                                        forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[5],
                                        min_points=4, stale_after=120, drop_after=300, model="ewma",
                                        jobs={"team-a/train-*": "torchvision:resnet18 batch=8 precision=bf16"}),
                          sources=[DcgmSource(dcgm_url + "/metrics", targets="pod")],
                          model=open_forecaster(None, "ewma"))
        sidecar.start()
        scaler = None
        scaler_port = free_port()
        try:
            scraped = [u.removeprefix("http://") for u in (dcgm_url, ksm_url)] + [
                f"127.0.0.1:{sidecar.server.port}", f"127.0.0.1:{scaler_port}"]
            # every target scraped with honor_labels, as the PodMonitors in deploy/ and kube-prometheus-stack's
            # kube-state-metrics ServiceMonitor do
            with prometheus_server(scraped, honor_labels=True, rule_files=[RULES]) as prom:
                scaler = Scaler(ScalerConfig(
                    prometheus_url=str(prom), listen_address="127.0.0.1", port=scaler_port, interval=0.5,
                    horizon_seconds=5, target=0.5, margin=0.0, vc_pending_query=PENDING_QUERY,
                    sharing_enabled=True, sharing_mode="mig", sharing_gpu_model="H200-141GB", workloads=[
                        {"namespace": "serving", "name": "llm", "max_replicas": 8, "min_replicas": 0,
                         "activation_query": 'sum(DCGM_FI_DEV_GPU_UTIL{namespace="serving"})',
                         "activation_query_threshold": 10}]))
                scaler.start()
                # two replicas at 90 %, 0.5 each: ceil(1.8 / 0.5) = 4 recommended, 2 running
                _wait(prom, 'dprobe_recommended_replicas{workload="llm"} == 4')
                # GPU shares (MIG on the H200s): each llm replica is forecast at 90 % utilisation, so its profile
                # needs all 7 compute slices; the training pod holds two GPUs and keeps them: no GPU saved
                for query in ('dprobe_recommended_gpus{vc="serving",sharing="none"} == 2',
                              'dprobe_recommended_gpus{vc="serving",sharing="shared"} == 2',
                              'dprobe_recommended_gpus{vc="team-a",sharing="shared"} == 2',
                              'dprobe_recommended_mig_profile_info{workload="llm",profile="7g.141gb"}',
                              'dprobe_scaler_unplaced_pods{namespace="team-a",reason="multi_gpu"} == 1',
                              'dprobe_recommended_gpu_memory_bytes{workload="llm"} > 1.15 * 36000 * 1048576 * 0.99',
                              'dprobe_scaler_gpu_memory_share_bytes{workload="llm"} == 141e9'):
                    _wait(prom, query)
                assert not prom.query('ALERTS{alertname="DprobeOOMAhead"}')
                scaler_values = {"namespace": "serving", "workload": ".*", "vc": "team-a", "__rate_interval": "1m"}
                replicas = _panel(SCALER_BOARD, "Replicas:")
                got = {}
                for target in replicas["targets"]:
                    for row in _wait(prom, _expr(target, scaler_values)):
                        m = row["metric"]
                        got[(m.get("workload") or m.get("deployment") or m.get("statefulset"),
                             target["legendFormat"].rsplit(" ", 1)[-1])] = float(row["value"][1])
                assert got == {("llm", "recommended"): 4, ("llm", "alone"): 4, ("llm", "spec"): 2,
                               ("llm", "available"): 2, ("kv", "spec"): 3, ("kv", "ready"): 3}
                # demand and capacity in one unit: replicas' worth of GPU at 100 %
                demand = _panel(SCALER_BOARD, "demand against capacity")
                rows = [_wait(prom, _expr(t, scaler_values)) for t in demand["targets"]]
                assert [sorted(float(r["value"][1]) for r in rs) for rs in rows] == [
                    [pytest.approx(1.8)], [4.0], [2.0, 3.0]]
                # per replica: 1.8 over the 2 available (0.9, above the 0.5 target) and over the 4 recommended
                per_replica = _panel(SCALER_BOARD, "per replica")
                on_running, on_recommended = (_wait(prom, _expr(t, scaler_values)) for t in per_replica["targets"])
                assert [r["metric"]["workload"] for r in on_running] == ["llm"]
                assert float(on_running[0]["value"][1]) == pytest.approx(0.9)
                assert float(on_recommended[0]["value"][1]) == pytest.approx(0.45)
                # one replica fewer available (kube-state-metrics): the per-replica load follows the real count
                ksm["available"] = 1
                _wait(prom, _expr(per_replica["targets"][0], scaler_values),
                      until=lambda rs: rs and float(rs[0]["value"][1]) == pytest.approx(1.8))

                check_dashboard(prom, SCALER_BOARD, {"namespace": "serving", "workload": ".*", "vc": "team-a"})
                check_dashboard(prom, SIDECAR_BOARD, {"namespace": ".*", "pod": "train-0", "horizon": "5"})
                # the bands: p50 <= p90 <= p99 for the pod, each from the forecast made 5 s before
                band = _panel(SIDECAR_BOARD, "GPU memory: observed")
                sidecar_values = {"namespace": ".*", "pod": "train-0", "horizon": "5"}
                levels = [float(_wait(prom, _expr(t, sidecar_values))[0]["value"][1]) for t in band["targets"][1:]]
                assert levels == sorted(levels) and levels[0] > 0
        finally:
            if scaler is not None:
                scaler.stop()
            sidecar.stop()
