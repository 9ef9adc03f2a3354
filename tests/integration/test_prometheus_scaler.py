"""dcgm-exporter -> sidecar -> Prometheus -> scaler -> Prometheus: recommendations from real forecasts."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
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
KEDA = DEPLOY / "keda" / "scaledobject-scaler.yaml"
CONFIGMAP = DEPLOY / "scaler" / "configmap.yaml"
SCALER_DEPLOYMENT = DEPLOY / "scaler" / "deployment.yaml"

# (namespace, pod, GPU utilisation %) per GPU: two replicas of a Deployment, a training pod on two GPUs
GPUS = [("serving", "llm-7d9f8c6b5d-aaaaa", 90), ("serving", "llm-7d9f8c6b5d-bbbbb", 90),
        ("team-a", "train-0", 50), ("team-a", "train-0", 50)]


def dcgm_text() -> str:
    lines = []
    for field, value in (("DCGM_FI_DEV_GPU_UTIL", lambda u: u), ("DCGM_FI_DEV_FB_USED", lambda u: 40 * u)):
        lines.append(f"# TYPE {field} gauge")
        for gpu, (ns, pod, util) in enumerate(GPUS):
            lines.append(f'{field}{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H200",Hostname="n1",'
                         f'container="main",namespace="{ns}",pod="{pod}"}} {value(util)}')
    return "\n".join(lines) + "\n" + KUBE_STATE


# kube-state-metrics' series of three pods: one running in team-a, a new one in team-b (no samples yet), one of
# team-c not scheduled (no sidecar yet); and
# the replicas of serving's Deployments (where their counts start: the scaler takes none from the pods it sees)
KUBE_STATE = "".join(
    f'kube_pod_container_resource_requests{{namespace="{ns}",pod="{pod}",container="main",node="n1",'
    f'resource="nvidia_com_gpu",unit="integer"}} {gpus}\n'
    + "".join(f'kube_pod_status_phase{{namespace="{ns}",pod="{pod}",phase="{phase}"}} {int(phase == now)}\n'
              for phase in ("Pending", "Running"))
    for ns, pod, gpus, now in (("team-a", "train-0", 2, "Running"), ("team-b", "trainer-new-0", 1, "Running"),
                               ("team-c", "queued-0", 3, "Pending"))) + (
    'kube_deployment_spec_replicas{namespace="serving",deployment="llm"} 2\n'
    'kube_deployment_spec_replicas{namespace="serving",deployment="idle"} 0\n')


# the deployed scaler's query of the GPUs waiting per virtual cluster
PENDING_QUERY = yaml.safe_load(yaml.safe_load(CONFIGMAP.read_text())["data"]["scaler.yaml"])["vc_pending_query"]


def _value(prom, query: str, deadline: float) -> float:
    while not (rows := prom.query(query)):
        assert time.time() < deadline, f"no answer to {query}"
        time.sleep(0.5)
    return float(rows[0]["value"][1])


def test_scaler_recommends_from_the_sidecars_forecasts(prometheus_server, http_peer) -> None:
    with http_peer(lambda path: (200, dcgm_text(), 0.0)) as dcgm_url:
        sidecar = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.1,
                                        forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[5],
                                        min_points=4, stale_after=120, drop_after=300, model="ewma",
                                        # a training pod without samples yet: only its job's cold-start profile
                                        pod_name="team-b/trainer-new-0", job="torchvision:resnet18 batch=8"),
                          sources=[DcgmSource(dcgm_url + "/metrics", targets="pod")],
                          model=open_forecaster(None, "ewma"))
        sidecar.start()
        scaler = None
        try:
            with prometheus_server([dcgm_url.removeprefix("http://"), f"127.0.0.1:{sidecar.server.port}"],
                                   honor_labels=True) as prom:
                scaler = Scaler(ScalerConfig(
                    prometheus_url=str(prom), listen_address="127.0.0.1", port=0, interval=0.5, horizon_seconds=5,
                    target=0.5, margin=0.0, vc_pending_query=PENDING_QUERY, workloads=[
                        # may rest at zero; woken (and kept up) while its GPUs report any utilisation
                        {"namespace": "serving", "name": "llm", "max_replicas": 8, "min_replicas": 0,
                         "activation_query": 'sum(DCGM_FI_DEV_GPU_UTIL{namespace="serving"})',
                         "activation_query_threshold": 10},
                        {"namespace": "serving", "name": "idle", "min_replicas": 0,
                         "activation_query": 'sum(DCGM_FI_DEV_GPU_UTIL{namespace="nobody"})'}]))
                scaler.start()
                deadline = time.time() + 40
                while not (scaler.decisions.get(("serving", "llm")) and scaler.decisions[("serving", "llm")].demand):
                    assert time.time() < deadline, "the scaler never saw the forecasts"
                    time.sleep(0.2)
                # a second Prometheus scrapes the scaler, as the Prometheus Operator does through the scaler's
                # PodMonitor for Grafana and KEDA: the target carries the scaler pod's own namespace
                [monitor] = [d for d in yaml.safe_load_all(SCALER_DEPLOYMENT.read_text()) if d["kind"] == "PodMonitor"]
                with prometheus_server([f"127.0.0.1:{scaler.server.port}"],
                                       honor_labels=monitor["spec"]["podMetricsEndpoints"][0].get("honorLabels", False),
                                       target_labels={"namespace": "monitoring", "pod": "dprobe-scaler-0"}) as prom2:
                    deadline = time.time() + 30
                    # two replicas at 90 %, 0.5 each: ceil(1.8 / 0.5) = 4 replicas
                    assert _value(prom2, 'dprobe_recommended_replicas{namespace="serving",workload="llm"}',
                                  deadline) == 4
                    assert _value(prom2, 'dprobe_scaler_demand_ratio{workload="llm"}', deadline) == pytest.approx(1.8)
                    # the activation queries, answered by the real Prometheus: 180 % summed is active; no series
                    # is 0, inactive, and the workload without pods rests at zero without a fallback
                    assert _value(prom2, 'dprobe_scaler_activation_query_value{workload="llm"}', deadline) == 180
                    assert _value(prom2, 'dprobe_scaler_active{workload="llm"}', deadline) == 1
                    assert _value(prom2, 'dprobe_scaler_active{workload="idle"}', deadline) == 0
                    assert _value(prom2, 'dprobe_recommended_replicas{workload="idle"}', deadline) == 0
                    # the training pod's two GPUs at 50 %: 1 GPU of demand, 2 GPUs at 0.5 each, what it holds
                    assert _value(prom2, 'dprobe_recommended_gpus{vc="team-a"}', deadline) == 2
                    assert _value(prom2, 'dprobe_scaler_vc_held_gpus{vc="team-a"}', deadline) == 2
                    assert _value(prom2, 'dprobe_recommended_gpus{vc="serving"}', deadline) == 4
                    # the new training pod counts at its job's p90 cold-start utilisation, on one GPU
                    profile = _value(prom, 'dprobe_job_predicted_gpu_utilization_ratio{quantile="0.9"}', deadline)
                    assert _value(prom2, 'dprobe_scaler_vc_demand_gpus{vc="team-b"}', deadline) == pytest.approx(profile)
                    # ceil(demand / 0.5) GPUs, or the one GPU it holds where demand / capacity is within the
                    # default tolerance (0.1) of 1, as the HPA does
                    held_ratio = profile / 0.5
                    expected = 1 if abs(held_ratio - 1) <= 0.1 else -(-profile // 0.5)
                    assert _value(prom2, 'dprobe_recommended_gpus{vc="team-b"}', deadline) == expected
                    # the GPUs of a pod not scheduled yet, from kube-state-metrics through the real Prometheus
                    assert _value(prom2, 'dprobe_scaler_vc_pending_gpus{vc="team-c"}', deadline) == 3
                    assert _value(prom2, 'dprobe_scaler_vc_demand_gpus{vc="team-c"}', deadline) == 3
                    assert _value(prom2, 'dprobe_scaler_vc_pending_gpus{vc="team-a"} or vector(0)', deadline) == 0
                    # no failed query or decision; a first cycle that ran before Prometheus had scraped the
                    # sidecar counts stage="no_data" and holds, as it should (docs/faults.md)
                    assert _value(prom2, 'sum(dprobe_scaler_errors_total{stage!="no_data"}) or vector(0)',
                                  deadline) == 0
                    # the dashboard (which also reads kube-state-metrics, not scraped here): every query
                    # answers in tests/integration/test_dashboards_live.py
                    # the KEDA example's query, pointed at this workload: the replicas KEDA would set
                    trigger = yaml.safe_load(KEDA.read_text())["spec"]["triggers"][0]["metadata"]
                    assert trigger["threshold"] == "1"
                    query = trigger["query"].replace('workload="llm-server"', 'workload="llm"')
                    assert _value(prom2, query, deadline) == 4
        finally:
            if scaler is not None:
                scaler.stop()
            sidecar.stop()


def test_stopped_sidecars_never_lower_a_count_on_the_real_chain(prometheus_server, http_peer) -> None:
    """The chain of the fault report: the sidecar stops, Prometheus marks its series stale and answers the
    forecast query with nothing. The scaler counts that as an error, /readyz says not ready, and the count
    is held (then the fallback, max(current, fallback_replicas)): never 11 -> 2."""
    pods = [f"llm-7d9f8c6b5d-{c * 5}" for c in "abcdefghijk"]  # 11 replicas, busy
    text = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",namespace="serving",pod="{p}"}} 70\n'
        for i, p in enumerate(pods)) + "# TYPE DCGM_FI_DEV_FB_USED gauge\n" + "".join(
        f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i}",namespace="serving",pod="{p}"}} 1000\n'
        for i, p in enumerate(pods)) + 'kube_deployment_spec_replicas{namespace="serving",deployment="llm"} 11\n'
    # (kube-state-metrics' replicas, served beside and scraped: where the count starts)
    with http_peer(lambda path: (200, text, 0.0)) as dcgm_url:
        sidecar = Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.1,
                                        forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[5],
                                        min_points=4, stale_after=120, drop_after=300, model="last_value"),
                          sources=[DcgmSource(dcgm_url + "/metrics", targets="pod")], model=open_forecaster(None, "last_value"))
        sidecar.start()
        scaler = None
        try:
            with prometheus_server([f"127.0.0.1:{sidecar.server.port}", dcgm_url.removeprefix("http://")],
                                   honor_labels=True) as prom:
                scaler = Scaler(ScalerConfig(
                    prometheus_url=str(prom), listen_address="127.0.0.1", port=0, interval=0.5, horizon_seconds=5,
                    target=0.7, margin=0.0, fallback_replicas=2, failure_threshold=2, gpus_query="",
                    scale_up_policies=[{"type": "percent", "value": 1000}],
                    workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]))
                scaler.start()
                deadline = time.time() + 40
                while not ((d := scaler.decisions.get(("serving", "llm"))) and d.demand and d.replicas == 11):
                    assert time.time() < deadline, f"the scaler never reached 11 replicas: {d}"
                    time.sleep(0.2)
                assert scaler.ready()[0]
                before = scaler.errors_total["no_data"]  # (counted at the start too, before the first forecasts)
                sidecar.stop()
                deadline = time.time() + 30
                while scaler.errors_total["no_data"] < before + 3:
                    assert time.time() < deadline, "the empty answers were never counted"
                    time.sleep(0.2)
                time.sleep(3)  # several cycles past failure_threshold
                d = scaler.decisions[("serving", "llm")]
                assert d.replicas == 11 and d.reason in ("fallback", "no forecast: holding")
                url = f"http://127.0.0.1:{scaler.server.port}"
                with pytest.raises(urllib.error.HTTPError) as err:
                    urllib.request.urlopen(url + "/readyz", timeout=5)
                assert err.value.code == 503 and b"no usable forecast" in err.value.read()
                metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
                assert 'dprobe_recommended_replicas{namespace="serving",workload="llm"} 11.0' in metrics
        finally:
            if scaler is not None:
                scaler.stop()
            sidecar.stop()



def test_a_scaler_started_while_prometheus_is_down_never_publishes_the_fallback_over_the_kept_count(
        prometheus_server, http_peer) -> None:
    """The last run recommended 11 replicas (Prometheus kept its series; that scaler is gone). A new scaler
    starts while Prometheus cannot be reached (a proxy answering 503), with fallback_replicas 2: the KEDA query
    on a second Prometheus scraping it answers nothing (KEDA holds 11), never 2; once Prometheus answers, the
    scaler reads the 11 back (last_over_time on the real server) and, with no forecast, the fallback publishes
    max(11, 2) = 11."""
    old = ('dprobe_recommended_replicas{namespace="serving",workload="llm"} 11\n'
           'dprobe_recommended_gpus{vc="serving"} 11\n')
    up = [False]
    prom = ""

    def proxy(path: str) -> tuple[int, str, float]:
        if not up[0]:
            return 503, "no endpoints available for service prometheus-operated", 0.0
        try:
            with urllib.request.urlopen(prom + path, timeout=5) as r:
                return r.status, r.read().decode(), 0.0
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), 0.0

    old_scaler = http_peer(lambda path: (200, old, 0.0))
    old_url = old_scaler.__enter__()
    scaler = None
    try:
        with prometheus_server([old_url.removeprefix("http://")], honor_labels=True) as kept, \
                http_peer(proxy) as proxied:
            prom = str(kept)
            assert _value(kept, 'dprobe_recommended_replicas{workload="llm"}', time.time() + 30) == 11
            old_scaler.__exit__(None, None, None)  # the last run's scaler is gone
            old_scaler = None
            scaler = Scaler(ScalerConfig(prometheus_url=proxied, listen_address="127.0.0.1", port=0, interval=0.2,
                                         horizon_seconds=5, target=0.5, fallback_replicas=2, failure_threshold=2,
                                         workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}]))
            scaler.start()
            trigger = yaml.safe_load(KEDA.read_text())["spec"]["triggers"][0]["metadata"]
            query = trigger["query"].replace('workload="llm-server"', 'workload="llm"')
            with prometheus_server([f"127.0.0.1:{scaler.server.port}"], honor_labels=True) as keda_reads:
                assert _value(keda_reads, "up", time.time() + 30) == 1  # it scrapes the scaler
                seen = []
                deadline = time.time() + 3  # 15 cycles more while Prometheus is down: past failure_threshold
                while time.time() < deadline:
                    seen += [float(r["value"][1]) for r in keda_reads.query(query)]
                    time.sleep(0.2)
                assert scaler.errors_total["query"] >= 10
                assert seen == [] and not scaler.ready()[0]  # KEDA: an error, its own fallback holds 11
                up[0] = True
                deadline = time.time() + 30
                while not (rows := keda_reads.query(query)):
                    assert time.time() < deadline, "the scaler never published the count it kept"
                    time.sleep(0.2)
                assert float(rows[0]["value"][1]) == 11
                d = scaler.decisions[("serving", "llm")]
                assert (d.current, d.replicas) == (11, 11) and d.reason.startswith("fallback")
    finally:
        if old_scaler is not None:
            old_scaler.__exit__(None, None, None)
        if scaler is not None:
            scaler.stop()
