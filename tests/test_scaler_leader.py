"""Several scaler replicas: leader election through a Kubernetes Lease. Only the replica holding the Lease
publishes recommendations (and acts); the others serve /metrics without them and take over when it stops."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from test_scaler import ELEVEN, _cluster_reply

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.leader import (
    KubernetesLease,
    LeaderElector,
    LeaseConflict,
    LeaseError,
    LeaseRecord,
)
from dprobe.services.scaler.service import Scaler
from dprobe.services.scaler.state import STATE_ANNOTATION


# the election's rules, on a Lease in memory and a clock of the test's --------------------------------------
class _Store:
    """One Lease in memory, with the API server's optimistic concurrency (a stale version is a conflict)."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.down = False
        self.writes = 0

    def get(self) -> LeaseRecord | None:
        if self.down:
            raise LeaseError("Lease monitoring/dprobe-scaler: read: HTTP 503 Service Unavailable")
        return self.record

    def create(self, record: LeaseRecord) -> None:
        if self.record is not None:
            raise LeaseConflict("exists")
        self._write(record)

    def update(self, record: LeaseRecord) -> None:
        if self.down:
            raise LeaseError("Lease monitoring/dprobe-scaler: update: HTTP 503 Service Unavailable")
        if self.record is None or record.version != self.record.version:
            raise LeaseConflict("stale")
        self._write(record)

    def _write(self, record: LeaseRecord) -> None:
        self.writes += 1
        self.record = replace(record, version=str(self.writes))


def test_the_lease_passes_to_another_replica_only_after_its_holder_stopped_leading() -> None:
    """client-go's rules: the holder renews; another replica takes the Lease only once the holder has not
    renewed it for lease_seconds (on the taker's clock), and the holder stops leading after renew_seconds
    without a renewal, before that; a Lease given up is taken at the next try."""
    now = [0.0]
    store = _Store()
    errors: Counter[str] = Counter()
    a, b = (LeaderElector(store, who, lease_seconds=15, renew_seconds=10, retry_seconds=2, errors=errors,
                          clock=lambda: now[0]) for who in ("a", "b"))
    assert a.try_acquire_or_renew() and a.is_leader() and a.term == 1
    assert not b.try_acquire_or_renew() and not b.is_leader() and b.holder == "a"
    for _ in range(20):  # a renews every 2 s: b never takes it
        now[0] += 2
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
        assert a.is_leader() and not b.is_leader()
    assert a.term == 1 and store.record is not None and store.record.transitions == 0
    store.down = True  # a is cut off from the API server: it keeps leading until renew_seconds, no longer
    renewed = now[0]
    for _ in range(4):
        now[0] += 2
        a.try_acquire_or_renew()
        assert a.is_leader() == (now[0] - renewed < 10)
    assert errors["lease"] == 4
    store.down = False
    while not b.try_acquire_or_renew():  # b saw a's last renewal at `renewed`: it waits lease_seconds from then
        assert not a.is_leader() or now[0] - renewed < 10  # never two leaders
        now[0] += 2
    assert now[0] - renewed >= 15 and b.is_leader() and not a.is_leader() and b.term == 1
    assert store.record.holder == "b" and store.record.transitions == 1
    assert not a.try_acquire_or_renew() and a.holder == "b"  # a reads the Lease again: b's
    b.release()  # a clean stop: the Lease is free at once
    assert not b.is_leader() and store.record.holder == ""
    now[0] += 2
    assert a.try_acquire_or_renew() and a.term == 2 and store.record.transitions == 2
    # two replicas writing the same version: one wins, the other's write is a conflict, not an error
    c = LeaderElector(store, "c", 15, 10, 2, clock=lambda: now[0])
    assert not c.try_acquire_or_renew() and not errors["conflict"]
    with pytest.raises(ValueError, match="retry_seconds < renew_seconds < lease_seconds"):
        LeaderElector(store, "d", lease_seconds=10, renew_seconds=10, retry_seconds=2)


def test_a_replica_may_read_the_lease_without_taking_it() -> None:
    """take=False (sharding: a replica within its share reads the shards it does not hold): the holder renews as
    always; another replica only reads the Lease, and sees it expire lease_seconds after the last renewal it saw,
    on its own clock, without taking it, free or expired."""
    now = [0.0]
    store = _Store()
    a, b = (LeaderElector(store, who, 15, 10, 2, clock=lambda: now[0]) for who in "ab")
    assert not b.try_acquire_or_renew(take=False) and store.record is None and b.holder == ""  # free: not taken
    assert a.try_acquire_or_renew(take=False) is False and store.record is None  # nobody takes it this way
    assert a.try_acquire_or_renew()
    now[0] = 2.0
    assert a.try_acquire_or_renew(take=False) and store.writes == 2  # the holder renews
    assert not b.try_acquire_or_renew(take=False) and b.holder == "a" and not b.expired()
    assert b.seen_renewing(1) and not b.seen_renewing(0)
    now[0] = 16.9  # a is gone since its renewal at 2, which b first saw at 2
    assert not b.try_acquire_or_renew(take=False) and not b.expired()
    now[0] = 17.0
    assert not b.try_acquire_or_renew(take=False) and b.expired() and not a.is_leader()
    assert store.record.holder == "a" and store.writes == 2  # read, never written
    assert b.try_acquire_or_renew() and b.holder == "b" and not b.expired()


def test_lease_times_are_written_as_the_api_server_reads_them() -> None:
    """A Lease's times are metav1.MicroTime: six fractional digits always (a whole second included, where
    isoformat() would drop them and the API server refuse the write)."""
    from kubernetes.client import ApiClient

    whole = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    lease = KubernetesLease("dprobe-scaler", "monitoring", ApiClient())
    body = ApiClient().sanitize_for_serialization(lease._body(LeaseRecord("a", 15, whole, whole.replace(tzinfo=None),
                                                                          0, "7")))
    assert body["spec"]["acquireTime"] == body["spec"]["renewTime"] == "2026-01-02T03:04:05.000000+00:00"
    assert body["metadata"]["resourceVersion"] == "7"


def test_leader_election_options() -> None:
    config = ScalerConfig()
    assert not config.leader_election  # local runs without a cluster: off
    assert (config.leader_election_lease_name, config.leader_election_lease_seconds,
            config.leader_election_renew_seconds, config.leader_election_retry_seconds) == ("dprobe-scaler", 15, 10, 2)
    with pytest.raises(ValueError, match="leader_election_retry_seconds < leader_election_renew_seconds"):
        ScalerConfig(leader_election_renew_seconds=20).validate()
    with pytest.raises(ValueError, match="leader_election_lease_name must be a Kubernetes object name"):
        ScalerConfig(leader_election_lease_name="Dprobe_Scaler").validate()


class _Elector:
    """A stand-in elector: leads while ``leading`` says so (each new lead a new term)."""

    def __init__(self) -> None:
        self.leading, self.term, self.holder, self.identity, self.retry_seconds = False, 0, "other", "me", 0.1

    def lead(self, leading: bool) -> None:
        self.term += leading and not self.leading
        self.leading = leading

    def is_leader(self) -> bool:
        return self.leading

    def handover(self) -> None:  # no Lease: nothing left by a last leader
        return None


def test_only_the_leader_acts_and_a_new_leader_starts_afresh(http_peer) -> None:
    """Apply mode with two replicas: a follower neither reads nor sets a scale; a replica that becomes leader
    starts as a restarted scaler (from the last recommendation Prometheus kept, its windows new)."""
    class Kube:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def replicas(self, spec) -> int:
            self.calls.append(("read", 0))
            return 2

        def scale(self, spec, n: int) -> None:
            self.calls.append(("scale", n))

        def record_event(self, *args: object, **kw: object) -> None:
            pass

    kube, elector = Kube(), _Elector()
    clock = iter(range(0, 10**6, 30))
    with http_peer(_prometheus) as url:
        scaler = Scaler(ScalerConfig(prometheus_url=url, mode="apply", target=0.5, margin=0.0,
                                     workloads=[{"namespace": "serving", "name": "llm"}]),
                        kube=kube, clock=lambda: float(next(clock)), elector=elector)  # type: ignore[arg-type]
        for _ in range(3):
            scaler.cycle()
        assert kube.calls == [] and not scaler.decisions and scaler.ready() == (
            True, "follower, standing by: the Lease dprobe-scaler is held by other, who publishes the recommendations")
        assert "dprobe_scaler_leader 0.0" in generate_latest(scaler.registry).decode()
        elector.lead(True)
        scaler.cycle()
        assert kube.calls == [("read", 0), ("scale", 4)] and scaler.decisions[("serving", "llm")].replicas == 4
        text = generate_latest(scaler.registry).decode()
        assert "dprobe_scaler_leader 1.0" in text and "dprobe_recommended_replicas{" in text
        elector.lead(False)  # the Lease lost: nothing published from this moment, the state dropped
        assert "dprobe_recommended" not in generate_latest(scaler.registry).decode()
        scaler.cycle()
        assert not scaler.decisions and len(kube.calls) == 2
        elector.lead(True)  # leads again: a new term, from the last run's recommendations (4) again
        scaler.cycle()
        assert scaler.workloads.restored == {("serving", "llm"): 4} and elector.term == 2


def _run(config: ScalerConfig, until: int, change, crash_at: int, **b_clocks) -> dict[str, list]:
    """Replicas a and b on one Lease (in memory), and a reference scaler that is never cut off, on the test's
    monotonic clock: every 2 s each live elector tries the Lease, every 30 s each live scaler decides; at ``crash_at``
    a stops as a crash does (no hand-over); ``change(t)`` before each second's tries. Per decision time: which
    replica published, and the leader's and the reference's decisions per workload and virtual cluster."""
    now = [0.0]
    store = _Store()
    electors = {n: LeaderElector(store, n, 15, 10, 2, clock=lambda: now[0]) for n in "ab"}
    scalers = {"a": Scaler(config, clock=lambda: now[0], elector=electors["a"]),
               "b": Scaler(config, clock=lambda: now[0], elector=electors["b"], **b_clocks)}
    reference = Scaler(config, clock=lambda: now[0])
    trace: dict[str, list] = {"leader": [], "leader's": [], "reference's": []}
    for t in range(0, until + 1, 2):
        now[0] = float(t)
        change(t)
        alive = "b" if t >= crash_at else "ab"
        for n in alive:
            electors[n].try_acquire_or_renew()
        if t % 30:
            continue
        reference.cycle()
        for n in alive:
            scalers[n].cycle()
        leader = [n for n in alive if scalers[n].publishing]
        trace["leader"].append((t, "".join(leader)))
        for who, scaler in (("leader's", scalers[leader[0]] if leader else None), ("reference's", reference)):
            trace[who].append({**{k[1]: (d.replicas, d.missing) for k, d in (scaler.decisions if scaler else {}).items()
                                  if d.published},
                               **{k: (d.replicas, d.missing) for k, d in (scaler.vc_decisions if scaler else {}).items()
                                  if d.published}})
    assert store.record is not None and STATE_ANNOTATION in store.record.annotations
    return trace


@pytest.mark.parametrize("wall_step", [0, 3600])
@pytest.mark.slow
def test_a_replica_taking_over_mid_window_goes_on_with_the_same_window(http_peer, wall_step: int) -> None:
    """serving/llm at 8 replicas (8 GPUs) until its demand falls at t = 60 (desired 2): a scale-down window of
    300 s, from the 8 last asked for at t = 30. The leader crashes at t = 150, mid-window; the other replica takes
    the Lease once it expires and goes on from the state the Lease carries: the same decisions as a scaler never
    cut off, 8 until t = 330 and 2 at t = 360 (no early scale-down, no new window). A replica whose wall clock is
    an hour off does not trust the state's age: it starts as a restarted scaler does, a full window from its
    first decision (never sooner)."""
    forecasts = {p: 0.5 for p in ELEVEN[:8]}
    with http_peer(_cluster_reply(forecasts, ELEVEN[:8], replicas={"llm": 8}, previous={"llm": 8},
                                  previous_gpus={"serving": 8})) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0,
                              workloads=[{"namespace": "serving", "name": "llm", "max_replicas": 20}])

        def change(t: int) -> None:
            if t == 60:
                forecasts.update({p: 0.1 for p in ELEVEN[:8]})

        clocks = {"wall_clock": lambda: time.time() + wall_step} if wall_step else {}
        trace = _run(config, 480, change, crash_at=150, **clocks)
    assert trace["leader"] == [(t, "a" if t < 150 else "" if t == 150 else "b") for t in range(0, 481, 30)]
    reference = [d["llm"][0] for d in trace["reference's"]]
    assert reference == [8] * 12 + [2] * 5  # t = 0 ... 330, then 360 ... 480
    got = [d.get("llm", (None,))[0] for d in trace["leader's"]]
    if not wall_step:
        assert got[:5] + got[6:] == reference[:5] + reference[6:]  # (t = 150: nobody publishes)
        assert trace["leader's"][6] == trace["reference's"][6] == {"llm": (8, 0), "serving": (8, 0)}  # b's first
    else:
        assert got[6:] == [8] * 10 + [2]  # from t = 180, its first decision: down at 480


def test_a_new_leader_keeps_the_gpus_a_silent_virtual_cluster_held(http_peer) -> None:
    """serving's 8 pods, a GPU each: 8 GPUs. At t = 60 their sidecars stop and their GPU series go: the cluster is
    held at 8, 8 GPUs missing. The leader crashes at t = 100; the other replica leads from the Lease's state. 3
    pods come back, busy (2.4 GPUs: 5 asked for): 3 of the 8 GPUs it held with a forecast, so held at 8 with 5
    missing, as a scaler never cut off decides, never 8 -> 5 after the window, never "0 missing"."""
    forecasts = {p: 0.5 for p in ELEVEN[:8]}
    gpus = list(ELEVEN[:8])
    with http_peer(_cluster_reply(forecasts, gpus, replicas={}, vc_gpus={}, previous_gpus={"serving": 8})) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, discover=False)

        def change(t: int) -> None:
            if t == 60:
                forecasts.clear()
                gpus.clear()
            if t == 120:
                forecasts.update({p: 0.8 for p in ELEVEN[:3]})
                gpus[:] = ELEVEN[:3]

        trace = _run(config, 480, change, crash_at=100)
    assert [who for _, who in trace["leader"]] == ["a"] * 4 + ["b"] * 13  # b leads from t = 116
    assert trace["leader's"] == trace["reference's"]
    assert trace["leader's"][2:] == [{"serving": (8, 8)}] * 2 + [{"serving": (8, 5)}] * 13


# two scalers against a stand-in Kubernetes API -----------------------------------------------------------
class _LeaseApi(BaseHTTPRequestHandler):
    """The Lease endpoints of the Kubernetes API as the official client calls them: read, create, replace
    (a stale resourceVersion is 409 Conflict, a time not in MicroTime's format 400). A client whose bearer token is in ``server.cut_off`` gets 503, as
    a replica cut off from the API server."""

    LEASE = re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?")
    MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")  # metav1.MicroTime

    def _reply(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code: int, reason: str) -> None:
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                           "code": code, "message": reason})

    def _handle(self, body: dict | None) -> None:
        srv = self.server
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        m = self.LEASE.fullmatch(self.path.split("?")[0])
        if token in srv.cut_off:  # type: ignore[attr-defined]
            return self._status(503, "ServiceUnavailable")
        if m is None:
            return self._status(404, "NotFound")
        ns, name = m.groups()
        times = [body["spec"].get(k) for k in ("acquireTime", "renewTime")] if body else []
        if not all(t is None or self.MICRO_TIME.fullmatch(t) for t in times):
            return self._status(400, "BadRequest")  # as the API server parses a MicroTime
        with srv.lock:  # type: ignore[attr-defined]
            if self.command == "POST":
                name = body["metadata"]["name"]
            key = (ns, name)
            stored = srv.leases.get(key)  # type: ignore[attr-defined]
            if self.command == "GET":
                return self._reply(200, stored) if stored else self._status(404, "NotFound")
            if self.command == "POST" and stored is not None:
                return self._status(409, "AlreadyExists")
            if self.command == "PUT" and (stored is None or body["metadata"].get("resourceVersion")
                                          != stored["metadata"]["resourceVersion"]):
                return self._status(409, "Conflict")
            srv.version += 1  # type: ignore[attr-defined]
            doc = {**body, "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                   "metadata": {**body["metadata"], "namespace": ns, "resourceVersion": str(srv.version)}}  # type: ignore[attr-defined]
            srv.leases[key] = doc  # type: ignore[attr-defined]
            srv.writes.append((token, doc["spec"].get("holderIdentity", "")))  # type: ignore[attr-defined]
        self._reply(201 if self.command == "POST" else 200, doc)

    def do_GET(self) -> None:  # noqa: N802
        self._handle(None)

    def do_POST(self) -> None:  # noqa: N802
        self._handle(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def do_PUT(self) -> None:  # noqa: N802
        self._handle(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def lease_api(tmp_path: Path, tokens: list[str]) -> Iterator[tuple[ThreadingHTTPServer, dict[str, str]]]:
    """A stand-in API server holding Leases, and a kubeconfig per token (one per replica)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _LeaseApi)
    srv.daemon_threads = True
    srv.leases, srv.cut_off, srv.writes, srv.version, srv.lock = {}, set(), [], 0, threading.Lock()  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    configs = {}
    for token in tokens:
        path = tmp_path / f"kubeconfig-{token}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "users": [{"name": "test", "user": {"token": token}}]}))
        configs[token] = str(path)
    try:
        yield srv, configs
    finally:
        srv.shutdown()
        srv.server_close()


def _prometheus(path: str) -> tuple[int, str, float]:
    """Two busy replicas of serving/llm (0.9 each: 4 replicas at target 0.5), one GPU each; the last run's
    recommendation, 4."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
    if "last_over_time(dprobe_recommended_replicas" in query:
        rows = [({"namespace": "serving", "workload": "llm"}, 4)]
    elif "last_over_time" in query:
        rows = [({"vc": "serving"}, 4)]
    elif "dprobe_predicted" in query:
        rows = [({"target": f"serving/{p}", "namespace": "serving", "pod": p}, 0.9) for p in PODS]
    elif "DCGM" in query:
        rows = [({"namespace": "serving", "pod": p}, 1) for p in PODS]
    else:
        rows = []
    return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [0, str(v)]} for m, v in rows]}}), 0.0


PODS = ["llm-7d9f8c6b5d-aaaaa", "llm-7d9f8c6b5d-bbbbb"]
RECOMMENDED = re.compile(r'^dprobe_recommended_replicas\{namespace="serving",workload="llm"\} (\S+)$', re.M)
LEASE, RENEW, RETRY = 2, 1.0, 0.2


@pytest.mark.slow
def test_two_replicas_never_publish_at_once_and_the_other_takes_over(http_peer, tmp_path: Path) -> None:
    """Two scalers on one Lease. At every moment at most one publishes a recommendation (sampled every few
    milliseconds from both /metrics pages throughout); the follower says so on /readyz and
    dprobe_scaler_leader; a leader cut off from the API server stops publishing before the other takes over,
    within the lease duration; a leader that stops cleanly hands over at once; the new leader publishes the
    same count (it starts from the last recommendations, as a restarted scaler)."""
    with http_peer(_prometheus) as prom, lease_api(tmp_path, ["a", "b"]) as (api, kubeconfigs):
        scalers = {token: Scaler(ScalerConfig(
            prometheus_url=prom, listen_address="127.0.0.1", port=0, interval=0.1, target=0.5, margin=0.0,
            workloads=[{"namespace": "serving", "name": "llm"}], leader_election=True, kubeconfig=kubeconfigs[token],
            leader_election_namespace="monitoring", leader_election_lease_seconds=LEASE,
            leader_election_renew_seconds=RENEW, leader_election_retry_seconds=RETRY)) for token in kubeconfigs}
        samples: list[tuple[float, dict[str, str | None]]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                seen = {}
                for token, scaler in scalers.items():
                    found = RECOMMENDED.search(generate_latest(scaler.registry).decode())
                    seen[token] = found.group(1) if found else None
                samples.append((time.monotonic(), seen))
                time.sleep(0.005)

        def publisher(timeout: float, want: str | None = None) -> tuple[str, float]:
            """The one replica publishing (``want``, if given) and when it was seen publishing."""
            start = time.monotonic()
            while time.monotonic() - start < timeout:
                publishing = [t for t, v in samples[-1][1].items() if v] if samples else []
                if len(publishing) == 1 and want in (None, publishing[0]):
                    return publishing[0], samples[-1][0]
                time.sleep(0.002)
            raise AssertionError(f"{want or 'no replica'} did not publish within {timeout} s")

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            for scaler in scalers.values():
                scaler.start()
            sampler.start()
            leader, _ = publisher(5)
            follower = "b" if leader == "a" else "a"
            time.sleep(3 * RENEW)  # several renewals: the same leader throughout
            assert publisher(1)[0] == leader
            with urllib.request.urlopen(f"http://127.0.0.1:{scalers[follower].server.port}/readyz", timeout=5) as r:
                assert r.status == 200 and b"follower, standing by" in r.read()
            text = generate_latest(scalers[follower].registry).decode()
            assert "dprobe_scaler_leader 0.0" in text and "dprobe_recommended" not in text
            assert "dprobe_scaler_leader 1.0" in generate_latest(scalers[leader].registry).decode()

            api.cut_off.add(leader)  # the leader loses the API server: it cannot renew
            cut = time.monotonic()
            _, started = publisher(LEASE + 3, want=follower)
            took_over = started - cut
            # the lease duration from the last renewal it saw, found at its next try (each retry_seconds)
            assert took_over <= LEASE + 3 * RETRY + 0.4, took_over
            stopped = max(t for t, v in samples if v[leader])
            assert stopped - cut < RENEW + 0.5 and started - stopped > 0.3  # stepped down first, with time to spare
            api.cut_off.clear()  # back: it finds the Lease held by the other and stands by
            time.sleep(3 * RETRY)
            leader, follower = follower, leader
            assert publisher(1)[0] == leader

            scalers[leader].stop()  # a clean stop (a rollout): it gives the Lease up, the other takes it at once
            stop = time.monotonic()
            _, started = publisher(LEASE + 3, want=follower)
            assert started - stop < 2 * RETRY + 0.5, started - stop
            time.sleep(0.3)
        finally:
            done.set()
            sampler.join(5)
            for scaler in scalers.values():
                scaler.stop()
    both = [(t, v) for t, v in samples if all(v.values())]
    assert not both, both[:3]  # never two publishers
    assert {v for _, seen in samples for v in seen.values() if v} == {"4.0"}  # and never two counts
    # the Lease was held by the two replicas only, and given up ("") by the one that stopped cleanly
    assert {holder for _, holder in api.writes} == {s.elector.identity for s in scalers.values()} | {""}
    assert len(samples) > 200
