"""The scaler's owner query against a real Prometheus fed kube-state-metrics' series: pods are grouped by what
owns them (ReplicaSet -> Deployment or Rollout; StatefulSet directly), not by what their names look like."""

from __future__ import annotations

import time

import pytest

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.demand import pod_owners
from dprobe.services.scaler.service import Scaler

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real Prometheus: seconds per test

# (pod, the controller owning it directly, that controller's owner or None)
PODS = [("llm-server-7d9f8c6b5d-aaaaa", ("ReplicaSet", "llm-server-7d9f8c6b5d"), ("Deployment", "llm-server")),
        ("llm-server-7d9f8c6b5d-bbbbb", ("ReplicaSet", "llm-server-7d9f8c6b5d"), ("Deployment", "llm-server")),
        # a lookalike: another Deployment's pod, whose name the llm-server pattern matches
        ("llm-server-canary-6c5b4a3d2-ccccc", ("ReplicaSet", "llm-server-canary-6c5b4a3d2"),
         ("Deployment", "llm-server-canary")),
        # a StatefulSet whose pods are not named <name>-<ordinal> of the workload
        ("redis-main-0", ("StatefulSet", "cache"), None),
        ("redis-main-1", ("StatefulSet", "cache"), None),
        ("ranker-5f6d7c8b9-ddddd", ("ReplicaSet", "ranker-5f6d7c8b9"), ("Rollout", "ranker")),
        ("node-probe-x7k2p", ("DaemonSet", "node-probe"), None),
        ("debug-shell", ("<none>", "<none>"), None)]


def kube_state_text() -> str:
    """kube-state-metrics' owner series of :data:`PODS`, as two replicas of it export them (every series
    twice, by ``instance``), and each pod's forecast at 0.5."""
    lines = ["# TYPE kube_pod_owner gauge"]
    for instance in ("ksm-0", "ksm-1"):
        for pod, (kind, name), _ in PODS:
            controller = "<none>" if kind == "<none>" else "true"
            lines.append(f'kube_pod_owner{{namespace="serving",pod="{pod}",uid="u-{pod}",owner_kind="{kind}",'
                         f'owner_name="{name}",owner_is_controller="{controller}",instance="{instance}"}} 1')
    lines.append("# TYPE kube_replicaset_owner gauge")
    for instance in ("ksm-0", "ksm-1"):
        for rs, owner in sorted({(name, owner) for _, (kind, name), owner in PODS if kind == "ReplicaSet"}):
            lines.append(f'kube_replicaset_owner{{namespace="serving",replicaset="{rs}",owner_kind="{owner[0]}",'
                         f'owner_name="{owner[1]}",owner_is_controller="true",instance="{instance}"}} 1')
    lines.append("# TYPE dprobe_predicted_gpu_utilization_ratio gauge")
    for pod, _, _ in PODS:
        lines.append(f'dprobe_predicted_gpu_utilization_ratio{{target="serving/{pod}",namespace="serving",'
                     f'pod="{pod}",horizon_seconds="300",quantile="0.9"}} 0.5')
    return "\n".join(lines) + "\n"


WORKLOADS = [{"namespace": "serving", "name": "llm-server", "pods": "llm-server-.*"},
             {"namespace": "serving", "name": "cache", "kind": "StatefulSet"},
             {"namespace": "serving", "name": "ranker", "kind": "Rollout"}]


def test_owner_grouping_on_a_real_prometheus(prometheus_server, http_peer) -> None:
    text = kube_state_text()
    with http_peer(lambda path: (200, text, 0.0)) as url, \
            prometheus_server([url.removeprefix("http://")], honor_labels=True) as prom:
        deadline = time.time() + 30
        while len(prom.query("kube_replicaset_owner")) < 6 or not prom.query("dprobe_predicted_gpu_utilization_ratio"):
            assert time.time() < deadline, "Prometheus never scraped the series"
            time.sleep(0.3)
        config = ScalerConfig(prometheus_url=str(prom), gpus_query="", replicas_query="", restore_seconds=0,
                              target=0.5, margin=0.0, workloads=WORKLOADS)
        # the default query's join, answered by Prometheus itself (two kube-state-metrics replicas: no
        # many-to-many error); a pod without an owner is not listed
        assert pod_owners(config.queries) == {("serving", pod): owner or direct for pod, direct, owner in PODS
                                      if direct[0] != "<none>"}
        scaler = Scaler(config, clock=iter(range(0, 10**6, 30)).__next__)
        scaler.cycle()
        assert scaler.errors_total["query"] == 0 and scaler.reader.grouping == "owner"
        decisions = scaler.decisions
        assert decisions[("serving", "llm-server")].demand == pytest.approx(1.0)  # 2 pods: the canary left out
        assert decisions[("serving", "cache")].demand == pytest.approx(1.0)  # its custom-named pods
        assert decisions[("serving", "ranker")].demand == pytest.approx(0.5)
        assert decisions[("serving", "llm-server-canary")].demand == pytest.approx(0.5)  # discovered by owner
        assert ("serving", "node") not in decisions  # a DaemonSet's pod is nobody's replica
        assert scaler.grouped_pods == {"owner": 6, "name": 0}  # (debug-shell: no owner, no Deployment-like name)

        # by name (owners_query ''): the pattern takes the canary and misses the StatefulSet's pods
        by_name = Scaler(ScalerConfig(prometheus_url=str(prom), gpus_query="", replicas_query="", restore_seconds=0,
                                      owners_query="", target=0.5, margin=0.0, workloads=WORKLOADS),
                         clock=iter(range(0, 10**6, 30)).__next__)
        by_name.cycle()
        assert by_name.decisions[("serving", "llm-server")].demand == pytest.approx(1.5)
        assert by_name.decisions[("serving", "cache")].demand is None
