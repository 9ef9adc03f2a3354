"""The KEDA examples (deploy/keda) against a real Prometheus, read as KEDA's Prometheus scaler reads them:
no answer is an error (so KEDA's fallback holds the count) when the producer stops or a replica has no
forecast, never 0; the replicas are the Deployment's ready pods by owner, never a lookalike by name; the
series keep their own namespace under operator-style target labels; two sidecars exporting the same pod do
not double the sum, and the dashboard's coverage panel still answers."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dprobe.forecaster.loading import open_forecaster
from dprobe.services.sidecar.config import SidecarConfig
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources.dcgm import DcgmSource

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# what Kubernetes service discovery attaches to a target: the scraped pod's own namespace and name
OPERATOR_TARGET_LABELS = {"namespace": "monitoring", "pod": "dprobe-7f8d9c-xkz2p", "container": "dprobe"}


class KedaError(RuntimeError):
    """What KEDA's Prometheus scaler returns as an error: counted towards the ScaledObject's fallback."""


def keda_reads(prom, metadata: dict[str, str]) -> float:
    """The value KEDA's Prometheus scaler takes from ``metadata`` (a trigger's) now, by its rules
    (pkg/scalers/prometheus_scaler.go): one element's value; no element, or NaN / ±Inf, is 0 when
    ``ignoreNullValues`` is true (its default) and an error when it is false; several elements are an
    error."""
    rows = prom.query(metadata["query"])
    ignore_null = metadata.get("ignoreNullValues", "true").strip().lower() in ("true", "1", "t")
    if len(rows) > 1:
        raise KedaError(f"prometheus query {metadata['query']} returned multiple elements")
    value = float(rows[0]["value"][1]) if rows else math.nan
    if not math.isfinite(value):
        if ignore_null:
            return 0.0
        raise KedaError("the result is empty" if not rows else f"prometheus query returns {value}")
    return value


def wait_for(check: Callable[[], object], what: str, timeout: float = 20.0) -> object:
    """``check()``'s first truthy answer, retried every 0.25 s for up to ``timeout`` s."""
    deadline = time.time() + timeout
    while not (answer := check()):
        assert time.time() < deadline, what
        time.sleep(0.25)
    return answer


def trigger(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["spec"]["triggers"][0]


def pod_monitor_endpoint(path: Path) -> dict:
    [monitor] = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "PodMonitor"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    return endpoint


# two replicas of llm-server on one node (80 % and 60 %)
PODS = (("llm-server-7d9f8c6b5d-aaaaa", 80), ("llm-server-7d9f8c6b5d-bbbbb", 60))
THIRD = "llm-server-7d9f8c6b5d-ccccc"
CANARY = "llm-server-canary-6c5b4a3d2-ddddd"  # another Deployment's pod, whose name starts as llm-server's


def kube_state_lines(pods: dict[str, tuple[str, bool]]) -> list[str]:
    """kube-state-metrics' series of ``pods`` (pod -> (the Deployment owning its ReplicaSet, ready)), as two of
    its replicas export them (every series twice, by ``instance``): the owners, readiness, and the count of
    llm-server's available replicas (the ready ones)."""
    lines = ["# TYPE kube_pod_owner gauge", "# TYPE kube_replicaset_owner gauge", "# TYPE kube_pod_status_ready gauge",
             "# TYPE kube_deployment_status_replicas_available gauge"]
    for instance in ("ksm-0", "ksm-1"):
        for pod, (deployment, ready) in pods.items():
            rs = pod.rsplit("-", 1)[0]
            lines.append(f'kube_pod_owner{{namespace="serving",pod="{pod}",owner_kind="ReplicaSet",owner_name="{rs}",'
                         f'owner_is_controller="true",instance="{instance}"}} 1')
            lines.append(f'kube_replicaset_owner{{namespace="serving",replicaset="{rs}",owner_kind="Deployment",'
                         f'owner_name="{deployment}",owner_is_controller="true",instance="{instance}"}} 1')
            for condition, value in (("true", ready), ("false", not ready)):
                lines.append(f'kube_pod_status_ready{{namespace="serving",pod="{pod}",condition="{condition}",'
                             f'instance="{instance}"}} {int(value)}')
        available = sum(ready for deployment, ready in pods.values() if deployment == "llm-server")
        lines.append(f'kube_deployment_status_replicas_available{{namespace="serving",deployment="llm-server",'
                     f'instance="{instance}"}} {available}')
    return sorted(set(lines), key=lines.index)  # a ReplicaSet's series once


def node_text(third_ready: bool) -> str:
    """dcgm-exporter's /metrics on the node (the two pods of :data:`PODS`), with kube-state-metrics' series of
    the Deployment; with ``third_ready``, a third replica ready that no sidecar forecasts."""
    lines = []
    for field, scale in (("DCGM_FI_DEV_GPU_UTIL", 1), ("DCGM_FI_DEV_FB_USED", 400)):
        lines.append(f"# TYPE {field} gauge")
        for gpu, (pod, util) in enumerate(PODS):
            lines.append(f'{field}{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H200",Hostname="n1",'
                         f'container="server",namespace="serving",pod="{pod}"}} {util * scale}')
    replicas = {pod: ("llm-server", True) for pod, _ in PODS} | ({THIRD: ("llm-server", True)} if third_ready else {})
    return "\n".join(lines + kube_state_lines(replicas)) + "\n"


def test_forecast_trigger_counts_each_pod_once_and_fails_safe(prometheus_server, http_peer) -> None:
    """deploy/keda/scaledobject.yaml with two per-pod sidecars on one node, both exporting both pods."""
    keda = trigger(DEPLOY / "keda" / "scaledobject.yaml")
    metadata = {**keda["metadata"], "query": keda["metadata"]["query"].replace('horizon_seconds="300"',
                                                                                'horizon_seconds="5"')}
    assert metadata["query"] != keda["metadata"]["query"]
    endpoint = pod_monitor_endpoint(DEPLOY / "sidecar" / "podmonitor.yaml")
    third = {"ready": False}
    with http_peer(lambda path: (200, node_text(third["ready"]), 0.0)) as node_url:
        sidecars = [Sidecar(SidecarConfig(listen_address="127.0.0.1", port=0, source="dcgm", sample_interval=0.1,
                                          forecast_interval=0.5, step_seconds=0.5, window_seconds=30, horizons=[5],
                                          min_points=4, stale_after=120, drop_after=300, model="ewma"),
                            sources=[DcgmSource(node_url + "/metrics", targets="pod")],
                            model=open_forecaster(None, "ewma")) for _ in range(2)]
        for sidecar in sidecars:
            sidecar.start()
        try:
            scraped = [node_url.removeprefix("http://")] + [f"127.0.0.1:{s.server.port}" for s in sidecars]
            with prometheus_server(scraped, honor_labels=endpoint.get("honorLabels", False),
                                   target_labels=OPERATOR_TARGET_LABELS) as prom:
                selector = 'dprobe_predicted_gpu_utilization_ratio{horizon_seconds="5", quantile="0.9"}'
                wait_for(lambda: len(prom.query(selector)) == 4, "both sidecars' forecasts of both pods")
                # the series keep the forecast pods' labels, not the scraped pod's
                assert {r["metric"]["namespace"] for r in prom.query(selector)} == {"serving"}
                wait_for(lambda: prom.query(metadata["query"]), "no answer (kube-state-metrics' series not scraped?)")
                value = keda_reads(prom, metadata)
                per_sidecar = [float(r["value"][1]) for r in prom.query(f"sum by (instance) ({selector})")]
                assert len(per_sidecar) == 2 and all(v == pytest.approx(value, rel=1e-6) for v in per_sidecar)
                assert value == pytest.approx(0.8 + 0.6, abs=0.05)
                # a plain sum counts each pod once per sidecar
                assert float(prom.query(f"sum({selector})")[0]["value"][1]) == pytest.approx(2 * value, rel=1e-6)

                # the dashboard's coverage panel: one series per pod, no error on the duplicates (at a 1 s
                # resolution, so that it has points without waiting for a minute mark)
                board = json.loads((DEPLOY / "grafana" / "dprobe-sidecar.json").read_text())
                [coverage] = [p for p in board["panels"] if "coverage" in p["title"]]
                values = {"namespace": "serving", "pod": ".*", "horizon": "5"}
                for target in coverage["targets"]:
                    expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], target["expr"])
                    expr = expr.replace("[1h:1m]", "[1m:1s]")
                    assert expr != target["expr"]
                    rows = wait_for(lambda e=expr: prom.query(e), f"no coverage from {expr}")
                    assert sorted(r["metric"]["pod"] for r in rows) == sorted(p for p, _ in PODS)
                    assert all(0 <= float(r["value"][1]) <= 1 for r in rows)

                # a third replica ready without a forecast: no answer, an error to KEDA (not a lower sum)
                third["ready"] = True
                wait_for(lambda: not prom.query(metadata["query"]), "the query still answers with a pod missing")
                with pytest.raises(KedaError, match="empty"):
                    keda_reads(prom, metadata)
                third["ready"] = False
                wait_for(lambda: prom.query(metadata["query"]), "the query did not come back")

                # one sidecar of the two stops: the other still forecasts both pods, nothing changes
                sidecars[0].stop()
                wait_for(lambda: len(prom.query(selector)) == 2, "the stopped sidecar's series did not go stale")
                assert keda_reads(prom, metadata) == pytest.approx(value, rel=1e-6)
                # both stopped: the forecasts are gone, and KEDA reads an error, not 0
                sidecars[1].stop()
                wait_for(lambda: not prom.query(selector), "the forecasts did not go stale")
                with pytest.raises(KedaError, match="empty"):
                    keda_reads(prom, metadata)
                # which KEDA would have read as 0 replicas' worth of load with its default
                assert keda_reads(prom, {**metadata, "ignoreNullValues": "true"}) == 0.0
        finally:
            for sidecar in sidecars:
                sidecar.stop()


def test_scaler_trigger_survives_operator_labels_and_fails_safe(prometheus_server, http_peer) -> None:
    """deploy/keda/scaledobject-scaler.yaml on the scaler's recommendation, scraped as the scaler's
    PodMonitor (deploy/scaler/deployment.yaml) has the Operator scrape it; then the scaler stops."""
    keda = trigger(DEPLOY / "keda" / "scaledobject-scaler.yaml")
    endpoint = pod_monitor_endpoint(DEPLOY / "scaler" / "deployment.yaml")
    text = ('# TYPE dprobe_recommended_replicas gauge\n'
            'dprobe_recommended_replicas{namespace="serving",workload="llm-server"} 4\n')
    up = {"scaler": True}
    with http_peer(lambda path: (200, text, 0.0) if up["scaler"] else (503, "", 0.0)) as scaler_url:
        target = [scaler_url.removeprefix("http://")]
        with prometheus_server(target, honor_labels=endpoint.get("honorLabels", False),
                               target_labels=OPERATOR_TARGET_LABELS) as prom:
            wait_for(lambda: prom.query("dprobe_recommended_replicas"), "the recommendation was not scraped")
            assert keda_reads(prom, keda["metadata"]) == 4
            up["scaler"] = False  # the scaler gone (its scrapes fail): the recommendation goes stale
            wait_for(lambda: not prom.query("dprobe_recommended_replicas"), "the recommendation did not go stale")
            with pytest.raises(KedaError, match="empty"):
                keda_reads(prom, keda["metadata"])
        # without honorLabels the target's namespace wins and the recommendation's moves to
        # exported_namespace: the query matches nothing (so it must be honoured, and the empty answer be an
        # error rather than 0)
        up["scaler"] = True
        with prometheus_server(target, honor_labels=False, target_labels=OPERATOR_TARGET_LABELS) as prom:
            rows = wait_for(lambda: prom.query("dprobe_recommended_replicas"), "the recommendation was not scraped")
            assert rows[0]["metric"]["namespace"] == "monitoring"
            assert rows[0]["metric"]["exported_namespace"] == "serving"
            with pytest.raises(KedaError, match="empty"):
                keda_reads(prom, keda["metadata"])


def forecasts_text(forecasts: dict[str, str], pods: dict[str, tuple[str, bool]]) -> str:
    """Sidecars' p90 forecasts 5 minutes ahead (pod -> value as written on /metrics), with kube-state-metrics'
    series of ``pods`` (:func:`kube_state_lines`)."""
    lines = ["# TYPE dprobe_predicted_gpu_utilization_ratio gauge"]
    for pod, value in forecasts.items():
        lines.append(f'dprobe_predicted_gpu_utilization_ratio{{namespace="serving",pod="{pod}",target="serving/{pod}",'
                     f'horizon_seconds="300",quantile="0.9"}} {value}')
    return "\n".join(lines + kube_state_lines(pods)) + "\n"


def test_forecast_trigger_leaves_out_nan_and_out_of_range_forecasts(prometheus_server, http_peer) -> None:
    """deploy/keda/scaledobject.yaml: a NaN, negative or above-1 forecast is left out, never summed: its pod has
    no forecast, so with its replica available the query answers nothing (KEDA: an error, the count holds),
    and a bad series of a pod that is not among the available replicas does not spoil the sum."""
    keda = trigger(DEPLOY / "keda" / "scaledobject.yaml")
    query = keda["metadata"]["query"]
    [a, b] = [pod for pod, _ in PODS]
    page = {"forecasts": {a: "0.8", b: "0.6"}, "pods": {a: ("llm-server", True), b: ("llm-server", True)}}
    selector = 'dprobe_predicted_gpu_utilization_ratio{horizon_seconds="300", quantile="0.9"}'

    def serving(pod: str, value: str) -> Callable[[], bool]:
        """Prometheus has scraped ``value`` (as Prometheus writes it back) for ``pod``."""
        return lambda: any(r["metric"]["pod"] == pod and r["value"][1] == value for r in prom.query(selector))

    with http_peer(lambda path: (200, forecasts_text(page["forecasts"], page["pods"]), 0.0)) as url, \
            prometheus_server([url.removeprefix("http://")], honor_labels=True,
                              target_labels=OPERATOR_TARGET_LABELS) as prom:
        wait_for(lambda: prom.query(query), "no answer (the forecasts not scraped?)")
        assert keda_reads(prom, keda["metadata"]) == pytest.approx(1.4)
        for bad in ("NaN", "-0.5", "1.5"):  # one pod's forecast unusable while its replica is available
            page["forecasts"][b] = bad
            wait_for(serving(b, bad), f"{bad} not scraped")
            assert prom.query(query) == [], bad
            with pytest.raises(KedaError, match="empty"):
                keda_reads(prom, keda["metadata"])
        # a third pod, not ready (terminating), with a bad forecast: the two ready ones still count
        page["pods"][THIRD] = ("llm-server", False)
        page["forecasts"] = {a: "0.8", b: "0.6", THIRD: "NaN"}
        wait_for(serving(THIRD, "NaN"), "the third pod not scraped")
        wait_for(serving(b, "0.6"), "the second pod's forecast did not come back")
        assert keda_reads(prom, keda["metadata"]) == pytest.approx(1.4)
        page["forecasts"][THIRD] = "-3"
        wait_for(serving(THIRD, "-3"), "the negative forecast not scraped")
        assert keda_reads(prom, keda["metadata"]) == pytest.approx(1.4)


def test_forecast_trigger_matches_the_replicas_by_owner_never_a_lookalike(prometheus_server, http_peer) -> None:
    """deploy/keda/scaledobject.yaml with a canary (another Deployment, its pod named llm-server-canary-...)
    beside llm-server's two replicas: the canary's forecast is never summed; one replica's forecast NaN while
    the canary's is fine is no answer (its replica has no forecast), not the rest of the sum."""
    keda = trigger(DEPLOY / "keda" / "scaledobject.yaml")
    query = keda["metadata"]["query"]
    [a, b] = [pod for pod, _ in PODS]
    pods = {a: ("llm-server", True), b: ("llm-server", True), CANARY: ("llm-server-canary", True)}
    page = {"forecasts": {a: "0.6", b: "0.2", CANARY: "0.25"}}
    selector = 'dprobe_predicted_gpu_utilization_ratio{horizon_seconds="300", quantile="0.9"}'

    def serving(pod: str, value: str) -> Callable[[], bool]:
        return lambda: any(r["metric"]["pod"] == pod and r["value"][1] == value for r in prom.query(selector))

    with http_peer(lambda path: (200, forecasts_text(page["forecasts"], pods), 0.0)) as url, \
            prometheus_server([url.removeprefix("http://")], honor_labels=True,
                              target_labels=OPERATOR_TARGET_LABELS) as prom:
        wait_for(lambda: prom.query(query) and len(prom.query("kube_pod_status_ready")) == 12,
                 "no answer (the series not scraped?)")
        assert keda_reads(prom, keda["metadata"]) == pytest.approx(0.8)  # the two replicas, not the canary
        page["forecasts"][b] = "NaN"  # a replica without a usable forecast, the canary still forecast
        wait_for(serving(b, "NaN"), "NaN not scraped")
        assert prom.query(query) == []
        with pytest.raises(KedaError, match="empty"):
            keda_reads(prom, keda["metadata"])
        del page["forecasts"][b]  # its series gone altogether (its sidecar stopped): the same
        wait_for(lambda: not any(r["metric"]["pod"] == b for r in prom.query(selector)), "the series did not go")
        assert prom.query(query) == []
