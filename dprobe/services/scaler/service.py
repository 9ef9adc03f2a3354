"""The scaler process: forecasts (Prometheus) -> demand per workload and virtual cluster -> decisions
-> /metrics, logs and, in apply mode, the workloads' scale subresource and the clusters' GPU quotas.

Its parts: :class:`~dprobe.services.scaler.reader.DemandReader` (what Prometheus says),
:class:`~dprobe.services.scaler.ledger.Ledger` (each object's decision state),
:class:`~dprobe.services.scaler.actuator.Actuator` (recommend, or Kubernetes apply) and the
:class:`Scaler` here, which runs the cycle and serves /metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

from prometheus_client import Histogram
from prometheus_client.registry import CollectorRegistry

from dprobe.services.exporter.server import ExporterServer, run_until_signalled
from dprobe.services.scaler.actuator import Actuator, ActuatorError, RecommendActuator
from dprobe.services.scaler.collector import ScalerCollector
from dprobe.services.scaler.config import ScalerConfig, WorkloadSpec
from dprobe.services.scaler.demand import GROUPING_METHODS, Demand, DemandView
from dprobe.services.scaler.kube import Cluster, KubernetesActuator, ScaleClient
from dprobe.services.scaler.ledger import Ledger, name
from dprobe.services.scaler.policy import Decision, Recommender
from dprobe.services.scaler.reader import DemandReader
from dprobe.services.scaler.sharing import SharePlan, ShareRecommender, previous_limits, read_pods
from dprobe.services.sources.base import SourceError

log = logging.getLogger(__name__)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def make_actuator(config: ScalerConfig, kube: Cluster | None, errors: Counter[str]) -> Actuator:
    """The actuator of ``config.mode``; in apply mode on ``kube``, else on the configured cluster."""
    if config.mode != "apply":
        return RecommendActuator()
    return KubernetesActuator(config, kube if kube is not None else ScaleClient(config.kubeconfig,
                                                                               config.http_timeout), errors)


class Scaler:
    """One decision per cycle for every configured workload, discovered workload and virtual cluster.

    The count a decision starts from is the actuator's (:mod:`dprobe.services.scaler.actuator`): in apply mode
    the workload's scale (Kubernetes) and, with ``vc_quota_name``, the virtual cluster's quota; in recommend
    mode (and for what apply mode does not set) the previous recommendation, as if it had been followed, else
    the last run's, else the replicas kube-state-metrics shows, else the pods seen (a virtual cluster: the
    GPUs its pods hold). Discovered workloads and virtual clusters are forgotten when their pods are gone.

    Missing data never lowers a count: pods expected (the count a decision starts from, and every pod seen
    holding a GPU) without a usable forecast are missing (see :mod:`dprobe.services.scaler.policy`); an answer
    with no forecast at all is an error (counted, /readyz says so); nothing is published for a workload or
    cluster before its first decision on data.
    """

    def __init__(self, config: ScalerConfig, kube: Cluster | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config.validate()
        self.specs: list[WorkloadSpec] = config.workload_specs()
        self.clock = clock
        self.errors_total: Counter[str] = Counter()
        self.actuator = make_actuator(config, kube, self.errors_total)
        self.reader = DemandReader(config, self.specs, self.errors_total)
        self.workloads: Ledger[tuple[str, str]] = Ledger()
        for spec in self.specs:
            self.workloads.recommenders[spec.key] = Recommender(spec.policy)
        self.vcs: Ledger[str] = Ledger()
        self.vc_held_gpus: dict[str, int] = {}
        self.vc_pending_gpus: dict[str, float] = {}  # from vc_pending_query
        self.grouped_pods: dict[str, int] = {}  # pods put in a workload last cycle, by method (owner, name)
        self.last_cycle_at: float | None = None
        settings = config.sharing_settings()
        self.sharing = ShareRecommender(settings) if settings is not None else None
        self.shares: SharePlan | None = None  # the last cycle's shares (sharing enabled)
        self._shares_restored = False  # the last run's memory limits read back (once, at the first cycle)
        self._no_data = False  # the last answer held no usable forecast while pods expected some
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_seconds = Histogram("dprobe_scaler_cycle_seconds", "Duration of a decision cycle.",
                                       buckets=CYCLE_BUCKETS, registry=self.registry)
        self.registry.register(ScalerCollector(self))
        self.stop_event = threading.Event()
        self.server: ExporterServer | None = None
        self._thread: threading.Thread | None = None

    # what the collector reads -------------------------------------------------------------------------
    @property
    def decisions(self) -> dict[tuple[str, str], Decision]:
        """The last cycle's decision per workload."""
        return self.workloads.decisions

    @property
    def vc_decisions(self) -> dict[str, Decision]:
        """The last cycle's decision per virtual cluster."""
        return self.vcs.decisions

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

    # one cycle ------------------------------------------------------------------------------------
    def cycle(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        view = self.reader.read()
        if view is not None:
            self.actuator.prepare(self.reader, self.workloads, self.vcs)
        decisions: dict[tuple[str, str], Decision] = {}
        for spec in self.specs:
            decision = self._guarded(self.workloads, spec.key, partial(self._decide_workload, now, spec, view))
            if decision is not None:
                decisions[spec.key] = decision
        if view is not None:
            decisions.update(self._decide_discovered(now, view.discovered))
            self.vcs.decisions = self._decide_vcs(now, view.vcs)
            self.vc_held_gpus = {vc: d.gpus for vc, d in view.vcs.items()}
            self.grouped_pods = {m: view.grouped.get(m, 0) for m in GROUPING_METHODS}
            self.vc_pending_gpus = {vc: d.pending for vc, d in view.vcs.items() if self.config.vc_pending_query}
            # an answer without a usable forecast while pods expect some: the sidecars are gone or not scraped
            self._no_data = not any(d.pods for d in (*view.workloads.values(), *view.discovered.values(),
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
        self.last_cycle_at = now
        self.cycle_seconds.observe(time.perf_counter() - started)

    def _share(self, now: float, view: DemandView) -> None:
        """This cycle's shares (:mod:`dprobe.services.scaler.sharing`); when a query fails the last ones stay."""
        assert self.sharing is not None
        if not self._shares_restored and self.config.restore_seconds > 0:
            try:
                limits = previous_limits(self.config)
                self.sharing.restore(now, limits)
                if limits:
                    log.info("starting from %d memory limits of the last %g s", len(limits),
                             self.config.restore_seconds)
            except SourceError as exc:
                self.reader.failed("restore memory limits", exc, "starting from this cycle's forecasts")
        self._shares_restored = True
        try:
            pods = read_pods(self.config, self.sharing.settings, view, self.reader.gpus, self.reader.rejected_total)
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
        """A listed workload's decision. One at zero replicas with no pods has nothing to forecast: with
        ``min_replicas: 0`` its demand is 0 (its activation query may wake it; from a recommendation, once
        the zero is known); otherwise, at a count set in the cluster, it was scaled to zero by hand and is left
        there, as the HPA leaves it. Pods expected (the count it starts from, the replicas kube-state-metrics
        shows, and every pod seen holding a GPU) without a forecast are missing."""
        demand = view.workloads.get(spec.key) if view else None
        total = demand.total if demand and demand.pods else None
        covered = len(demand.pods) if demand else 0
        seen = covered + (len(demand.missing) if demand else 0)
        active = self.reader.active(spec, self.workloads.decisions.get(spec.key))
        try:
            current = self.actuator.replicas(spec)
        except ActuatorError as exc:
            self._actuator_failed(exc)
            return self.workloads.decisions.get(spec.key)
        # at zero for sure: the count set in the cluster, the last recommendation, or the activation query says
        # whether work waits (a workload never recommended for may have pods not forecast yet)
        known_zero = current is not None or spec.key in self.workloads.published or active is not None
        if current is None:
            current = self.workloads.start(spec.key, seen)
        elif current == 0 and spec.policy.min_replicas > 0:
            return Decision(0, 0, 0, total, "paused: scaled to zero by hand")
        expected = max(current, seen, self.workloads.counted.get(spec.key, 0))
        if total is None and view is not None and expected == 0 and spec.policy.min_replicas == 0 and known_zero:
            total = 0.0
        missing = 0 if view is None else max(0, expected - covered)
        return self._decide(self.workloads, now, spec.key, total, current, partial(self.actuator.scale, spec),
                            "replicas", active, missing, covered)

    def _decide_discovered(self, now: float, discovered: dict[tuple[str, str], Demand]
                           ) -> dict[tuple[str, str], Decision]:
        """A recommendation (never applied) per discovered workload, from :meth:`Ledger.start`; those whose pods
        are gone are forgotten."""
        out = {}
        for key, demand in discovered.items():
            self.workloads.recommender(key, self.config.default_policy)
            decision = self._guarded(self.workloads, key, lambda key=key, demand=demand: self._decide(
                self.workloads, now, key, demand.total if demand.pods else None,
                self.workloads.start(key, len(demand.pods) + len(demand.missing)), None, "replicas",
                missing=len(demand.missing), covered=len(demand.pods)))
            if decision is not None:
                out[key] = decision
        for key in set(self.workloads.recommenders) - {s.key for s in self.specs} - set(discovered):
            self.workloads.forget(key)
        return out

    def _decide_vcs(self, now: float, vcs: dict[str, Demand]) -> dict[str, Decision]:
        """One GPU decision per virtual cluster, from the actuator's count (apply mode with ``vc_quota_name``:
        the GPU limit of that ResourceQuota in the cluster's namespace), else from :meth:`Ledger.start`."""
        out = {}
        for vc, demand in vcs.items():
            self.vcs.recommender(vc, self.config.gpu_policy)
            try:
                held = self.actuator.gpus(vc)
            except ActuatorError as exc:
                self._actuator_failed(exc)
                if vc in self.vcs.decisions:
                    out[vc] = self.vcs.decisions[vc]
                continue
            current = self.vcs.start(vc, demand.gpus) if held is None else held
            total = demand.total if demand.pods or demand.pending or not demand.missing_gpus else None
            covered = demand.gpus - demand.missing_gpus
            decision = self._guarded(self.vcs, vc, lambda vc=vc, total=total, current=current, covered=covered,
                                     demand=demand: self._decide(
                self.vcs, now, vc, total, current, partial(self.actuator.set_gpus, vc), "GPUs",
                missing=demand.missing_gpus, covered=covered))
            if decision is not None:
                out[vc] = decision
        for vc in set(self.vcs.recommenders) - set(vcs):
            self.vcs.forget(vc)
        return out

    def _decide(self, ledger: Ledger, now: float, key: object, demand: float | None, current: int,
                act: Callable[[Decision, float | None], bool] | None, unit: str, active: bool | None = None,
                missing: int = 0, covered: int = 0) -> Decision:
        """Decide (:meth:`Ledger.decide`), log a change, ``act`` on it (if given) and count it by direction."""
        decision = ledger.decide(now, key, demand, current, active, missing, covered)
        if decision.replicas != current:
            shown = "no forecast" if demand is None else f"demand {demand:.2f}"
            log.info("%s: %d -> %d %s (%s, %s; desired %d)", name(key), current, decision.replicas, unit,
                     decision.reason, shown, decision.desired)
            if act is not None and not act(decision, demand):
                ledger.not_applied(now, key, decision)
                return decision
            ledger.changed(key, decision)
        return decision

    # lifecycle ------------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.last_cycle_at is None:
            return False, "no decision cycle yet"
        if self.reader.failure:
            return False, f"cannot read the forecasts: {self.reader.failure}"
        if self._no_data:
            return False, "Prometheus answers with no usable forecast: counts are held"
        return True, f"{len(self.decisions)} workloads, {len(self.vc_decisions)} virtual clusters"

    def _loop(self) -> None:
        interval = self.config.interval
        next_at = time.monotonic()
        while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.cycle()
            except Exception:  # a bug in one cycle must not stop the service
                self.errors_total["cycle"] += 1
                log.exception("decision cycle failed")
            next_at = max(next_at + interval, time.monotonic() + 0.05 * interval)

    def start(self, serve: bool = True) -> None:
        if serve:
            self.server = ExporterServer(self.registry, self, self.config.listen_address, self.config.port)
            self.server.start()
            log.info("serving http://%s:%d/metrics (%s mode, %d configured workloads, forecasts from %s)",
                     self.config.listen_address, self.server.port, self.actuator.mode, len(self.specs),
                     self.config.prometheus_url)
        self._thread = threading.Thread(target=self._loop, name="scaler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.server is not None:
            self.server.stop()

    def run(self) -> int:
        """Run until SIGTERM / SIGINT; returns the exit code."""
        return run_until_signalled(self.stop_event, self.start, self.stop)
