"""The scaler at fleet scale: queries per cycle independent of the number of workloads (activation queries in one
batch), the join of pods to listed workloads in O(pods), partial responses, a horizon the sidecars do not export,
the recorded per-workload series (and their absence), and the fleet benchmark's smoke run on a real Prometheus."""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from dprobe.services.scaler.config import ScalerConfig, WorkloadSpec
from dprobe.services.scaler.demand import ACTIVATION_LABEL, SpecIndex, group_demand
from dprobe.services.scaler.service import Scaler

Reply = Callable[[str], tuple[int, dict]]


def _vector(rows: list[tuple[dict, float]], warnings: list[str] | None = None) -> dict:
    doc: dict = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [0, str(v)]} for m, v in rows]}}
    if warnings:
        doc["warnings"] = warnings
    return doc


class _Api(BaseHTTPRequestHandler):
    """The query API of a Prometheus stand-in: GET and POST (form) alike, each request recorded."""

    def _answer(self, query: str) -> None:
        self.server.asked.append((self.command, query))  # type: ignore[attr-defined]
        status, doc = self.server.reply(query)  # type: ignore[attr-defined]
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0])

    def do_POST(self) -> None:  # noqa: N802
        form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self._answer(urllib.parse.parse_qs(form).get("query", [""])[0])

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def prometheus_api(reply: Reply) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A Prometheus API stand-in on loopback answering ``reply(query)``: (base URL, the (method, query) asked)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    srv.daemon_threads = True
    srv.reply, srv.asked = reply, []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv.asked  # type: ignore[attr-defined]
    finally:
        srv.shutdown()
        srv.server_close()


QUEUE = re.compile(r'queue_length\{workload="svc-(\d+)"\}')


def _fleet_reply(n: int, bad: set[int] = frozenset(), warnings: list[str] | None = None) -> Reply:
    """``n`` Deployments ``svc-K`` of two pods each, forecast 0.3 each; kube-state-metrics' replicas (2 each); GPU
    counts of 1; ``queue_length{workload="svc-K"}`` is K (the activation queries). A query naming a workload of
    ``bad`` is refused (HTTP 400), as Prometheus refuses a query it cannot parse."""
    def reply(query: str) -> tuple[int, dict]:
        named = {int(k) for k in QUEUE.findall(query)}
        if named & bad:
            return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}
        if ACTIVATION_LABEL in query:  # a batch: each part's samples summed, labelled with its index
            parts = re.findall(r'queue_length\{workload="svc-(\d+)"\}\)\) >= -Inf\), "' + ACTIVATION_LABEL
                               + r'", "(\d+)"', query)
            return 200, _vector([({ACTIVATION_LABEL: i}, float(k)) for k, i in parts], warnings)
        if named:
            return 200, _vector([({}, float(named.pop()))], warnings)
        pods = [(f"svc-{k}", f"svc-{k}-7d9f8c6b5d-{p}aaaa") for k in range(n) for p in "ab"]
        if "dprobe_predicted" in query:
            return 200, _vector([({"target": f"team/{pod}", "namespace": "team", "pod": pod,
                                   "horizon_seconds": "300"}, 0.3) for _, pod in pods], warnings)
        if "kube_deployment_spec_replicas" in query:
            return 200, _vector([({"namespace": "team", "workload": f"svc-{k}"}, 2) for k in range(n)], warnings)
        if "DCGM" in query:
            return 200, _vector([({"namespace": "team", "pod": pod}, 1) for _, pod in pods], warnings)
        return 200, _vector([], warnings)
    return reply


def _listed(n: int) -> list[dict]:
    return [{"namespace": "team", "name": f"svc-{k}", "min_replicas": 0,
             "activation_query": f'sum(queue_length{{workload="svc-{k}"}})'} for k in range(n)]


def _queries_per_cycle(n: int) -> tuple[int, set[str], Scaler]:
    """The queries of the second cycle of a scaler listing ``n`` workloads (the first also reads back the last
    run's recommendations), and the methods they were sent with."""
    with prometheus_api(_fleet_reply(n)) as (url, asked):
        scaler = Scaler(ScalerConfig(prometheus_url=url, workloads=_listed(n)), clock=iter(range(0, 10**6, 30)).__next__)
        scaler.cycle()
        before = len(asked)
        scaler.cycle()
        return len(asked) - before, {m for m, _ in asked[before:]}, scaler


def test_queries_per_cycle_do_not_grow_with_the_workloads() -> None:
    """10 or 100 listed workloads, each with an activation query of its own: the same number of queries a cycle
    (the activation queries in one, POSTed when long), each workload given its own query's value."""
    small, _, _ = _queries_per_cycle(10)
    large, methods, scaler = _queries_per_cycle(100)
    assert small == large <= 8, (small, large)
    assert "POST" in methods  # the 100 activation queries in one request, too long for a URL
    assert {key: value for key, (value, _) in scaler.activations.items()} == {
        ("team", f"svc-{k}"): float(k) for k in range(100)}
    assert scaler.activations[("team", "svc-0")][1] is False and scaler.activations[("team", "svc-5")][1] is True
    assert scaler.decisions[("team", "svc-7")].demand == pytest.approx(0.6)


def test_a_refused_activation_query_fails_alone_in_a_few_more_queries() -> None:
    """A batch Prometheus refuses is split until the query at fault is found: the others are answered, the bad
    one counted as a failed query (its workload kept as it is), in about log2(n) more queries, not n."""
    with prometheus_api(_fleet_reply(64, bad={37})) as (url, asked):
        scaler = Scaler(ScalerConfig(prometheus_url=url, workloads=_listed(64)), clock=iter(range(0, 10**6, 30)).__next__)
        scaler.cycle()
        before = len(asked)
        scaler.cycle()
        activation = [q for _, q in asked[before:] if "queue_length" in q]
    assert len(activation) <= 2 * 7 + 1, len(activation)
    assert ("team", "svc-37") not in scaler.activations and len(scaler.activations) == 63
    assert scaler.activations[("team", "svc-36")][0] == 36.0
    assert scaler.errors_total["query"] == 2  # one per cycle: svc-37's


def test_prometheus_down_fails_the_activation_batches_in_one_query_logged_once(caplog) -> None:
    """Prometheus down: one activation request fails (the next batches are not asked), counted once, logged once
    without the batch's text; every workload kept as it is."""
    with prometheus_api(lambda query: (503, {"status": "error", "error": "down"})) as (url, asked):
        scaler = Scaler(ScalerConfig(prometheus_url=url, workloads=_listed(250)), clock=iter(range(0, 10**6, 30)).__next__)
        with caplog.at_level(logging.WARNING, logger="dprobe.services.scaler.reader"):
            scaler.cycle()
    assert sum("queue_length" in q for _, q in asked) == 1 and not scaler.activations
    [logged] = [r.getMessage() for r in caplog.records if "activation" in r.getMessage()]
    assert "250 activation queries: HTTP 503" in logged and "queue_length" not in logged, logged


class _CountingPattern:
    """A ``pods`` pattern counting its matches."""

    def __init__(self, pattern: str, calls: list[int]) -> None:
        self.compiled, self.pattern, self.calls = re.compile(pattern), pattern, calls

    def fullmatch(self, text: str) -> re.Match[str] | None:
        self.calls[0] += 1
        return self.compiled.fullmatch(text)


def _spec(name: str, calls: list[int], pods: str | None = None, kind: str = "Deployment") -> WorkloadSpec:
    spec = WorkloadSpec.parse({"namespace": "team", "name": name, "kind": kind,
                               **({"pods": pods} if pods else {})}, ScalerConfig().default_policy())
    return WorkloadSpec(spec.namespace, spec.name, spec.kind, _CountingPattern(spec.pods.pattern, calls),  # type: ignore[arg-type]
                        spec.policy)


def test_pods_join_listed_workloads_in_o_pods_and_the_first_listed_wins() -> None:
    """2,000 listed workloads, 8,000 pods grouped by name: at most two pattern matches a pod (the workloads its
    name implies), not one per workload; where a custom pattern and a default one both match, the first listed
    wins, as when every spec was tried in turn."""
    calls = [0]
    specs = [_spec(f"svc-{k}", calls) for k in range(2000)]
    forecasts = {("team", f"svc-{k}-7d9f8c6b5d-{p}aaaa"): (0.25, {"namespace": "team"})
                 for k in range(2000) for p in "abcd"}
    view = group_demand(forecasts, specs, {}, "namespace", discover=False)
    assert calls[0] <= 2 * len(forecasts), calls[0]
    assert all(d.total == pytest.approx(1.0) and d.covered == 4 for d in view.workloads.values())
    # precedence: a custom pattern listed first takes the pods of a default one listed after it, and not before
    first = [_spec("any", calls, pods="web-.*"), _spec("web", calls), _spec("db", calls, kind="StatefulSet")]
    pods = {("team", "web-7d9f8c6b5d-aaaaa"): (0.5, {}), ("team", "db-0"): (0.5, {}), ("team", "db-x"): (0.5, {})}
    assert {k: d.covered for k, d in group_demand(pods, first, {}, "", False).workloads.items()} == {
        ("team", "any"): 1, ("team", "web"): 0, ("team", "db"): 1}
    later = [first[1], first[0], first[2]]
    assert {k: d.covered for k, d in group_demand(pods, later, {}, "", False).workloads.items()} == {
        ("team", "web"): 1, ("team", "any"): 0, ("team", "db"): 1}
    index = SpecIndex(later)
    assert index.by_name("other", "web-7d9f8c6b5d-aaaaa") is None
    assert index.by_owner("team", ("Deployment", "web")) is later[0]


def test_a_partial_response_is_counted_and_logged_once_and_decisions_go_on(caplog) -> None:
    """Thanos / Mimir with a store or ingester down answer with a warning: counted, logged once, the cycle decides
    on what was answered."""
    warning = "partial response: store 10.0.0.7:10901 unavailable"
    with prometheus_api(_fleet_reply(3, warnings=[warning])) as (url, _):
        scaler = Scaler(ScalerConfig(prometheus_url=url, workloads=_listed(3)), clock=iter(range(0, 10**6, 30)).__next__)
        with caplog.at_level(logging.WARNING, logger="dprobe.services.scaler.reader"):
            scaler.cycle()
            scaler.cycle()
    assert scaler.decisions[("team", "svc-1")].demand == pytest.approx(0.6) and not scaler.errors_total["cycle"]
    assert scaler.answer_warnings_total >= 2 * 4  # every answer of both cycles carried it
    assert sum(warning in r.getMessage() for r in caplog.records) == 1
    text = generate_latest(scaler.registry).decode()
    assert f"dprobe_scaler_query_warnings_total {float(scaler.answer_warnings_total)}" in text


def test_a_horizon_the_sidecars_do_not_export_is_warned_of_once_and_counted(caplog) -> None:
    """Forecasts exported at 60 and 900 s, the scaler asking for 300 s: a warning naming them, once; a count a
    cycle; nothing once the horizon is there."""
    horizons = ["60", "900"]

    def reply(query: str) -> tuple[int, dict]:
        if query.startswith("count by (horizon_seconds)"):
            return 200, _vector([({"horizon_seconds": h}, 10) for h in horizons])
        if "dprobe_predicted" in query and "300" in horizons:
            return 200, _vector([({"target": "team/a-0", "namespace": "team", "pod": "a-0",
                                   "horizon_seconds": "300"}, 0.5)])
        return 200, _vector([])

    with prometheus_api(reply) as (url, _):
        scaler = Scaler(ScalerConfig(prometheus_url=url, horizon_seconds=300), clock=iter(range(0, 10**6, 30)).__next__)
        with caplog.at_level(logging.WARNING, logger="dprobe.services.scaler.reader"):
            scaler.cycle()
            scaler.cycle()
            warned = [r.getMessage() for r in caplog.records if "horizon_seconds 300" in r.getMessage()]
            assert len(warned) == 1 and "60, 900" in warned[0], warned
            assert scaler.horizon_missing_total == 2
            assert "dprobe_scaler_horizon_missing_total 2.0" in generate_latest(scaler.registry).decode()
            horizons.append("300")
            scaler.cycle()
    assert scaler.horizon_missing_total == 2


def _recorded_reply(rules: bool) -> Reply:
    """The recording rules' series of one Deployment (3 pods seen, 2 with a forecast summing 1.2) and of its
    namespace, where ``rules``; the sidecars' forecasts of the same pods either way."""
    def reply(query: str) -> tuple[int, dict]:
        if query.startswith("label_replace(max by (namespace, owner_kind, owner_name)"):
            if not rules:
                return 200, _vector([])
            owner = {"namespace": "team", "owner_kind": "Deployment", "owner_name": "llm"}
            return 200, _vector([({**owner, "dprobe_series": "demand"}, 1.2), ({**owner, "dprobe_series": "covered"}, 2),
                                 ({**owner, "dprobe_series": "seen"}, 3)])
        if query.startswith("label_replace(max by (namespace)"):
            if not rules:
                return 200, _vector([])
            return 200, _vector([({"namespace": "team", "dprobe_series": "demand"}, 1.2),
                                 ({"namespace": "team", "dprobe_series": "covered"}, 2),
                                 ({"namespace": "team", "dprobe_series": "seen"}, 3)])
        if query.startswith("count(dprobe_predicted"):
            return 200, _vector([({}, 2)])
        if "dprobe_predicted" in query:
            return 200, _vector([({"target": f"team/{p}", "namespace": "team", "pod": p, "horizon_seconds": "300"}, 0.6)
                                 for p in ("llm-7d9f8c6b5d-aaaaa", "llm-7d9f8c6b5d-bbbbb")])
        if "DCGM" in query:
            return 200, _vector([({"namespace": "team", "pod": p}, 1)
                                 for p in ("llm-7d9f8c6b5d-aaaaa", "llm-7d9f8c6b5d-bbbbb", "llm-7d9f8c6b5d-ccccc")])
        if "kube_deployment_spec_replicas" in query:
            return 200, _vector([({"namespace": "team", "workload": "llm"}, 3)])
        return 200, _vector([])
    return reply


@pytest.mark.parametrize("rules", [True, False], ids=["rules loaded", "rules not loaded"])
def test_recorded_series_decide_as_every_pods_forecasts_do(rules: bool, caplog) -> None:
    """recorded_series: the same demand, missing pods and counts as reading every pod's forecast, in two queries
    without the pod-level ones; without the rules' series (while the sidecars' forecasts are there): an error
    logged once and counted, and every pod's forecast read instead."""
    decisions = {}
    for recorded in (False, True):
        with prometheus_api(_recorded_reply(rules)) as (url, asked):
            scaler = Scaler(ScalerConfig(prometheus_url=url, recorded_series=recorded, target=0.5, margin=0.0),
                            clock=iter(range(0, 10**6, 30)).__next__)
            with caplog.at_level(logging.ERROR, logger="dprobe.services.scaler.reader"):
                scaler.cycle()
                scaler.cycle()
            decisions[recorded] = scaler.decisions[("team", "llm")], scaler.vc_decisions["team"]
            pod_level = [q for _, q in asked if "dprobe_predicted" in q or "DCGM" in q or "kube_pod_owner" in q]
            if recorded and rules:
                assert not [q for q in pod_level if not q.startswith("count(")], pod_level
                assert not scaler.errors_total["recording_rules"]
            if recorded and not rules:
                assert scaler.errors_total["recording_rules"] == 2
                assert sum("none of the series of dprobe's recording rules" in r.getMessage()
                           for r in caplog.records) == 1
    (pods_w, pods_vc), (rec_w, rec_vc) = decisions[False], decisions[True]
    assert (rec_w.demand, rec_w.missing, rec_w.replicas) == pytest.approx((pods_w.demand, pods_w.missing,
                                                                           pods_w.replicas))
    assert (pods_w.demand, pods_w.missing) == pytest.approx((1.2, 1))
    assert (rec_vc.demand, rec_vc.missing, rec_vc.replicas) == pytest.approx((pods_vc.demand, pods_vc.missing,
                                                                              pods_vc.replicas))


@pytest.mark.parametrize(("options", "message"), [
    ({"vc_label": "team"}, "recorded_series needs vc_label: namespace"),
    ({"forecast_selector": 'job="dprobe"'}, "forecast_selector does not select"),
    ({"sharing_enabled": True}, "it needs recorded_series: false"),
])
def test_recorded_series_refuse_what_the_rules_cannot_record(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalerConfig(recorded_series=True, **options).validate()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("promtool") is None or shutil.which("prometheus") is None,
                    reason="no promtool / prometheus (apt-get install prometheus)")
def test_the_fleet_benchmark_runs_on_a_real_prometheus(script, tmp_path) -> None:
    """benchmarks/scale_scaler.py at 10 and 100 workloads (a backfilled TSDB, a real Prometheus with dprobe's rules,
    the scaler as `dprobe scaler` builds it): the same queries a cycle at both sizes, in either mode; the
    recorded series recommend what every pod's forecasts do."""
    bench = script("benchmarks/scale_scaler.py")
    rows = bench.run([10, 100], cycles=2, history=300, step=30, workdir=tmp_path)
    by = {(r["workloads"], r["mode"]): r for r in rows}
    for mode in ("pods", "recorded"):
        assert by[(10, mode)]["queries"] == by[(100, mode)]["queries"], rows
        assert by[(100, mode)]["published"] == 100 and not by[(100, mode)]["errors"], rows
    for n in (10, 100):
        assert by[(n, "recorded")]["replicas"] == by[(n, "pods")]["replicas"], rows
        assert by[(n, "recorded")]["demand"] == pytest.approx(by[(n, "pods")]["demand"], rel=1e-6), rows
    assert "| 100 | 400 | recorded |" in bench.table(rows)


def test_metrics_page_written_directly_holds_the_same_samples_as_generate_latest() -> None:
    """The text /metrics renderer (what Prometheus gets) writes the per-workload families itself: the same samples
    as prometheus_client's, label values escaped alike, unpublished workloads left out, and a follower's page
    without them."""
    from prometheus_client.parser import text_string_to_metric_families

    from dprobe.scaling.policy import Decision

    scaler = Scaler(ScalerConfig())
    scaler.workloads.decisions = {(f"team-{k % 3}", f'svc-{k}"\\x'): Decision(4, 5, 3, 2.5 if k % 2 else None,
                                                                              "forecast", missing=k % 3,
                                                                              published=k != 7)
                                  for k in range(50)}
    scaler.reader.activations.update({("team-0", "svc-0\nz"): (3.0, True), ("team-1", "svc-1"): (0.0, False)})
    scaler.workloads.events.update({("team-1", 'svc-7"\\x', "up"): 3, ("team-0", "svc-0", "down"): 1,
                                    ("svc-9", "up"): 2})  # a workload without a namespace: its values in turn

    def samples(text: bytes) -> list:
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                      for f in text_string_to_metric_families(text.decode()) for s in f.samples)

    fast = scaler.collector.render_text(scaler.registry)
    assert samples(fast) == samples(generate_latest(scaler.registry))
    assert 'dprobe_recommended_replicas{namespace="team-1",workload="svc-7\\"\\\\x"}' not in fast.decode()
    assert fast.decode().count("# TYPE dprobe_recommended_replicas gauge") == 1
    assert fast.decode().count("# TYPE dprobe_scaler_scale_events_total counter") == 1
    assert 'dprobe_scaler_scale_events_total{namespace="team-1",workload="svc-7\\"\\\\x",direction="up"} 3.0' in fast.decode()
    scaler.elector = type("Follower", (), {"is_leader": lambda self: False, "term": 1})()
    follower = scaler.collector.render_text(scaler.registry).decode()
    assert "dprobe_scaler_leader 0.0" in follower and "dprobe_recommended_replicas" not in follower


@pytest.mark.parametrize("n", [10, 100])
def test_activations_query_wakes_every_workload_in_one_query(n: int) -> None:
    """activations_query: one query a cycle for every listed workload at min_replicas 0 without a query of its own,
    each given its own row's value against activations_query_threshold; a workload with a query of its own keeps
    it; a failure is counted once, not once per workload."""
    down = [False]
    base = _fleet_reply(n)

    def reply(query: str) -> tuple[int, dict]:
        if query.startswith("pending_by_workload"):
            if down[0]:
                return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}
            return 200, _vector([({"namespace": "team", "workload": f"svc-{k}"}, float(k)) for k in range(n)]
                                + [({"namespace": "team", "workload": "svc-3"}, 1.0)])  # summed with svc-3's 3
        return base(query)

    listed = [{"namespace": "team", "name": f"svc-{k}", "min_replicas": 0} for k in range(n)]
    listed[1]["activation_query"] = 'sum(queue_length{workload="svc-1"})'
    with prometheus_api(reply) as (url, asked):
        scaler = Scaler(ScalerConfig(prometheus_url=url, workloads=listed, activations_query="pending_by_workload",
                                     activations_query_threshold=2.5), clock=iter(range(0, 10**6, 30)).__next__)
        scaler.cycle()
        before = len(asked)
        scaler.cycle()
        queries = [q for _, q in asked[before:]]
        assert sum(q.startswith("pending_by_workload") for q in queries) == 1 and len(queries) <= 8, queries
        assert scaler.activations[("team", "svc-3")] == (4.0, True)
        assert scaler.activations[("team", "svc-2")] == (2.0, False)
        assert scaler.activations[("team", "svc-1")] == (1.0, True)  # its own query and threshold (0), not the shared
        down[0] = True
        scaler.cycle()
    assert scaler.errors_total["query"] == 1 and ("team", "svc-3") not in scaler.activations


def test_recorded_series_for_another_horizon_or_quantile_are_said_once_counted_and_read_per_pod(caplog) -> None:
    """The rules record 300 s / p90 (their shipped selectors) while the scaler reads 60 s / p50: one line naming both
    (logged once), counted each cycle as a recording_rules error, and every pod's forecast read instead, so that
    the decisions are those of the pod-level read."""
    base = _recorded_reply(True)

    def reply(query: str) -> tuple[int, dict]:
        if query.startswith("label_replace(max by (namespace, owner_kind, owner_name)"):
            if 'horizon_seconds="300",quantile="0.9"' in query:
                return base(query)
            owner = {"namespace": "team", "owner_kind": "Deployment", "owner_name": "llm"}
            return 200, _vector([({**owner, "dprobe_series": "seen"}, 3)])  # the other pair's: none
        if query.startswith("label_replace(max by (namespace)"):
            return 200, _vector([({"namespace": "team", "dprobe_series": "seen"}, 3)])
        if query.startswith("count by (horizon_seconds, quantile)"):
            return 200, _vector([({"horizon_seconds": "300", "quantile": "0.9"}, 1)])
        return base(query)

    decisions = {}
    for recorded in (False, True):
        with prometheus_api(reply) as (url, asked):
            scaler = Scaler(ScalerConfig(prometheus_url=url, recorded_series=recorded, horizon_seconds=60,
                                         quantile=0.5, target=0.5, margin=0.0), clock=iter(range(0, 10**6, 30)).__next__)
            with caplog.at_level(logging.ERROR, logger="dprobe.services.scaler.reader"):
                scaler.cycle()
                scaler.cycle()
            decisions[recorded] = scaler.decisions[("team", "llm")]
    said = [r.getMessage() for r in caplog.records if "not at the scaler's" in r.getMessage()]
    assert said == ["recorded_series: the recording rules record forecasts at horizon_seconds / quantile 300 / 0.9, "
                    "not at the scaler's 60 / 0.5: set horizon_seconds=\"60\", quantile=\"0.5\" in the selectors of "
                    "their group dprobe-scaler-workloads (docs/scaler.md, \"Fleet scale\"); reading every pod's "
                    "forecast instead"], said
    assert scaler.errors_total["recording_rules"] == 2
    assert 'dprobe_scaler_errors_total{stage="recording_rules"} 2.0' in generate_latest(scaler.registry).decode()
    assert any("dprobe_predicted_gpu_utilization_ratio{" in q for _, q in asked)  # read per pod
    assert (decisions[True].demand, decisions[True].missing) == pytest.approx((decisions[False].demand,
                                                                               decisions[False].missing))
    assert decisions[True].demand == pytest.approx(1.2)


def test_the_shipped_recording_rules_record_the_scalers_default_horizon_and_quantile_only() -> None:
    """Every forecast selector of the group dprobe-scaler-workloads names the scaler's default horizon and quantile
    (the cold-start profiles' at the quantile that default reads), so that an evaluation reads one forecast series
    per pod, and the PrometheusRule carries the same rules."""
    from pathlib import Path

    import yaml

    from dprobe.services.scaler.demand import job_profile_quantile

    prometheus = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
    defaults = ScalerConfig().queries
    groups = {g["name"]: g for g in yaml.safe_load((prometheus / "dprobe-rules.yaml").read_text())["groups"]}
    selectors = [s for rule in groups["dprobe-scaler-workloads"]["rules"]
                 for s in re.findall(r"(dprobe_(?:job_)?predicted_gpu_utilization_ratio)\{([^}]*)\}", rule["expr"])]
    assert selectors
    for name, matchers in selectors:
        quantile = job_profile_quantile(defaults) if "_job_" in name else f"{defaults.quantile:g}"
        assert f'quantile="{quantile}"' in matchers, (name, matchers)
        if "_job_" not in name:
            assert f'horizon_seconds="{defaults.horizon_seconds}"' in matchers, (name, matchers)
    shipped = yaml.safe_load((prometheus / "prometheusrule.yaml").read_text())["spec"]["groups"]
    assert {g["name"]: g for g in shipped}["dprobe-scaler-workloads"] == groups["dprobe-scaler-workloads"]


@pytest.mark.parametrize(("vc_label", "by"), [("namespace", "namespace, pod, target"),
                                              ("team", "namespace, pod, target, team")])
def test_every_pods_forecast_is_asked_for_by_the_labels_the_scaler_reads(vc_label: str, by: str) -> None:
    """The pod-level read asks Prometheus for one row per pod and target, ``max by`` the labels the scaler reads
    (the vc_label too), not every series with all its labels; a GPU's own series still left out, the highest of a
    pod's copies kept, an unusable one counted."""
    from dprobe.services.scaler.demand import pod_forecast_query, pod_forecasts

    config = ScalerConfig(vc_label=vc_label)
    query = pod_forecast_query(config.queries, (vc_label,))
    assert query.startswith(f'max by ({by}, horizon_seconds) (dprobe_predicted_gpu_utilization_ratio{{'
                            f'horizon_seconds="300",quantile="0.9",pod!=""}}) or on (namespace, pod) max by ({by}) '
                            f'(dprobe_job_predicted_gpu_utilization_ratio{{quantile="0.9",pod!=""}})'), query

    def reply(q: str) -> tuple[int, dict]:
        return 200, _vector([({"namespace": "team", "pod": "a-0", "target": "team/a-0", "horizon_seconds": "300"}, 0.4),
                             ({"namespace": "team", "pod": "a-0", "target": "GPU-1", "horizon_seconds": "300"}, 0.9),
                             ({"namespace": "team", "pod": "b-0", "target": "team/b-0", "horizon_seconds": "300"}, 1.5)])

    with prometheus_api(reply) as (url, asked):
        rejected: Counter[str] = Counter()
        got = pod_forecasts(ScalerConfig(prometheus_url=url, vc_label=vc_label).queries, rejected, (vc_label,))
    assert [q for _, q in asked] == [query]
    assert {k: v for k, (v, _) in got.items()} == {("team", "a-0"): 0.4} and rejected == {"above_one": 1}
    assert got[("team", "a-0")][1] == ({"namespace": "team"} if vc_label == "namespace" else {})  # what it reads


def test_pods_of_one_virtual_cluster_share_one_labels_dict() -> None:
    """The pod-level read keeps, per pod, only the labels the scaler reads, in one dict per distinct set of values
    (not each row's labels as decoded): GPUs and forecasts alike."""
    from dprobe.services.scaler.demand import pod_forecasts, pod_gpus

    def reply(q: str) -> tuple[int, dict]:
        return 200, _vector([({"namespace": f"ns-{k % 2}", "pod": f"p-{k}", "target": f"ns-{k % 2}/p-{k}",
                               "horizon_seconds": "300", "container": "main", "instance": f"10.0.0.{k}:9477"}, 0.5)
                             for k in range(6)])

    with prometheus_api(reply) as (url, _):
        queries = ScalerConfig(prometheus_url=url).queries
        forecasts = pod_forecasts(queries, keep=("namespace", "horizon_seconds"))
        gpus = pod_gpus(queries, keep=("namespace",))
    for got in (forecasts, gpus):
        dicts = {id(labels) for _, labels in got.values()}
        assert len(got) == 6 and len(dicts) == 2, got
    assert forecasts[("ns-1", "p-3")][1] == {"namespace": "ns-1", "horizon_seconds": "300"}
    assert gpus[("ns-0", "p-2")][1] == {"namespace": "ns-0"}
