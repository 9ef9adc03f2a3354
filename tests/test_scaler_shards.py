"""Sharding: several scaler replicas, each publishing the workloads and virtual clusters of the shards whose Leases it
holds. Every object has exactly one publisher at every moment (none only while a shard's Lease runs out after its
holder is gone), the shards spread over the live replicas, and a shard's new holder goes on from the state its last
holder left in the shard's Lease."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from test_scaler_leader import _Store, lease_api

from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.leader import LeaderElector
from dprobe.services.scaler.service import Scaler, make_elector
from dprobe.services.scaler.shards import (
    MEMBERS_ANNOTATION,
    ShardedElector,
    members_lease_name,
    shard_lease_names,
    shard_of,
)
from dprobe.services.scaler.state import STATE_ANNOTATION

# one namespace (and virtual cluster) per shard of 3, and a second one in shard 1
NAMESPACES = {"speech": 0, "serving": 1, "batch": 1, "research": 2}
PODS = [f"llm-7d9f8c6b5d-{c * 5}" for c in "abcdefgh"]  # serving/llm's 8 replicas in each namespace, a GPU each
LEASE, RENEW, RETRY = 16, 10, 2  # the lease a multiple of the retry: a takeover falls on the test's steps


def test_the_shard_of_a_namespace_is_a_stable_hash() -> None:
    """crc32 of the name mod the shards: the same in every replica, every run and every Python (no salted hash)."""
    assert {ns: shard_of(ns, 3) for ns in NAMESPACES} == NAMESPACES
    assert shard_of("serving", 3) == zlib.crc32(b"serving") % 3 == 3124594099 % 3
    assert {shard_of(f"ns-{i}", 1) for i in range(100)} == {0}
    spread = Counter(shard_of(f"team-{i}", 4) for i in range(4000))
    assert set(spread) == {0, 1, 2, 3} and max(spread.values()) < 1.1 * min(spread.values())
    assert shard_lease_names("dprobe-scaler", 1) == ["dprobe-scaler"]  # shards: 1 is today's one Lease
    assert shard_lease_names("dprobe-scaler", 3) == [f"dprobe-scaler-shard-{i}" for i in range(3)]
    assert members_lease_name("dprobe-scaler") == "dprobe-scaler-members"


def test_sharding_options() -> None:
    assert ScalerConfig().shards == 1
    ScalerConfig(shards=3, leader_election=True).validate()
    for bad in (0, -1, 257, 1.5, True):
        with pytest.raises(ValueError, match="shards must be a whole number from 1 to 256"):
            ScalerConfig(shards=bad, leader_election=True).validate()
    with pytest.raises(ValueError, match="shards: 3 needs leader_election: true"):
        ScalerConfig(shards=3).validate()
    with pytest.raises(ValueError, match="makes the Lease name 'a{250}-shard-2'"):
        ScalerConfig(shards=3, leader_election=True, leader_election_lease_name="a" * 250).validate()
    ScalerConfig(leader_election=True, leader_election_lease_name="a" * 250).validate()  # one shard: the name itself


def _stores(shards: int) -> tuple[list[_Store], _Store]:
    return [_Store() for _ in range(shards)], _Store()


def _elector(stores: list[_Store], members: _Store, who: str, now: list[float]) -> ShardedElector:
    return ShardedElector(stores, who, members, LEASE, RENEW, RETRY, clock=lambda: now[0])


def test_one_replica_alone_holds_every_shard() -> None:
    """Alone, a replica takes the free shards one a round (so that replicas starting together spread) until it
    holds them all; it renews them, and a second replica sees itself with no room."""
    now = [0.0]
    stores, members = _stores(4)
    a = _elector(stores, members, "a", now)
    held = []
    for _ in range(6):
        held.append(len(a.round()))
        now[0] += RETRY
    assert held == [1, 2, 3, 4, 4, 4] and a.led() == {0: 1, 1: 1, 2: 1, 3: 1}
    assert {s.record.holder for s in stores} == {"a"}
    assert json.loads(members.record.annotations[MEMBERS_ANNOTATION]) == {"a": 6}


def test_replicas_share_the_shards_and_give_some_up_to_one_that_joins() -> None:
    """Three replicas starting together take one shard each. A replica that joins later holds nothing, yet is seen
    through its heartbeat in the members' Lease: the holders above their share (ceil(6 / 4) = 2) give a shard up a
    round, and it takes them; never two holders of a shard."""
    now = [0.0]
    stores, members = _stores(6)
    electors = {who: _elector(stores, members, who, now) for who in "abc"}

    def step() -> None:
        for elector in electors.values():
            elector.round()
        for i in range(len(stores)):
            holders = [w for w, e in electors.items() if e.leads(i)]
            assert len(holders) <= 1, (now[0], i, holders)
        now[0] += RETRY

    for _ in range(5):
        step()
    assert sorted(len(e.led()) for e in electors.values()) == [2, 2, 2]
    electors["d"] = _elector(stores, members, "d", now)
    for _ in range(6):
        step()
    assert sorted(len(e.led()) for e in electors.values()) == [1, 1, 2, 2]
    assert all(e.live == {"a", "b", "c", "d"} for e in electors.values())


def _reply(forecasts: dict[str, float]) -> Callable[[str], tuple[int, str, float]]:
    """A Prometheus API holding, in each namespace of NAMESPACES, serving/llm's 8 pods (a GPU each) with their
    forecast (``forecasts``: namespace -> each pod's p90), kube-state-metrics' 8 replicas and 8 GPUs, and the last
    run's recommendations: 8 replicas, 8 GPUs."""
    def reply(path: str) -> tuple[int, str, float]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        if "last_over_time(dprobe_recommended_replicas" in query or "kube_deployment_spec_replicas" in query:
            rows = [({"namespace": ns, "workload": "llm"}, 8) for ns in NAMESPACES]
        elif "last_over_time(dprobe_recommended_gpus" in query:
            rows = [({"vc": ns}, 8) for ns in NAMESPACES]
        elif "last_over_time" in query:
            rows = []
        elif "kube_pod_container_resource_requests" in query:
            rows = [({"namespace": ns}, 8) for ns in NAMESPACES]
        elif "dprobe_predicted" in query:
            rows = [({"target": f"{ns}/{p}", "namespace": ns, "pod": p}, forecasts[ns]) for ns in NAMESPACES
                    for p in PODS]
        else:  # the GPUs per pod (DCGM)
            rows = [({"namespace": ns, "pod": p}, 1) for ns in NAMESPACES for p in PODS]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, str(float(v))]} for m, v in rows]}}), 0.0
    return reply


def _simulate(url: str, forecasts: dict[str, float], starts: dict[str, int], killed_at: int | None = None
              ) -> tuple[dict[str, dict[str, list]], dict[str, str], list[_Store], str]:
    """Replicas over 3 shards (Leases in memory, with the API server's optimistic concurrency; the test's clock),
    each started at its time in ``starts``, and a reference scaler that is never cut off, until t = 480 in steps of
    2 s: each live replica's round, then its cycle every 30 s and at once for a shard taken, as the service's loop.
    At t = 60 each namespace's demand falls (desired 2). At ``killed_at`` the replica publishing serving dies (no
    hand-over). Per namespace: the publishers at each step, the publisher's count and the reference's at each
    cycle; each live replica's /metrics at the end; the Leases; the replica killed."""
    now = [0.0]
    stores, members = _stores(3)
    config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, leader_election=True, shards=3,
                          workloads=[{"namespace": ns, "name": "llm", "max_replicas": 20} for ns in NAMESPACES])
    reference = Scaler(ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, workloads=config.workloads),
                       clock=lambda: now[0])
    alive: dict[str, Scaler] = {}
    victim = ""
    trace: dict[str, dict[str, list]] = {ns: {"publishers": [], "decided": [], "expected": []} for ns in NAMESPACES}
    for t in range(0, 481, RETRY):
        now[0] = float(t)
        if t == 60:
            forecasts.update(dict.fromkeys(NAMESPACES, 0.1))
        alive.update({who: Scaler(config, clock=lambda: now[0], elector=_elector(stores, members, who, now))
                      for who, at in starts.items() if at == t})
        if t == killed_at:  # serving's publisher dies: it neither renews nor gives its shard up
            victim = next(who for who, s in alive.items() if ("serving", "llm") in s.decisions)
            del alive[victim]
        for scaler in alive.values():
            scaler.elector.round()  # type: ignore[union-attr]
        if t % 30 == 0:
            reference.cycle()
        for scaler in alive.values():  # as the service's loop: every 30 s, and at once for a shard taken
            if scaler._lead() and (t % 30 == 0 or scaler.sharding.gained):  # type: ignore[union-attr]
                scaler.cycle()
        for ns, rows in trace.items():
            who = [w for w, s in alive.items() if (ns, "llm") in s.decisions and s.decisions[(ns, "llm")].published
                   and ns in s.vc_decisions]
            rows["publishers"].append((t, "".join(who)))
            if len(who) == 1 and t % 30 == 0:
                rows["decided"].append((t, alive[who[0]].decisions[(ns, "llm")].replicas))
            if t % 30 == 0:
                rows["expected"].append((t, reference.decisions[(ns, "llm")].replicas))
    metrics = {who: generate_latest(s.registry).decode() for who, s in alive.items()}
    return trace, metrics, stores, victim


def _held(metrics: str) -> list[int]:
    """The shards a replica's /metrics says it publishes."""
    return sorted(int(line.split('"')[1]) for line in metrics.splitlines()
                  if line.startswith("dprobe_scaler_shard_leader{") and line.endswith(" 1.0"))


@pytest.mark.slow
def test_three_replicas_one_killed_every_workload_keeps_one_publisher_and_its_windows(http_peer) -> None:
    """Three replicas over 3 shards, a reference scaler never cut off. Each namespace's llm runs at 8 replicas until
    its demand falls at t = 60 (desired 2): a scale-down window of 300 s from the 8 last asked for at t = 30. At
    t = 150 the holder of serving's shard dies. At every step of 2 s every workload and virtual cluster has exactly
    one publisher, never two, and none only within one lease duration after the death; the replica that takes the
    shard over goes on from the state in its Lease: the same decisions as the reference, 8 until t = 330 and 2 at
    t = 360 (a fresh start would hold 8 until a full window after the takeover)."""
    killed_at, forecasts = 150, dict.fromkeys(NAMESPACES, 0.5)
    with http_peer(_reply(forecasts)) as url:
        trace, metrics, stores, victim = _simulate(url, forecasts, dict.fromkeys("abc", 0), killed_at)
    shard = NAMESPACES["serving"]
    for ns, rows in trace.items():
        assert all(len(who) <= 1 for _, who in rows["publishers"]), ns  # never two publishers
        gap = [t for t, who in rows["publishers"] if not who]
        if NAMESPACES[ns] == shard:  # its shard's Lease runs out, then another replica takes it over
            assert gap and gap[0] == killed_at and gap[-1] < killed_at + LEASE, gap
            assert gap == list(range(killed_at, gap[-1] + 1, RETRY))
        else:
            assert not gap, (ns, gap)
        # the publisher's decisions are the reference's, from before the death to after the window
        assert rows["decided"] == [e for e in rows["expected"] if e[0] not in gap], ns
        assert [n for _, n in rows["expected"]] == [8] * 12 + [2] * 5  # t = 0 ... 330, then 360 ... 480
    assert stores[shard].record.holder != victim and STATE_ANNOTATION in stores[shard].record.annotations
    assert stores[shard].record.transitions == 1
    # what the survivors say of their shards
    assert sorted(sum(map(_held, metrics.values()), [])) == [0, 1, 2]
    assert sorted(len(_held(m)) for m in metrics.values()) == [1, 2]
    assert all("dprobe_scaler_live_replicas 2.0" in m and "dprobe_scaler_shards 3.0" in m for m in metrics.values())


@pytest.mark.slow
def test_shards_given_up_to_replicas_that_join_carry_their_windows(http_peer) -> None:
    """One replica holds the 3 shards alone, mid-window, when two more start at t = 150: it gives two shards up,
    a round each, and the newcomers take them with the state it left in their Leases: the same decisions as a
    scaler never cut off (down at t = 360, not a window after the handover), one publisher at every step and no
    step without one."""
    forecasts = dict.fromkeys(NAMESPACES, 0.5)
    with http_peer(_reply(forecasts)) as url:
        trace, metrics, stores, _ = _simulate(url, forecasts, {"a": 0, "b": 150, "c": 150})
    first = {NAMESPACES[ns]: min(t for t, who in rows["publishers"] if who) for ns, rows in trace.items()}
    assert sorted(first.values()) == [0, 2, 4]  # a takes a free shard a round, and decides it at once
    for ns, rows in trace.items():
        assert all(len(who) == 1 for t, who in rows["publishers"] if t >= first[NAMESPACES[ns]]), ns
        assert rows["decided"] == [e for e in rows["expected"] if e[0] >= first[NAMESPACES[ns]]], ns
        assert [n for _, n in rows["expected"]] == [8] * 12 + [2] * 5
    assert sorted(sum(map(_held, metrics.values()), [])) == [0, 1, 2]
    assert sorted(len(_held(m)) for m in metrics.values()) == [1, 1, 1]
    assert sum(store.record.transitions for store in stores) == 2  # two shards handed over, once each


def test_a_replica_that_loses_a_shard_stops_publishing_it_at_once(http_peer) -> None:
    """The recommendations of a shard whose Lease could not be renewed for renew_seconds leave /metrics at that
    moment, before the next cycle, while the replica's other shards stay published."""
    now = [0.0]
    stores, members = _stores(3)
    with http_peer(_reply(dict.fromkeys(NAMESPACES, 0.5))) as url:
        config = ScalerConfig(prometheus_url=url, target=0.5, margin=0.0, leader_election=True, shards=3,
                              workloads=[{"namespace": ns, "name": "llm"} for ns in NAMESPACES])
        scaler = Scaler(config, clock=lambda: now[0], elector=_elector(stores, members, "a", now))
        elector = scaler.elector
        assert isinstance(elector, ShardedElector)
        for _ in range(3):
            elector.round()
            now[0] += RETRY
        scaler.cycle()
        assert set(scaler.decisions) == {(ns, "llm") for ns in NAMESPACES} and set(scaler.vc_decisions) == set(NAMESPACES)
        stores[1].down = True  # serving's and batch's shard cannot be renewed
        for _ in range(RENEW // RETRY):
            elector.round()
            now[0] += RETRY
        assert not elector.leads(1) and elector.leads(0) and elector.leads(2)
        assert set(scaler.decisions) == {("speech", "llm"), ("research", "llm")}
        assert set(scaler.vc_decisions) == {"speech", "research"}
        text = generate_latest(scaler.registry).decode()
        assert 'dprobe_scaler_shard_leader{shard="1"} 0.0' in text and 'namespace="serving"' not in text
        scaler.cycle()  # the next cycle forgets the shard's objects
        assert not [k for k in scaler.workloads.decisions if k[0] in ("serving", "batch")]


def test_one_shard_is_the_single_lease(tmp_path: Path) -> None:
    """shards: 1 (the default) is today's leader election on the one Lease lease_name; shards: 3 are the shards'
    Leases and the members' Lease, in the same namespace."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "t"}}]}))
    one = make_elector(ScalerConfig(leader_election=True, leader_election_namespace="monitoring").leader,
                       str(kubeconfig), 1.0, Counter())
    assert type(one) is LeaderElector and (one.store.name, one.store.namespace) == ("dprobe-scaler", "monitoring")
    three = make_elector(ScalerConfig(leader_election=True, leader_election_namespace="monitoring", shards=3).leader,
                         str(kubeconfig), 1.0, Counter())
    assert isinstance(three, ShardedElector)
    assert [e.store.name for e in three.electors] == ["dprobe-scaler-shard-0", "dprobe-scaler-shard-1",
                                                      "dprobe-scaler-shard-2"]
    assert three.members.name == "dprobe-scaler-members" and three.members.namespace == "monitoring"
    assert len({e.identity for e in three.electors}) == 1


RECOMMENDED = re.compile(r'^dprobe_recommended_replicas\{namespace="([^"]+)",workload="llm"\} (\S+)$', re.M)


@pytest.mark.slow
def test_three_scalers_on_the_api_server_share_the_shards_and_survive_a_crash(http_peer, tmp_path: Path) -> None:
    """Three scalers with shards: 3 against a stand-in API server (the Leases through the official client, 409 on a
    stale resourceVersion), real threads and time, each /metrics page sampled every few milliseconds: each takes a
    shard; the holder of two namespaces' shard crashes (no hand-over); another takes the shard over within the lease
    duration and its tries, and publishes it at once (not at its next cycle); at no moment do two replicas publish
    one workload."""
    lease, renew, retry = 2, 1.0, 0.2
    with http_peer(_reply(dict.fromkeys(NAMESPACES, 0.5))) as prom, \
            lease_api(tmp_path, ["a", "b", "c"]) as (api, kubeconfigs):
        scalers = {token: Scaler(ScalerConfig(
            prometheus_url=prom, listen_address="127.0.0.1", port=0, interval=30, target=0.5, margin=0.0,
            workloads=[{"namespace": ns, "name": "llm"} for ns in NAMESPACES], leader_election=True, shards=3,
            kubeconfig=kubeconfigs[token], leader_election_namespace="monitoring",
            leader_election_lease_seconds=lease, leader_election_renew_seconds=renew,
            leader_election_retry_seconds=retry)) for token in kubeconfigs}
        alive = dict(scalers)
        samples: list[tuple[float, dict[str, set[str]]]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                seen = {who: {ns for ns, _ in RECOMMENDED.findall(generate_latest(s.registry).decode())}
                        for who, s in list(alive.items())}
                samples.append((time.monotonic(), seen))
                time.sleep(0.005)

        def everyone_published(timeout: float) -> float:
            start = time.monotonic()
            while time.monotonic() - start < timeout:
                if samples and set().union(*samples[-1][1].values()) == set(NAMESPACES):
                    return samples[-1][0]
                time.sleep(0.01)
            raise AssertionError(f"not every namespace published within {timeout} s: {samples[-1:]}")

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            for scaler in scalers.values():
                scaler.start()
            sampler.start()
            everyone_published(5 * lease)
            deadline = time.monotonic() + 5 * lease
            while sorted(len(s.sharding.terms) for s in scalers.values()) != [1, 1, 1]:  # type: ignore[union-attr]
                assert time.monotonic() < deadline, {w: s.sharding.terms for w, s in scalers.items()}
                time.sleep(0.05)
            victim = next(w for w, s in scalers.items() if ("serving", "llm") in s.decisions)
            crashed = time.monotonic()  # as a crash: no more renewals, nothing given up
            del alive[victim]
            scalers[victim].stop_event.set()
            scalers[victim].elector.stop(release=False)  # type: ignore[union-attr]
            time.sleep(0.1)
            while {"serving", "batch"} & set().union(*samples[-1][1].values()):
                time.sleep(0.01)
            took_over = everyone_published(lease + 5 * retry + 2) - crashed
            assert took_over <= lease + 3 * retry + 0.5, took_over
            time.sleep(0.5)
        finally:
            done.set()
            sampler.join(5)
            for who, scaler in scalers.items():
                scaler.stop() if who in alive else scaler.server.stop()  # type: ignore[union-attr]
    for _, seen in samples:
        for ns in NAMESPACES:
            assert sum(ns in published for published in seen.values()) <= 1, (ns, seen)  # never two publishers
    assert len(samples) > 200
    names = {name for _, name in api.leases}
    assert names == {f"dprobe-scaler-shard-{i}" for i in range(3)} | {"dprobe-scaler-members"}
    members = json.loads(api.leases[("monitoring", "dprobe-scaler-members")]["metadata"]["annotations"][
        MEMBERS_ANNOTATION])
    assert set(members) <= {s.elector.identity for s in scalers.values()}
