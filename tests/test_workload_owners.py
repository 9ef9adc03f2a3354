"""Pods grouped into workloads by their owner (kube-state-metrics' kube_pod_owner / kube_replicaset_owner),
with the pod-name patterns as the fallback for pods whose owner is not known; Argo Rollouts scaled through
their scale subresource."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from dprobe.scaling.policy import Policy
from dprobe.services.scaler.config import OWNERS_QUERY, ScalerConfig, WorkloadSpec
from dprobe.services.scaler.demand import group_demand, pod_owners
from dprobe.services.scaler.kube import ObjectRef, ScaleClient
from dprobe.services.scaler.reader import DemandReader
from dprobe.services.scaler.service import Scaler

# (pod, owner kind, owner name): what kube-state-metrics says, after the ReplicaSet -> Deployment join
OWNED = [("llm-server-7d9f8c6b5d-aaaaa", "Deployment", "llm-server"),
         ("llm-server-7d9f8c6b5d-bbbbb", "Deployment", "llm-server"),
         ("llm-server-canary-6c5b4a3d2-ccccc", "Deployment", "llm-server-canary"),  # lookalike of another one
         ("redis-main-0", "StatefulSet", "cache"),  # pods named unlike their StatefulSet
         ("redis-main-1", "StatefulSet", "cache"),
         ("ranker-5f6d7c8b9-ddddd", "Rollout", "ranker"),
         ("node-probe-x7k2p", "DaemonSet", "node-probe")]
SPECS = [{"namespace": "serving", "name": "llm-server", "pods": "llm-server-.*"},  # a pattern the canary matches
         {"namespace": "serving", "name": "cache", "kind": "StatefulSet"}]


def _specs(entries: list[dict] = SPECS) -> list[WorkloadSpec]:
    return [WorkloadSpec.parse(e, Policy(), i) for i, e in enumerate(entries)]


def _forecasts(pods: list[str], value: float = 0.5) -> dict:
    return {("serving", p): (value, {"namespace": "serving", "pod": p, "target": f"serving/{p}"}) for p in pods}


def test_owner_grouping_excludes_lookalikes_and_includes_custom_pod_names() -> None:
    pods = [p for p, _, _ in OWNED] + ["llm-server-7d9f8c6b5d-new00"]  # the last: kube-state-metrics not yet
    owners = {("serving", p): (kind, name) for p, kind, name in OWNED}
    view = group_demand(_forecasts(pods), _specs(), {}, "namespace", True, owners)
    llm, cache = view.workloads[("serving", "llm-server")], view.workloads[("serving", "cache")]
    assert llm.pods == ["llm-server-7d9f8c6b5d-aaaaa", "llm-server-7d9f8c6b5d-bbbbb", "llm-server-7d9f8c6b5d-new00"]
    assert cache.pods == ["redis-main-0", "redis-main-1"] and cache.total == 1.0
    # the canary and the Rollout are discovered under their owners' names; a DaemonSet's pod is no replica
    assert set(view.discovered) == {("serving", "llm-server-canary"), ("serving", "ranker")}
    assert view.grouped == Counter(owner=6, name=1)
    assert view.vcs["serving"].total == pytest.approx(0.5 * len(pods))  # virtual clusters count every pod

    # by name alone (no kube-state-metrics): the pattern takes the canary, misses the StatefulSet's pods, and
    # the DaemonSet's pod looks like a Deployment "node"'s
    view = group_demand(_forecasts(pods), _specs(), {}, "namespace", True, None)
    assert "llm-server-canary-6c5b4a3d2-ccccc" in view.workloads[("serving", "llm-server")].pods
    assert view.workloads[("serving", "cache")].pods == [] and view.grouped == Counter(name=6)
    assert set(view.discovered) == {("serving", "ranker"), ("serving", "node")}


def test_a_workload_may_name_another_owner_and_pods_without_forecast_are_missing() -> None:
    [spec] = _specs([{"namespace": "serving", "name": "ranker", "kind": "Deployment",
                      "owner": {"kind": "Rollout"}}])  # a Rollout with workloadRef: its pods are the Rollout's
    assert spec.owner_ref == ("Rollout", "ranker")
    owners = {("serving", p): (kind, name) for p, kind, name in OWNED}
    gpus = {("serving", "ranker-5f6d7c8b9-ddddd"): (1, {"namespace": "serving", "pod": "ranker-5f6d7c8b9-ddddd"})}
    view = group_demand({}, [spec], gpus, "namespace", False, owners)
    assert view.workloads[spec.key].missing == ["ranker-5f6d7c8b9-ddddd"]


@pytest.mark.parametrize(("entry", "expected"), [
    ({"name": "llm-server"}, ("Deployment", "llm-server")),
    ({"name": "db", "kind": "StatefulSet"}, ("StatefulSet", "db")),
    ({"name": "ranker", "kind": "Rollout"}, ("Rollout", "ranker")),
    ({"name": "llm", "owner": {"name": "llm-v2"}}, ("Deployment", "llm-v2")),
])
def test_owner_defaults_to_the_workload_itself(entry: dict, expected: tuple) -> None:
    spec = WorkloadSpec.parse({"namespace": "ns", **entry}, Policy())
    assert spec.owner_ref == expected
    if spec.kind == "Rollout":  # a Rollout's pods are named as a Deployment's
        assert spec.pods.fullmatch("ranker-5f6d7c8b9-ddddd") and not spec.pods.fullmatch("ranker-0")


@pytest.mark.parametrize(("owner", "message"), [
    ("Deployment/llm", r"workloads\[0\] \(ns/llm\): owner must be a mapping"),
    ({"kind": "Deployment", "uid": "x"}, r"unknown owner key\(s\) uid"),
    ({"name": ""}, "owner kind and name must be names"),
])
def test_bad_owners_are_refused_with_their_place(owner, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalerConfig(workloads=[{"namespace": "ns", "name": "llm", "owner": owner}]).validate()


def test_the_owners_query_joins_replicasets_to_their_owners() -> None:
    # direct owners, and ReplicaSets joined to what owns them, on namespace and ReplicaSet name
    assert 'kube_pod_owner{owner_kind!~"ReplicaSet|<none>|",owner_is_controller="true"}' in OWNERS_QUERY
    assert '"replicaset", "$1", "owner_name", "(.+)"' in OWNERS_QUERY
    assert "* on (namespace, replicaset) group_left (owner_kind, owner_name)" in OWNERS_QUERY
    assert OWNERS_QUERY.count("(") == OWNERS_QUERY.count(")")
    assert ScalerConfig().owners_query == OWNERS_QUERY


class _Api(BaseHTTPRequestHandler):
    """A Prometheus API: ``server.rows(query)`` -> [(labels, value)], or None for HTTP 503."""

    def do_GET(self) -> None:  # noqa: N802
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
        self.server.queries.append(query)  # type: ignore[attr-defined]
        rows = self.server.rows(query)  # type: ignore[attr-defined]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, str(v)]} for m, v in rows or []]}}).encode()
        self.send_response(200 if rows is not None else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def prometheus(rows) -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    srv.rows, srv.queries = rows, []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _owner_rows(owners_up: list[bool]):
    """Forecasts of every pod of :data:`OWNED`; the owners query answers while ``owners_up[0]`` (None: down)."""
    def rows(query: str):
        if query == OWNERS_QUERY:
            state = owners_up[0]
            if state is None:
                return None
            return [({"namespace": "serving", "pod": p, "owner_kind": k, "owner_name": n}, 1)
                    for p, k, n in OWNED] if state else []
        if "dprobe_predicted" in query:
            return [({"namespace": "serving", "pod": p, "target": f"serving/{p}"}, 0.5) for p, _, _ in OWNED]
        return []
    return rows


def test_pod_owners_leaves_a_pod_with_two_owners_to_its_name() -> None:
    def rows(query: str):
        return [({"namespace": "a", "pod": "p", "owner_kind": "Deployment", "owner_name": "x"}, 1),
                ({"namespace": "a", "pod": "p", "owner_kind": "Rollout", "owner_name": "x"}, 1),
                ({"namespace": "a", "pod": "q", "owner_kind": "StatefulSet", "owner_name": "y"}, 1),
                ({"namespace": "a", "pod": "r", "owner_kind": "", "owner_name": "z"}, 1)]
    with prometheus(rows) as srv:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert pod_owners(ScalerConfig(prometheus_url=url).queries) == {("a", "q"): ("StatefulSet", "y")}
        assert pod_owners(ScalerConfig(prometheus_url=url, owners_query="").queries) == {}


def test_the_scaler_says_which_grouping_it_used_and_falls_back_to_names(caplog) -> None:
    owners_up: list = [True]
    with prometheus(_owner_rows(owners_up)) as srv:
        config = ScalerConfig(prometheus_url=f"http://127.0.0.1:{srv.server_address[1]}", gpus_query="",
                              replicas_query="", restore_seconds=0, workloads=SPECS)
        scaler = Scaler(config, clock=iter(range(0, 10**6, 30)).__next__)
        caplog.set_level(logging.INFO, logger="dprobe")
        scaler.cycle()
        assert scaler.reader.grouping == "owner" and scaler.grouped_pods == {"owner": 6, "name": 0}
        assert scaler.decisions[("serving", "cache")].demand == 1.0
        assert scaler.decisions[("serving", "llm-server")].demand == 1.0  # the canary left out
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_scaler_grouped_pods{method="owner"} 6.0' in text
        assert "grouping pods into workloads by owner" in caplog.text

        owners_up[0] = []  # kube-state-metrics gone: by name, said once
        caplog.clear()
        scaler.cycle()
        scaler.cycle()
        assert scaler.reader.grouping == "name" and scaler.grouped_pods == {"owner": 0, "name": 5}
        assert caplog.text.count("grouping pods into workloads by name") == 1
        assert scaler.decisions[("serving", "llm-server")].demand == 1.5  # the pattern takes the canary
        assert scaler.errors_total["query"] == 0

        owners_up[0] = None  # the query fails: counted, by name
        scaler.cycle()
        assert scaler.errors_total["query"] == 1 and scaler.reader.grouping == "name"
        assert "owners_query failed (pods grouped by name)" in caplog.text


def test_reader_without_owners_query_asks_nothing() -> None:
    with prometheus(_owner_rows([True])) as srv:
        config = ScalerConfig(prometheus_url=f"http://127.0.0.1:{srv.server_address[1]}", owners_query="",
                              gpus_query="")
        reader = DemandReader(config.queries, config.vc, config.discover, [], Counter())
        view = reader.read()
        assert view is not None and OWNERS_QUERY not in srv.queries and reader.grouping == ""


class _RolloutApi(BaseHTTPRequestHandler):
    """The scale subresource of Argo Rollouts: ``server.replicas[(ns, name)]``."""

    SCALE = re.compile(r"/apis/argoproj.io/v1alpha1/namespaces/([^/]+)/rollouts/([^/]+)/scale")

    def _answer(self, patch: dict | None = None) -> None:
        m = self.SCALE.fullmatch(self.path.split("?")[0])
        key = m.groups() if m else None
        if key not in self.server.replicas:  # type: ignore[attr-defined]
            code, doc = 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
        else:
            if patch:
                self.server.replicas[key] = patch["spec"]["replicas"]  # type: ignore[attr-defined]
            n = self.server.replicas[key]  # type: ignore[attr-defined]
            code, doc = 200, {"kind": "Scale", "apiVersion": "autoscaling/v1", "spec": {"replicas": n}}
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    def do_PATCH(self) -> None:  # noqa: N802
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def log_message(self, *args: object) -> None:
        pass


def test_rollouts_are_read_and_scaled_through_their_scale_subresource(tmp_path: Path) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _RolloutApi)
    srv.replicas = {("serving", "ranker"): 3}  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}], "users": [{"name": "t", "user": {}}]}))
    try:
        client = ScaleClient(str(kubeconfig), timeout=2)
        spec = WorkloadSpec.parse({"namespace": "serving", "name": "ranker", "kind": "Rollout"}, Policy())
        assert client.replicas(spec) == 3
        client.scale(spec, 5)
        assert srv.replicas[("serving", "ranker")] == 5 and client.replicas(spec) == 5  # type: ignore[attr-defined]
        missing = WorkloadSpec.parse({"namespace": "serving", "name": "gone", "kind": "Rollout"}, Policy())
        with pytest.raises(Exception, match=r"Rollout serving/gone: read scale: HTTP 404"):
            client.replicas(missing)
        assert ObjectRef.of(spec).api_version == "argoproj.io/v1alpha1"
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_pod_level_reads_other_queries_are_answered_while_the_forecasts_are() -> None:
    """GPUs per pod, owners and waiting GPUs are asked alongside the forecasts (Prometheus evaluates them on its
    other cores meanwhile): a cycle whose answers each take 0.4 s takes about one of them, not the four in turn;
    the answers are the same, and a failed one is still counted where it is used."""
    owners_up: list[bool | None] = [True]
    inner = _owner_rows(owners_up)

    def slow_rows(query: str):
        time.sleep(0.4)
        return inner(query)

    with prometheus(slow_rows) as srv:
        config = ScalerConfig(prometheus_url=f"http://127.0.0.1:{srv.server_address[1]}",
                              vc_pending_query='sum by (namespace) (kube_pod_container_resource_requests{resource="x"})')
        errors: Counter[str] = Counter()
        reader = DemandReader(config.queries, config.vc, config.discover, [], errors)
        started = time.monotonic()
        view = reader.read()
        took = time.monotonic() - started
        assert view is not None and reader.grouping == "owner"
        assert OWNERS_QUERY in srv.queries and len(srv.queries) >= 4
        assert took < 0.4 * (len(srv.queries) - 1), (took, srv.queries)  # in turn: 0.4 s a query or more
        assert errors["query"] == 0

        owners_up[0] = None  # the owners query fails: counted when its answer is taken, pods grouped by name
        assert reader.read() is not None
        assert errors["query"] == 1 and reader.grouping == "name"
