"""Sharding: several scaler replicas, each deciding, publishing and acting for the namespaces and virtual clusters of
the shards whose Leases it holds.

A namespace's workloads, and a virtual cluster, belong to shard ``crc32(name) mod shards`` (:func:`shard_of`: a
stable hash, the same in every replica and every run; with ``vc_label: namespace`` a namespace's workloads and its
virtual cluster are in one shard). Each shard has its own Lease (``<lease_name>-shard-<i>``), held with the single
Lease's rules (:class:`~.leader.LeaderElector`: renewals, the renew deadline, takeover only once expired, the state
in its annotations), so a shard has at most one publisher at any moment, as a single leader has.

How the shards spread (:class:`ShardedElector`, one round every ``retry_seconds``): a replica counts the live
replicas it can see, the holders of unexpired shard Leases and the members heartbeating in the members' Lease
(``<lease_name>-members``, which lets a replica that holds nothing be seen), and holds at most
``ceil(shards / live)`` of them. Below that share and holding no more than any other replica seen lately, it takes
free shards (never held, or given up) one a round, starting from one of its own (its identity's hash), so that
replicas starting together pick different shards, and expired ones (their holder gone) as many as its share allows
at once; a shard nobody has taken for a further lease duration it takes whatever its share. The most loaded replica
(ties: the first identity) gives one shard up a round while another live replica holds two fewer, writing that
shard's state into its Lease: the next holder goes on from it.

Each shard's decision state travels in its own Lease (:mod:`.state`): the new holder of a shard goes on from the
windows its last holder left there, as a new leader does with one Lease. ``shards: 1`` is the single Lease (named
``lease_name``) and :class:`~.leader.LeaderElector` alone, as without sharding.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from dprobe.scaling.policy import Decision, Recommender
from dprobe.services.scaler.leader import (
    Handover,
    LeaderElector,
    LeaseConflict,
    LeaseError,
    LeaseRecord,
    LeaseStore,
    RenewalThread,
)
from dprobe.services.scaler.state import encode, lease_annotations, resume

if TYPE_CHECKING:
    from dprobe.services.scaler.config import WorkloadSpec
    from dprobe.services.scaler.demand import DemandView
    from dprobe.services.scaler.ledger import Ledger

log = logging.getLogger(__name__)
MEMBERS_ANNOTATION = "dprobe.io/scaler-members"


def shard_of(name: str, shards: int) -> int:
    """The shard of a namespace (its workloads) or a virtual cluster: ``crc32(name) mod shards``."""
    return zlib.crc32(name.encode()) % shards if shards > 1 else 0


def key_name(key: object) -> str:
    """What a scaled object is sharded by: a workload's namespace, a virtual cluster's name."""
    return key[0] if isinstance(key, tuple) else str(key)


def shard_lease_names(lease_name: str, shards: int) -> list[str]:
    """The Leases of the shards: ``lease_name`` itself for one shard, else ``<lease_name>-shard-<i>``."""
    return [lease_name] if shards <= 1 else [f"{lease_name}-shard-{i}" for i in range(shards)]


def members_lease_name(lease_name: str) -> str:
    """The Lease in which the replicas of a sharded scaler heartbeat, so that one holding no shard is seen."""
    return f"{lease_name}-members"


class ShardedElector(RenewalThread):
    """One :class:`~.leader.LeaderElector` per shard's Lease, all with this replica's identity, driven from one
    thread: :meth:`round` renews the shards held, reads the others and takes or gives up shards so that they spread
    over the live replicas (see the module). ``annotate(shard)``: the annotations each write of a shard's Lease sets.
    """

    thread_name = "shard-election"

    def __init__(self, stores: Sequence[LeaseStore], identity: str, members: LeaseStore | None = None,
                 lease_seconds: int = 15, renew_seconds: float = 10.0, retry_seconds: float = 2.0,
                 errors: Counter[str] | None = None, clock: Callable[[], float] | None = None) -> None:
        if not stores:
            raise ValueError("sharding needs at least one shard's Lease")
        self.errors = errors if errors is not None else Counter()
        kw: dict[str, Any] = {"errors": self.errors} if clock is None else {"errors": self.errors, "clock": clock}
        self.electors = [LeaderElector(store, identity, lease_seconds, renew_seconds, retry_seconds, **kw)
                         for store in stores]
        self.clock = self.electors[0].clock
        self.members, self.identity = members, identity
        self.lease_seconds, self.renew_seconds, self.retry_seconds = lease_seconds, renew_seconds, retry_seconds
        self.annotate: Callable[[int], Mapping[str, str]] = lambda shard: {}
        for shard, elector in enumerate(self.electors):
            elector.annotate = functools.partial(self._annotations_of, shard)
        self.first = zlib.crc32(identity.encode()) % len(stores)  # where this replica starts looking for free shards
        self.live: set[str] = {identity}  # the live replicas seen at the last round
        self._beats = 0
        self._members: dict[str, tuple[Any, float]] = {}  # member -> (its last heartbeat seen, own clock then)
        self._unheld: dict[int, float] = {}  # shard -> own clock since when it was seen free or expired
        self._failure = ""  # the last failure of the members' Lease, logged once
        super().__init__()

    @property
    def shards(self) -> int:
        return len(self.electors)

    def _annotations_of(self, shard: int) -> Mapping[str, str]:
        """What a write of ``shard``'s Lease sets (:attr:`annotate`, looked up at each write)."""
        return self.annotate(shard)

    # what the scaler asks --------------------------------------------------------------------------------------
    def leads(self, shard: int) -> bool:
        """Whether this replica holds ``shard``'s Lease now (renewed within ``renew_seconds``)."""
        return self.electors[shard].is_leader()

    def led(self) -> dict[int, int]:
        """The shards held now, each with its term (the times this replica started holding it)."""
        return {i: e.term for i, e in enumerate(self.electors) if e.is_leader()}

    def is_leader(self) -> bool:
        return any(e.is_leader() for e in self.electors)

    def handover(self, shard: int) -> Handover | None:
        return self.electors[shard].handover()

    @property
    def holder(self) -> str:
        """Who holds the shards, as last read (for /readyz)."""
        held = Counter(e.holder for e in self.electors if e.holder)
        return ", ".join(f"{who} ({n})" for who, n in sorted(held.items())) or "nobody"

    # one round ------------------------------------------------------------------------------------------------
    def round(self) -> set[int]:
        """Renew the shards held, read the others, then give one up or take some (see the module); returns the
        shards held after it."""
        recent, fresh = self._heartbeat()
        for elector in self.electors:
            elector.try_acquire_or_renew(take=False)  # renews a shard held; reads the others
        now = self.clock()
        expired = {i for i, e in enumerate(self.electors) if e.expired()}
        gone = {self.electors[i].holder for i in expired}
        holding = Counter(e.holder for i, e in enumerate(self.electors) if e.holder and i not in expired)
        self.live = {self.identity, *holding, *(recent - gone)}
        share = math.ceil(self.shards / len(self.live))
        mine = [i for i, e in enumerate(self.electors) if e.is_leader()]
        unheld = [i for i, e in enumerate(self.electors) if not e.is_leader() and (not e.holder or i in expired)]
        self._unheld = {i: self._unheld.get(i, now) for i in unheld}
        # the replicas seen lately (a heartbeat, a renewal) that would take a shard: the least loaded takes first
        renewing = {e.holder for e in self.electors if e.holder and e.seen_renewing(3 * self.retry_seconds)}
        others = {m: holding.get(m, 0) for m in (fresh | renewing) - gone - {self.identity}}
        least = min(others.values(), default=len(mine))
        if len(mine) - least >= 2 and all((n, self.identity) < (len(mine), m) for m, n in others.items()):
            # the most loaded (ties: the first identity) gives one up a round to the least loaded
            shard = max(mine, key=lambda i: (i - self.first) % self.shards)  # the last in this replica's order
            log.info("giving shard %d up: %d held, %d by another live replica", shard, len(mine), least)
            self.electors[shard].release()
            mine.remove(shard)
        took_free = False
        for i in sorted(unheld, key=lambda i: (i - self.first) % self.shards):
            orphan = now - self._unheld[i] >= self.lease_seconds  # nobody took it for a lease duration
            if not orphan and (len(mine) >= share or len(mine) > least or (took_free and i not in expired)):
                continue  # within its share, left to a replica holding fewer; a free shard a round
            previous = self.electors[i].holder
            if self.electors[i].try_acquire_or_renew():
                mine.append(i)
                took_free = took_free or i not in expired
                log.info("holding shard %d (%s)", i, f"taken over from {previous}" if previous else "it was free")
        return set(mine)

    def _heartbeat(self) -> tuple[set[str], set[str]]:
        """Write this replica's heartbeat into the members' Lease; returns the other members whose heartbeat
        changed within ``lease_seconds`` of this replica's clock (live), and within ``3 × retry_seconds`` (seen
        lately). Without the members' Lease, or when it cannot be read, none."""
        if self.members is None:
            return set(), set()
        now = self.clock()
        try:
            old = self.members.get()
            seen = json.loads(old.annotations.get(MEMBERS_ANNOTATION, "{}")) if old is not None else {}
            if not isinstance(seen, dict):
                raise ValueError(f"{MEMBERS_ANNOTATION} is not a mapping")
        except (LeaseError, ValueError) as exc:
            self._members_failed(exc)
            return set(), set()
        self._members = {m: self._members[m] if m in self._members and self._members[m][0] == beat else (beat, now)
                         for m, beat in seen.items() if m != self.identity}
        self._beats += 1
        # members not heard of for two lease durations are dropped (a replica's identity is new at each start)
        kept = {m: beat for m, beat in seen.items() if m in self._members
                and now - self._members[m][1] < 2 * self.lease_seconds}
        kept[self.identity] = self._beats
        text = json.dumps(kept, sort_keys=True, separators=(",", ":"))
        try:
            if old is None:
                self.members.create(LeaseRecord("", self.lease_seconds, None, None, 0, "",
                                                {MEMBERS_ANNOTATION: text}))
            else:
                self.members.update(LeaseRecord(old.holder, old.lease_seconds, old.acquired, old.renewed,
                                                old.transitions, old.version,
                                                {**old.annotations, MEMBERS_ANNOTATION: text}))
        except LeaseConflict:
            pass  # another member wrote first: again next round
        except LeaseError as exc:
            self._members_failed(exc)
        else:
            if self._failure:
                log.info("the members' Lease answers again")
                self._failure = ""
        live = {m for m, (_, at) in self._members.items() if now - at < self.lease_seconds}
        lately = {m for m in live if now - self._members[m][1] < 3 * self.retry_seconds}
        return live, lately

    def _members_failed(self, exc: Exception) -> None:
        """Count a failed read or write of the members' Lease (a replica holding no shard is not seen meanwhile);
        logged once until it answers again."""
        self.errors["lease"] += 1
        (log.warning if str(exc) != self._failure else log.debug)(
            "the members' Lease (replicas holding no shard are not seen meanwhile): %s", exc)
        self._failure = str(exc)

    # the thread -----------------------------------------------------------------------------------------------
    def renew_round(self) -> float:
        self.round()
        return self.retry_seconds * (1.0 + 0.1 * random.random())

    def release(self) -> None:
        """Give every shard held up (each with its state)."""
        for elector in self.electors:
            elector.release()


def make_sharded_elector(lease_name: str, namespace: str, shards: int, api: Any, timeout: float, identity: str,
                         lease_seconds: int, renew_seconds: float, retry_seconds: float,
                         errors: Counter[str]) -> ShardedElector:
    """The elector of ``shards`` shards on the API server: their Leases and the members' Lease in ``namespace``."""
    from dprobe.services.scaler.leader import KubernetesLease

    stores = [KubernetesLease(n, namespace, api, timeout) for n in shard_lease_names(lease_name, shards)]
    members = KubernetesLease(members_lease_name(lease_name), namespace, api, timeout)
    return ShardedElector(stores, identity, members, lease_seconds, renew_seconds, retry_seconds, errors)


class ShardedScaling:
    """The scaler's side of sharding: which workloads and virtual clusters it decides (those of the shards it holds,
    :meth:`select`) and publishes (those of the shards it holds now, with the state of this term: :meth:`owns`), and
    each shard's decision state, resumed from the shard's Lease when it starts holding it (:meth:`sync`) and written
    into it with each renewal (:meth:`save`, :meth:`annotations`)."""

    def __init__(self, elector: ShardedElector, clock: Callable[[], float]) -> None:
        self.elector, self.clock = elector, clock
        self.terms: dict[int, int] = {}  # shard -> the elector's term the scaler's state of the shard belongs to
        self.states: dict[int, tuple[str, float]] = {}  # shard -> (its state as saved, when taken)
        self.gained = False  # a shard taken since the last cycle: decide it without waiting for the next
        self._left_out = 0
        elector.annotate = self.annotations

    def shard(self, key: object) -> int:
        return shard_of(key_name(key), self.elector.shards)

    def _in_shard(self, shard: int, key: object) -> bool:
        return self.shard(key) == shard

    def owns(self, key: object) -> bool:
        """Whether this replica publishes ``key``'s recommendation now: it holds the shard, with this term's state."""
        shard = self.shard(key)
        elector = self.elector.electors[shard]
        return self.terms.get(shard) == elector.term and elector.is_leader()

    def publishing(self) -> bool:
        return any(self.elector.electors[s].is_leader() and self.elector.electors[s].term == t
                   for s, t in dict(self.terms).items())  # a copy: the scaler's thread changes it

    def sync(self, scaler: Any) -> bool:
        """Before a cycle: forget the objects of the shards no longer held, and take up those of the shards taken
        from their Leases' state (objects it does not carry start as after a restart, from the last
        recommendations Prometheus kept). True while some shard is held."""
        led = self.elector.led()
        for shard, term in list(self.terms.items()):
            if led.get(shard) != term:
                log.warning("no longer holding shard %d: its workloads and virtual clusters are another replica's",
                            shard)
                self._drop(scaler, shard)
                del self.terms[shard]
                self.states.pop(shard, None)
        for shard, term in sorted(led.items()):
            if shard in self.terms:
                continue
            self._drop(scaler, shard)
            n = resume(self.elector.handover(shard), scaler.workloads, scaler.vcs, scaler.clock(), scaler.wall_clock(),
                       scaler.config.queries.restore_seconds,
                       {"workloads": scaler.config.default_policy, "vcs": scaler.config.gpu_policy},
                       keep=functools.partial(self._in_shard, shard))
            log.info("holding shard %d of %d: %d workloads and virtual clusters resumed from its Lease", shard,
                     self.elector.shards, n)
            scaler.workloads.restore_answered = scaler.vcs.restore_answered = False  # the others: from Prometheus
            self.terms[shard] = term
            self.gained = True
        return bool(self.terms)

    def _drop(self, scaler: Any, shard: int) -> None:
        """Forget what the scaler holds of ``shard``'s objects (a listed workload keeps a new recommender)."""
        ledgers: tuple[Ledger[Any], ...] = (scaler.workloads, scaler.vcs)
        for ledger in ledgers:
            keys = {*ledger.recommenders, *ledger.decisions, *ledger.restored, *ledger.held, *ledger.published}
            for key in keys:
                if self.shard(key) == shard:
                    ledger.forget(key)
        specs: list[WorkloadSpec] = scaler.specs
        for spec in specs:
            if self.shard(spec.key) == shard:
                scaler.workloads.recommenders[spec.key] = Recommender(spec.policy)
        for table in (scaler.reader.activations, scaler.vc_held_gpus, scaler.vc_pending_gpus, scaler.vc_last_data):
            for key in [k for k in table if self.shard(k) == shard]:
                del table[key]

    def select(self, specs: list[WorkloadSpec], view: DemandView | None
               ) -> tuple[list[WorkloadSpec], DemandView | None]:
        """The listed workloads and the cycle's demand of the shards this replica holds."""
        self.gained = False
        held = set(self.terms)
        specs = [s for s in specs if self.shard(s.key) in held]
        if view is None:
            return specs, None
        return specs, replace(view, workloads={k: d for k, d in view.workloads.items() if self.shard(k) in held},
                              discovered={k: d for k, d in view.discovered.items() if self.shard(k) in held},
                              vcs={k: d for k, d in view.vcs.items() if self.shard(k) in held})

    def filtered(self, decisions: Mapping[Any, Decision]) -> dict[Any, Decision]:
        """``decisions`` of the objects this replica publishes now (:meth:`owns`)."""
        return {k: d for k, d in dict(decisions).items() if self.owns(k)}  # a copy: the cycle may forget some

    def save(self, workloads: Ledger[tuple[str, str]], vcs: Ledger[str], now: float) -> None:
        """Each held shard's decision state as of ``now``, for its Lease."""
        left_out = 0
        for shard in self.terms:
            text, n = encode(workloads, vcs, now, keep=functools.partial(self._in_shard, shard))
            self.states[shard] = (text, now)
            left_out += n
        if left_out and not self._left_out:
            log.warning("%d workloads and virtual clusters left out of their shard's Lease state (too large): they "
                        "start afresh after a change of holder", left_out)
        self._left_out = left_out

    def annotations(self, shard: int) -> dict[str, str]:
        """What a write of ``shard``'s Lease sets (from the election's thread): its last saved state while this
        replica holds it with this term's state, else nothing (the Lease keeps what it has)."""
        state = self.states.get(shard)
        elector = self.elector.electors[shard]
        if state is None or self.terms.get(shard) != elector.term or not elector.is_leader():
            return {}
        return lease_annotations(state[0], self.clock() - state[1])


class ShardCollector:
    """``dprobe_scaler_shard_leader{shard}`` (1 for each shard this replica publishes, else 0), the shards and the
    live replicas it sees."""

    def __init__(self, sharding: ShardedScaling) -> None:
        self.sharding = sharding

    def collect(self) -> Iterator[Metric]:
        s = self.sharding
        held = GaugeMetricFamily("dprobe_scaler_shard_leader", "1 while this replica holds the shard's Lease and "
                                 "publishes its workloads' and virtual clusters' recommendations, else 0.",
                                 labels=["shard"])
        for shard in range(s.elector.shards):
            elector = s.elector.electors[shard]
            held.add_metric([str(shard)], 1.0 if s.terms.get(shard) == elector.term and elector.is_leader() else 0.0)
        yield held
        yield GaugeMetricFamily("dprobe_scaler_shards", "Shards the namespaces and virtual clusters are spread over "
                                "(shards).", value=s.elector.shards)
        yield GaugeMetricFamily("dprobe_scaler_live_replicas", "Scaler replicas this replica saw live at its last "
                                "round (the shards' holders and the members' heartbeats), itself included.",
                                value=len(s.elector.live))
