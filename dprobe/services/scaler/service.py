"""The scaler process: forecasts (Prometheus) -> demand per workload and virtual cluster -> decisions
-> /metrics, logs and, in apply mode, the workloads' scale subresource and the clusters' GPU quotas.

Its parts: :class:`~dprobe.services.scaler.reader.DemandReader` (what Prometheus says),
:class:`~dprobe.services.scaler.ledger.Ledger` (each object's decision state),
:class:`~dprobe.services.scaler.actuator.Actuator` (recommend, or Kubernetes apply) and the
:class:`Scaler` here, which runs the cycle and serves /metrics."""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

from prometheus_client import Histogram
from prometheus_client.registry import CollectorRegistry

from dprobe.scaling.policy import Decision, Recommender
from dprobe.services.exporter.server import ExporterServer, run_until_signalled
from dprobe.services.scaler.actuator import Actuator, ActuatorError, RecommendActuator
from dprobe.services.scaler.collector import ScalerCollector
from dprobe.services.scaler.config import LeaderOptions, ScalerConfig, WorkloadSpec
from dprobe.services.scaler.demand import GROUPING_METHODS, Demand, DemandView
from dprobe.services.scaler.kube import Cluster, KubernetesActuator, ScaleClient, api_client
from dprobe.services.scaler.leader import KubernetesLease, LeaderElector, default_identity, default_namespace
from dprobe.services.scaler.ledger import Ledger, name
from dprobe.services.scaler.reader import DemandReader
from dprobe.services.scaler.shards import ShardCollector, ShardedElector, ShardedScaling, make_sharded_elector
from dprobe.services.scaler.sharing import SharePlan, ShareRecommender, previous_limits, read_pods
from dprobe.services.scaler.state import encode, lease_annotations, resume
from dprobe.services.sources.base import SourceError
from dprobe.services.sources.http import redact_url

log = logging.getLogger(__name__)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _gc_paused(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` with Python's cyclic garbage collector paused while it runs. A cycle makes and drops a few
    objects per pod (the answers' rows): with the collector on, its full collections, each through every object the
    scaler keeps (per workload: a recommender, its windows, decisions), came several times a cycle, and took most of
    a cycle at 5,000 workloads (its cost growing faster than the workloads). What a cycle frees is freed as it
    goes (reference counts); reference cycles it leaves are collected once it is over."""
    @functools.wraps(method)
    def paused(*args: object, **kwargs: object) -> None:
        enabled = gc.isenabled()
        gc.disable()
        try:
            method(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()
    return paused


def make_actuator(config: ScalerConfig, kube: Cluster | None, errors: Counter[str]) -> Actuator:
    """The actuator of ``config.apply.mode``, on ``kube``, else on the configured cluster. In recommend mode it
    reads scales only with a cluster: ``kube``, a ``kubeconfig``, or the pod's own (in a cluster); one it cannot
    use is logged, and no scale is read."""
    apply = config.apply
    if apply.mode != "apply":
        scales: Cluster | ScaleClient | None = kube
        if scales is None and (apply.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST")):
            try:
                scales = ScaleClient(apply.kubeconfig, config.queries.http_timeout)
            except ValueError as exc:
                log.warning("recommend mode reads no workload's scale: %s", exc)
        return RecommendActuator(scales, errors)
    client = kube if kube is not None else ScaleClient(apply.kubeconfig, config.queries.http_timeout)
    return KubernetesActuator(apply, config.vc, config.queries, client, errors)


def make_elector(leader: LeaderOptions, kubeconfig: str, timeout: float,
                 errors: Counter[str]) -> LeaderElector | ShardedElector | None:
    """With ``leader_election``, the elector of this replica on the configured Lease (else None); with ``shards``
    above 1, on the shards' Leases (:mod:`.shards`)."""
    if not leader.enabled:
        return None
    if leader.shards > 1:
        return make_sharded_elector(leader.lease_name, leader.namespace or default_namespace(), leader.shards,
                                    api_client(kubeconfig), timeout, default_identity(), leader.lease_seconds,
                                    leader.renew_seconds, leader.retry_seconds, errors)
    store = KubernetesLease(leader.lease_name, leader.namespace or default_namespace(), api_client(kubeconfig),
                            timeout)
    return LeaderElector(store, default_identity(), leader.lease_seconds, leader.renew_seconds, leader.retry_seconds,
                         errors)


class Scaler:
    """One decision per cycle for every configured workload, discovered workload and virtual cluster.

    The count a decision starts from is the actuator's (:mod:`dprobe.services.scaler.actuator`): in apply mode
    the workload's scale (Kubernetes) and, with ``vc_quota_name``, the virtual cluster's quota; in recommend
    mode (and for what apply mode does not set) the previous recommendation, as if it had been followed, else
    the last run's (the Lease's, Prometheus's), else the replicas (GPUs) kube-state-metrics shows, else the
    workload's scale where Kubernetes lets it be read. A workload's count known from none of these is held,
    unpublished, and never raised by the fallback: never the pods seen. A virtual cluster known from none of
    these starts from the GPUs its pods hold, and is never recommended fewer until its count is read.

    Missing data never lowers a count: pods expected (the workload's scale, else the replicas kube-state-metrics
    shows, else the last recommendation, and every pod seen) without a usable forecast are missing (see
    :mod:`dprobe.scaling.policy`), for listed and discovered workloads alike; a virtual cluster's GPUs
    expected are those its pods hold and those they held at its last decision on data. An answer with no
    forecast at all is an error (counted, /readyz says so); nothing is published for a workload or cluster
    before its first decision on data. A discovered workload whose pods went silent is held while
    kube-state-metrics still shows its replicas, a virtual cluster for ``restore_seconds``.

    With leader election (``elector``), only the replica holding the Lease decides, publishes and acts; the
    others serve /metrics without recommendations. The leader writes its decision state into the Lease
    (:mod:`dprobe.services.scaler.state`), and a replica that starts leading goes on from it: the same counts,
    the same windows.

    Windows, cooldowns and rate limits run on ``clock``, which never steps (``time.monotonic``); ``wall_clock``
    (``time.time``) only stamps what is exported.
    """

    def __init__(self, config: ScalerConfig, kube: Cluster | None = None,
                 clock: Callable[[], float] = time.monotonic, elector: LeaderElector | ShardedElector | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config.validate()
        self.specs: list[WorkloadSpec] = config.workload_specs()
        self.clock, self.wall_clock = clock, wall_clock
        self.errors_total: Counter[str] = Counter()
        self.actuator = make_actuator(config, kube, self.errors_total)
        self.reader = DemandReader(config.queries, config.vc, config.policy.discover, self.specs, self.errors_total)
        self.elector = elector if elector is not None else make_elector(
            config.leader, config.apply.kubeconfig, config.queries.http_timeout, self.errors_total)
        self._term = 0  # the elector's term the decision state below belongs to
        self.last_cycle_at: float | None = None  # wall clock (exported)
        self._fresh()
        # sharding: the workloads and virtual clusters of the shards this replica holds (None: one Lease, or none)
        self.sharding = ShardedScaling(self.elector, clock) if isinstance(self.elector, ShardedElector) else None
        if self.elector is not None and self.sharding is None:
            self.elector.annotate = self._lease_annotations
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_seconds = Histogram("dprobe_scaler_cycle_seconds", "Duration of a decision cycle.",
                                       buckets=CYCLE_BUCKETS, registry=self.registry)
        self.collector = ScalerCollector(self)
        self.registry.register(self.collector)
        if self.sharding is not None:
            self.registry.register(ShardCollector(self.sharding))
        self.stop_event = threading.Event()
        self.server: ExporterServer | None = None
        self._thread: threading.Thread | None = None

    def _fresh(self) -> None:
        """The decision state of a scaler that has just started (again: a replica that starts leading)."""
        self.workloads: Ledger[tuple[str, str]] = Ledger()
        for spec in self.specs:
            self.workloads.recommenders[spec.key] = Recommender(spec.policy)
        self.vcs: Ledger[str] = Ledger()
        self.vc_held_gpus: dict[str, int] = {}
        # vc -> (GPUs its pods held at its last decision on data, when: Unix time), for restore_seconds after it: a
        # restarted scaler reads them back (demand.previous_vc_data)
        self.vc_last_data: dict[str, tuple[int, float]] = {}
        self.vc_pending_gpus: dict[str, float] = {}  # from vc_pending_query
        self.grouped_pods: dict[str, int] = {}  # pods put in a workload last cycle, by method (owner, name)
        self.reader.activations.clear()
        settings = self.config.sharing_settings()
        self.sharing = ShareRecommender(settings) if settings is not None else None
        self.shares: SharePlan | None = None  # the last cycle's shares (sharing enabled)
        self._shares_restored = False  # the last run's memory limits read back (once, at the first cycle)
        self._no_data = False  # the last answer held no usable forecast while pods expected some
        self._state: tuple[str, float] | None = None  # the decision state as saved into the Lease, and when taken
        self._left_out = 0  # objects the last saved state had no room for

    @property
    def publishing(self) -> bool:
        """Whether this replica decides and publishes: always without leader election, else while it leads with
        the decision state of this term (a leader's state is made afresh before it publishes, :meth:`_lead`); with
        sharding, while it holds a shard with this term's state."""
        if self.sharding is not None:
            return self.sharding.publishing()
        elector = self.elector  # one Lease (a ShardedElector always comes with self.sharding)
        return elector is None or (not isinstance(elector, ShardedElector) and elector.is_leader()
                                   and elector.term == self._term)

    def _lead(self) -> bool:
        """:attr:`publishing`; the decision state is made anew whenever this replica starts or stops leading: a
        new leader goes on from the state the last one left in the Lease (else it starts as a restarted scaler,
        from the last recommendations Prometheus kept)."""
        if self.elector is None:
            return True
        if self.sharding is not None:  # per shard: forget those lost, take up those taken from their Leases
            return self.sharding.sync(self)
        elector = self.elector
        if isinstance(elector, ShardedElector):
            raise TypeError(f"a sharded elector needs its shards' scaling, got {elector!r} alone")
        leading = elector.is_leader()
        term = elector.term if leading else -1
        if term != self._term:
            self._fresh()
            self._term = term
            if leading:
                resume(elector.handover(), self.workloads, self.vcs, self.clock(), self.wall_clock(),
                       self.config.queries.restore_seconds,
                       {"workloads": self.config.default_policy, "vcs": self.config.gpu_policy})
        return leading

    def _save(self, now: float) -> None:
        """The decision state the Lease carries to the next leader (with leader election), as of ``now``."""
        if self.sharding is not None:  # each shard's in its own Lease
            self.sharding.save(self.workloads, self.vcs, now)
            return
        text, left_out = encode(self.workloads, self.vcs, now)
        if left_out and not self._left_out:
            log.warning("%d workloads and virtual clusters left out of the Lease's decision state (too large): "
                        "they start afresh after a change of leader", left_out)
        self._state, self._left_out = (text, now), left_out

    def _lease_annotations(self) -> dict[str, str]:
        """What the elector writes into the Lease (from its own thread): the last cycle's state while this
        replica publishes, else nothing (the Lease keeps what it has)."""
        state = self._state
        if state is None or not self.publishing:
            return {}
        return lease_annotations(state[0], self.clock() - state[1])

    # what the collector reads -------------------------------------------------------------------------
    @property
    def decisions(self) -> dict[tuple[str, str], Decision]:
        """The last cycle's decision per workload (with sharding, of the shards this replica holds now)."""
        decisions = self.workloads.decisions
        return decisions if self.sharding is None else self.sharding.filtered(decisions)

    @property
    def vc_decisions(self) -> dict[str, Decision]:
        """The last cycle's decision per virtual cluster (with sharding, of the shards this replica holds now)."""
        decisions = self.vcs.decisions
        return decisions if self.sharding is None else self.sharding.filtered(decisions)

    @property
    def events_total(self) -> Counter[tuple[str, ...]]:
        return self.workloads.events

    @property
    def vc_events_total(self) -> Counter[tuple[str, ...]]:
        return self.vcs.events

    @property
    def rejected_total(self) -> Counter[str]:
        return self.reader.rejected_total

    @property
    def activations(self) -> dict[tuple[str, str], tuple[float, bool]]:
        return self.reader.activations

    @property
    def answer_warnings_total(self) -> int:
        return self.reader.warnings_total

    @property
    def horizon_missing_total(self) -> int:
        return self.reader.horizon_missing_total

    # one cycle ------------------------------------------------------------------------------------
    @_gc_paused
    def cycle(self) -> None:
        if not self._lead():  # a follower: the leader decides
            return
        started = time.perf_counter()
        now = self.clock()
        view = self.reader.read()
        specs, view = (self.specs, view) if self.sharding is None else self.sharding.select(self.specs, view)
        if view is not None:
            self.actuator.prepare(self.reader, self.workloads, self.vcs, now)
        decisions: dict[tuple[str, str], Decision] = {}
        for spec in specs:
            decision = self._guarded(self.workloads, spec.key, partial(self._decide_workload, now, spec, view))
            if decision is not None:
                decisions[spec.key] = decision
        if view is not None:
            decisions.update(self._decide_discovered(now, view.discovered))
            self.vcs.decisions = self._decide_vcs(now, view.vcs)
            self.vc_held_gpus = {vc: d.gpus for vc, d in view.vcs.items()}
            self.grouped_pods = {m: view.grouped.get(m, 0) for m in GROUPING_METHODS}
            self.vc_pending_gpus = {vc: d.pending for vc, d in view.vcs.items() if self.config.vc.pending_query}
            # an answer without a usable forecast while pods expect some: the sidecars are gone or not scraped
            self._no_data = not any(d.covered for d in (*view.workloads.values(), *view.discovered.values(),
                                                     *view.vcs.values())) and any(
                d.demand is None and d.current > 0 for d in (*decisions.values(), *self.vcs.decisions.values()))
            if self.sharing is not None:
                self._share(now, view)
            if self._no_data:
                self.errors_total["no_data"] += 1
                log.log(logging.WARNING if self.errors_total["no_data"] == 1 else logging.DEBUG,
                        "Prometheus answered with no usable forecast (are the sidecars running and scraped?); "
                        "holding every count")
        # (without a view, virtual clusters keep showing their last decision)
        self.workloads.decisions = decisions
        self.last_cycle_at = wall = self.wall_clock()
        keep = self.config.queries.restore_seconds
        self.vc_last_data = {vc: (n, wall - (now - at)) for vc, (at, n) in self.vcs.held.items() if now - at <= keep}
        if self.elector is not None:
            self._save(now)
        self.reader.gpus = {}  # (this cycle's, for its shares: not held between cycles)
        self.reader.take_warnings()  # of every answer of this cycle (partial responses)
        self.cycle_seconds.observe(time.perf_counter() - started)

    def _share(self, now: float, view: DemandView) -> None:
        """This cycle's shares (:mod:`dprobe.services.scaler.sharing`); when a query fails the last ones stay."""
        assert self.sharing is not None
        if not self._shares_restored and self.config.queries.restore_seconds > 0:
            try:
                limits = previous_limits(self.config.queries)
                self.sharing.restore(now, limits)
                if limits:
                    log.info("starting from %d memory limits of the last %g s", len(limits),
                             self.config.queries.restore_seconds)
            except SourceError as exc:
                self.reader.failed("restore memory limits", exc, "starting from this cycle's forecasts")
        self._shares_restored = True
        try:
            pods = read_pods(self.config.queries, self.config.vc.label, self.sharing.settings, view, self.reader.gpus,
                             self.reader.rejected_total)
            self.reader.answered("sharing")
        except SourceError as exc:
            self.reader.failed("sharing", exc, "the last shares kept")
            return
        try:
            shares = self.sharing.recommend(now, pods)
        except Exception:
            self.errors_total["cycle"] += 1
            log.exception("share recommendation failed; the last shares kept")
            return
        before = dict(self.shares.pod_reasons) if self.shares else {}
        for (ns, pod), reason in sorted(shares.pod_reasons.items()):
            if before.get((ns, pod)) != reason:
                log.info("%s/%s keeps the GPUs it holds, not packed: %s", ns, pod, reason)
        self.shares = shares

    def _guarded(self, ledger: Ledger, key: object, decide: Callable[[], Decision | None]) -> Decision | None:
        """``decide()``; a failure is counted and logged and the object keeps its last decision: one
        object's trouble never stops the others' decisions."""
        try:
            return decide()
        except Exception:
            self.errors_total["cycle"] += 1
            log.exception("decision for %s failed", name(key))
            return ledger.decisions.get(key)

    def _actuator_failed(self, exc: ActuatorError) -> None:
        self.errors_total[exc.stage] += 1
        log.warning("%s", exc)

    def _decide_workload(self, now: float, spec: WorkloadSpec, view: DemandView | None) -> Decision | None:
        """A listed workload's decision, from a count read (:meth:`Ledger.start`, else its scale where it can be
        read; else none, unpublished). One at zero replicas with no pods has nothing to forecast: with
        ``min_replicas: 0`` its demand is 0 (its activation query may wake it); otherwise, at a count set in the
        cluster, it was scaled to zero by hand and is left there, as the HPA leaves it. Pods expected
        (:meth:`_expected`) without a forecast are missing."""
        demand = view.workloads.get(spec.key) if view else None
        total = demand.total if demand and demand.covered else None
        covered = demand.covered if demand else 0
        seen = covered + (demand.n_missing if demand else 0)
        active = self.reader.active(spec, self.workloads.decisions.get(spec.key))
        try:
            current = self.actuator.replicas(spec)
        except ActuatorError as exc:
            self._actuator_failed(exc)
            return self.workloads.decisions.get(spec.key)
        scaled = current is not None  # read from the cluster (apply mode)
        if current is None:
            current = self.workloads.start(spec.key)
        elif current == 0 and spec.policy.min_replicas > 0:
            return Decision(0, 0, 0, total, "paused: scaled to zero by hand")
        if current is None:
            current = self.actuator.read_replicas(spec)  # recommend mode, where Kubernetes lets it be read
            scaled = current is not None
        if current is None:
            return self.workloads.unknown(total)
        expected = self._expected(spec.key, current, seen, scaled)
        if total is None and view is not None and expected == 0 and spec.policy.min_replicas == 0:
            total = 0.0  # at zero (a count read), no pods: nothing to forecast
        missing = 0 if view is None else max(0, expected - covered)
        return self._decide(self.workloads, now, spec.key, total, current, partial(self.actuator.scale, spec),
                            "replicas", active, missing, covered)

    def _expected(self, key: tuple[str, str], current: int, seen: int, scaled: bool) -> int:
        """The pods a workload should have, never fewer than those seen: its scale when read from the cluster
        (``scaled``), else the replicas kube-state-metrics shows, else ``current`` (its last recommendation, as
        if followed, or the last run's)."""
        if not scaled and key in self.workloads.counted:
            return max(seen, self.workloads.counted[key])
        return max(current, seen)

    def _decide_discovered(self, now: float, discovered: dict[tuple[str, str], Demand]
                           ) -> dict[tuple[str, str], Decision]:
        """A recommendation (never applied) per discovered workload, with the listed workloads' rules (the pods
        expected, the missing pods, the coverage, :meth:`Ledger.start`). One whose pods went silent is held while
        kube-state-metrics shows its replicas; one whose pods are gone (and kube-state-metrics with them) is
        forgotten."""
        listed = {s.key for s in self.specs}
        silent = {key for key in self.workloads.published - listed - set(discovered)
                  if self.workloads.counted.get(key, 0) > 0}
        out = {}
        for key in [*discovered, *sorted(silent)]:
            demand = discovered.get(key) or Demand()
            self.workloads.recommender(key, self.config.default_policy)
            decision = self._guarded(self.workloads, key, partial(self._decide_one_discovered, now, key, demand))
            if decision is not None:
                out[key] = decision
        for key in set(self.workloads.recommenders) - listed - set(discovered) - silent:
            self.workloads.forget(key)
        return out

    def _decide_one_discovered(self, now: float, key: tuple[str, str], demand: Demand) -> Decision:
        covered = demand.covered
        seen = covered + demand.n_missing
        total = demand.total if demand.covered else None
        current = self.workloads.start(key)
        if current is None:
            return self.workloads.unknown(total)
        missing = max(0, self._expected(key, current, seen, False) - covered)
        return self._decide(self.workloads, now, key, total, current, None, "replicas", missing=missing,
                            covered=covered)

    def _decide_vcs(self, now: float, vcs: dict[str, Demand]) -> dict[str, Decision]:
        """One GPU decision per virtual cluster, from the actuator's count (apply mode with ``vc_quota_name``:
        the GPU limit of that ResourceQuota in the cluster's namespace), else from :meth:`Ledger.start`, else from
        the GPUs its pods hold, never fewer (:meth:`_decide_vc`). The GPUs expected are those its pods hold and,
        for ``restore_seconds`` after its last decision on data (this run's or, restored, the last run's), those
        they held then: missing ones hold the count as a workload's missing pods do. A cluster whose pods all went
        silent is held for ``restore_seconds``, then forgotten (at once if it was never published)."""
        keep = self.config.queries.restore_seconds
        held = self.vcs.held
        silent = {vc for vc in self.vcs.published - set(vcs) if now - held.get(vc, (-math.inf, 0))[0] <= keep}
        out = {}
        for vc in [*vcs, *sorted(silent)]:
            demand = vcs.get(vc)
            self.vcs.recommender(vc, self.config.gpu_policy)
            try:
                quota = self.actuator.gpus(vc)
            except ActuatorError as exc:
                self._actuator_failed(exc)
                if vc in self.vcs.decisions:
                    out[vc] = self.vcs.decisions[vc]
                continue
            decision = self._guarded(self.vcs, vc, partial(self._decide_vc, now, vc, demand, quota))
            if decision is not None:
                out[vc] = decision
        for vc in set(self.vcs.recommenders) - set(vcs) - silent:
            self.vcs.forget(vc)
        for vc in [vc for vc, (at, _) in held.items() if now - at > keep and vc not in vcs]:
            del held[vc]  # restored for a cluster not seen again
        return out

    def _decide_vc(self, now: float, vc: str, demand: Demand | None, quota: int | None) -> Decision:
        """``demand``: None for a cluster absent from this cycle's answer (held). A count read by nothing (no quota,
        no earlier recommendation, and kube-state-metrics not answering; a cluster its answer leaves out runs no
        GPU pod: 0) is not known: nothing is published for the cluster until one is (never a count from the GPUs
        its pods are seen to hold)."""
        silent, demand = demand is None, demand or Demand()
        current = self.vcs.start(vc) if quota is None else quota
        read = quota is not None or (current is not None and self.vcs.read(vc))
        if current is None and self.vcs.counted:  # kube-state-metrics answered: none of its running pods here
            current, read = 0, True
        if current is None:
            return self.vcs.unknown(None if silent else demand.total)
        covered = demand.gpus - demand.missing_gpus
        at, held = self.vcs.held.get(vc, (-math.inf, 0))
        expected = max(demand.gpus, self.vcs.counted.get(vc, 0),
                       held if now - at <= self.config.queries.restore_seconds else 0)
        missing = expected - covered
        total = None if silent or not (demand.covered or demand.pending or not missing) else demand.total
        decision = self._decide(self.vcs, now, vc, total, current, partial(self.actuator.set_gpus, vc), "GPUs",
                                missing=missing, covered=covered, read=read, floor=0 if read else demand.gpus)
        if decision.demand is not None:
            self.vcs.held[vc] = (now, demand.gpus)
        return decision

    def _decide(self, ledger: Ledger, now: float, key: object, demand: float | None, current: int,
                act: Callable[[Decision, float | None], bool] | None, unit: str, active: bool | None = None,
                missing: int = 0, covered: int = 0, read: bool = True, floor: int = 0) -> Decision:
        """Decide (:meth:`Ledger.decide`; ``read``: whether ``current`` was read, see :meth:`Ledger.read`;
        ``floor``: the count not to go below), log a change, ``act`` on it (if given, and while this replica
        leads) and count it by direction."""
        decision = ledger.decide(now, key, demand, current, active, missing, covered, read, floor)
        if decision.replicas != current:
            shown = "no forecast" if demand is None else f"demand {demand:.2f}"
            log.info("%s: %d -> %d %s (%s, %s; desired %d)", name(key), current, decision.replicas, unit,
                     decision.reason, shown, decision.desired)
            if act is not None and not self.publishing:  # the Lease was lost during this cycle
                return decision
            if act is not None and not act(decision, demand):
                ledger.not_applied(now, key, decision)
                return decision
            ledger.changed(key, decision)
        return decision

    # lifecycle ------------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if not self.publishing:  # ready to take over; a rolling update goes on
            assert self.elector is not None
            if self.sharding is not None:
                return True, (f"standing by: no shard held; the {self.sharding.elector.shards} shards are held by "
                              f"{self.elector.holder}")
            return True, (f"follower, standing by: the Lease {self.config.leader.lease_name} is held by "
                          f"{self.elector.holder or 'nobody'}, who publishes the recommendations")
        if self.last_cycle_at is None:
            return False, "no decision cycle yet"
        if self.reader.failure:
            return False, f"cannot read the forecasts: {self.reader.failure}"
        if not self.workloads.restore_answered:
            return False, ("the last run's recommendations cannot be read yet: a count neither set in the cluster "
                           "nor shown by kube-state-metrics is not known, and not published")
        if self._no_data:
            return False, "Prometheus answers with no usable forecast: counts are held"
        return True, f"{len(self.decisions)} workloads, {len(self.vc_decisions)} virtual clusters"

    def _loop(self) -> None:
        interval = self.config.interval
        next_at = due = time.monotonic()
        while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
            if not self._lead():  # a follower looks again soon: it decides as soon as it leads
                assert self.elector is not None
                next_at = time.monotonic() + min(interval, self.elector.retry_seconds / 2)
                continue
            if self.sharding is not None and not self.sharding.gained and time.monotonic() < due:
                assert self.elector is not None  # between cycles, a shard taken over is decided at once
                next_at = min(due, time.monotonic() + self.elector.retry_seconds / 2)
                continue
            try:
                self.cycle()
            except Exception:  # a bug in one cycle must not stop the service
                self.errors_total["cycle"] += 1
                log.exception("decision cycle failed")
            next_at = due = max(next_at + interval, time.monotonic() + 0.05 * interval)
            if self.sharding is not None:  # looks for shards taken over between cycles (above)
                next_at = min(due, time.monotonic() + self.elector.retry_seconds / 2)  # type: ignore[union-attr]

    def start(self, serve: bool = True) -> None:
        if serve:
            self.server = ExporterServer(self.registry, self, **self.config.web.server_kwargs(),
                                         fast=self.collector.render_text)
            self.server.start()
            log.info("serving http://%s:%d/metrics (%s mode, %d configured workloads, forecasts from %s%s)",
                     self.config.web.listen_address, self.server.port, self.actuator.mode, len(self.specs),
                     redact_url(self.config.queries.prometheus.url), "" if self.elector is None else
                     f"; leader election on Lease {self.config.leader.lease_name}"
                     f"{'' if self.sharding is None else f' shards 0-{self.config.leader.shards - 1}'} as "
                     f"{self.elector.identity}")
        if self.elector is not None:
            self.elector.start()
        self._thread = threading.Thread(target=self._loop, name="scaler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop deciding, then give the Lease up (another replica takes over at once), then stop serving."""
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.elector is not None:
            self.elector.stop(release=True)
        if self.server is not None:
            self.server.stop()

    def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the exit code."""
        return run_until_signalled(self.stop_event, self.start, self.stop)
