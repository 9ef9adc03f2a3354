"""The scaler process: forecasts (Prometheus) -> demand per workload and virtual cluster -> decisions
-> /metrics, logs and, in apply mode, the workloads' scale subresource and the clusters' GPU quotas."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from prometheus_client import Histogram
from prometheus_client.registry import CollectorRegistry

from dprobe.services.exporter.server import ExporterServer, run_until_signalled
from dprobe.services.scaler.collector import ScalerCollector
from dprobe.services.scaler.config import ScalerConfig, WorkloadSpec
from dprobe.services.scaler.demand import (
    Demand,
    DemandView,
    activation_value,
    add_pending,
    group_demand,
    pending_gpus,
    pod_forecasts,
    pod_gpus,
    previous_recommendations,
    workload_replicas,
)
from dprobe.services.scaler.kube import KubernetesError, ObjectRef, ScaleClient
from dprobe.services.scaler.policy import Decision, Recommender
from dprobe.services.sources.base import SourceError

log = logging.getLogger(__name__)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Scaler:
    """One decision per cycle for every configured workload, discovered workload and virtual cluster.

    The count a decision starts from: in apply mode the workload's scale (Kubernetes); in recommend
    mode the previous recommendation, as if it had been followed (as KEDA does when it scales on
    ``dprobe_recommended_replicas``; after a restart, the last one Prometheus kept), else the workload's
    replicas as kube-state-metrics shows them, else the pods seen. A virtual cluster starts from its quota's
    GPU limit (apply mode with ``vc_quota_name``), else from its previous recommendation, at first from the
    GPUs its pods hold. Discovered workloads and virtual clusters are forgotten when their pods are gone.

    Missing data never lowers a count: pods expected (the count a decision starts from, and every pod seen
    holding a GPU) without a usable forecast are missing (see :mod:`dprobe.services.scaler.policy`); an answer with no
    forecast at all is an error (counted, /readyz says so); nothing is published for a workload or cluster
    before its first decision on data.
    """

    def __init__(self, config: ScalerConfig, kube: ScaleClient | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config.validate()
        self.specs: list[WorkloadSpec] = config.workload_specs()
        self.apply = config.mode == "apply"
        self.kube = kube if kube is not None or not self.apply else ScaleClient(config.kubeconfig,
                                                                                config.http_timeout)
        self.clock = clock
        self.recommenders: dict[tuple[str, str], Recommender] = {s.key: Recommender(s.policy) for s in self.specs}
        self.vc_recommenders: dict[str, Recommender] = {}
        self.decisions: dict[tuple[str, str], Decision] = {}
        self.vc_decisions: dict[str, Decision] = {}
        self.vc_held_gpus: dict[str, int] = {}
        self.vc_pending_gpus: dict[str, float] = {}  # from vc_pending_query
        self.events_total: Counter[tuple[str, str, str]] = Counter()  # (namespace, workload, direction)
        self.vc_events_total: Counter[tuple[str, str]] = Counter()  # (vc, direction)
        self.errors_total: Counter[str] = Counter()
        self.last_cycle_at: float | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_seconds = Histogram("dprobe_scaler_cycle_seconds", "Duration of a decision cycle.",
                                       buckets=CYCLE_BUCKETS, registry=self.registry)
        self.registry.register(ScalerCollector(self))
        self.stop_event = threading.Event()
        self.server: ExporterServer | None = None
        self._thread: threading.Thread | None = None
        self._gpus_warned = False
        self._query_failure = ""
        self._recommended: set[tuple[str, str]] = set()  # workloads a recommendation was made for
        self.activations: dict[tuple[str, str], tuple[float, bool]] = {}  # activation queries: (value, active)
        self._query_failures: dict[str, str] = {}  # activation and pending queries: the last failure's reason
        self._published: set[tuple[str, str]] = set()  # workloads and (vc, "") with a decision on data
        self.replicas_seen: dict[tuple[str, str], int] = {}  # replicas_query (kube-state-metrics), this cycle
        self.rejected_total: Counter[str] = Counter()  # forecasts left out, by reason
        self._restored: dict[tuple[str, str], int] | None = None  # recommend mode: the last run's recommendations
        self._no_data = False  # the last answer held no usable forecast while pods expected some

    # one cycle ------------------------------------------------------------------------------------
    def read(self) -> DemandView | None:
        """This cycle's demand, or None when Prometheus could not be read (counted, logged)."""
        try:
            forecasts = pod_forecasts(self.config, self.rejected_total)
        except SourceError as exc:
            self.errors_total["query"] += 1
            # once when it starts failing (and again if the reason changes), not every cycle
            (log.warning if str(exc) != self._query_failure else log.debug)("reading forecasts failed: %s", exc)
            self._query_failure = str(exc)
            return None
        if self._query_failure:
            log.info("reading forecasts again after %s", self._query_failure)
            self._query_failure = ""
        gpus: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        try:
            gpus = pod_gpus(self.config)
            self._query_failures.pop("gpus_query", None)
        except SourceError as exc:  # virtual clusters then count one GPU per pod; no pod is known missing
            self._query_failed("gpus_query", exc, "one GPU per pod, pods without forecasts unseen")
        if not self.apply:
            self._restore()
            try:
                self.replicas_seen = workload_replicas(self.config)
                self._query_failures.pop("replicas_query", None)
            except SourceError as exc:
                self.replicas_seen = {}
                self._query_failed("replicas_query", exc, "expected pods from the last recommendations")
        view = group_demand(forecasts, self.specs, gpus, self.config.vc_label, self.config.discover)
        if self.config.vc_pending_query.strip():
            try:
                add_pending(view.vcs, pending_gpus(self.config))
                self._query_failures.pop("vc_pending_query", None)
            except SourceError as exc:  # the clusters' demand is then their pods' forecasts alone
                self._query_failed("vc_pending_query", exc, "demand without waiting GPUs this cycle")
        return view

    def _restore(self) -> None:
        """Once, in recommend mode: the recommendations of the scaler's last run (``restore_seconds``)."""
        if self._restored is not None:
            return
        self._restored = {}
        if self.config.restore_seconds <= 0:
            return
        try:
            workloads, vcs = previous_recommendations(self.config)
        except SourceError as exc:
            self._query_failed("restore", exc, "starting from the pods seen")
            return
        self._restored = {**workloads, **{(vc, ""): n for vc, n in vcs.items()}}
        if self._restored:
            log.info("starting from %d recommendations of the last %g s", len(self._restored),
                     self.config.restore_seconds)

    def _query_failed(self, query: str, exc: SourceError, outcome: str) -> None:
        """Count a failed query; log it once per reason (at debug level while the same reason repeats)."""
        self.errors_total["query"] += 1
        (log.warning if self._query_failures.get(query) != str(exc) else log.debug)(
            "%s failed (%s): %s", query, outcome, exc)
        self._query_failures[query] = str(exc)

    def cycle(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        view = self.read()
        decisions: dict[tuple[str, str], Decision] = {}
        for spec in self.specs:
            decision = self._guarded(spec.key, lambda spec=spec: self._decide_workload(now, spec, view))
            if decision is not None:
                decisions[spec.key] = decision
        if view is not None:
            for key, demand in view.discovered.items():
                rec = self.recommenders.setdefault(key, Recommender(self.config.default_policy()))
                decision = self._guarded(key, lambda key=key, demand=demand, rec=rec: self._recommend(
                    now, key, rec, demand.total if demand.pods else None,
                    self._start(key, len(demand.pods) + len(demand.missing)), missing=len(demand.missing),
                    covered=len(demand.pods)))
                if decision is not None:
                    decisions[key] = decision
            for key in set(self.recommenders) - {s.key for s in self.specs} - set(view.discovered):
                del self.recommenders[key]  # a discovered workload whose pods are gone: forget it all
                self._recommended.discard(key)
                self._published.discard(key)
                for direction in ("up", "down"):
                    self.events_total.pop((*key, direction), None)
            self.vc_decisions = self._decide_vcs(now, view.vcs)
            self.vc_held_gpus = {vc: d.gpus for vc, d in view.vcs.items()}
            self.vc_pending_gpus = {vc: d.pending for vc, d in view.vcs.items() if self.config.vc_pending_query}
            # an answer without a usable forecast while pods expect some: the sidecars are gone or not scraped
            self._no_data = not any(d.pods for d in (*view.workloads.values(), *view.discovered.values(),
                                                     *view.vcs.values())) and any(
                d.demand is None and d.current > 0 for d in (*decisions.values(), *self.vc_decisions.values()))
            if self._no_data:
                self.errors_total["no_data"] += 1
                log.log(logging.WARNING if self.errors_total["no_data"] == 1 else logging.DEBUG,
                        "Prometheus answered with no usable forecast (are the sidecars running and scraped?); "
                        "holding every count")
        # (without a view, virtual clusters keep showing their last decision)
        self.decisions = decisions
        self.last_cycle_at = now
        self.cycle_seconds.observe(time.perf_counter() - started)

    def _guarded(self, key: tuple[str, str], decide: Callable[[], Decision | None]) -> Decision | None:
        """``decide()``; a failure is counted and logged and the workload keeps its last decision: one
        workload's trouble never stops the others' decisions."""
        try:
            return decide()
        except Exception:
            self.errors_total["cycle"] += 1
            log.exception("decision for %s failed", "/".join(filter(None, key)))
            return self.decisions.get(key)

    def _decide_workload(self, now: float, spec: WorkloadSpec, view: DemandView | None) -> Decision | None:
        """A listed workload's decision. One at zero replicas with no pods has nothing to forecast: with
        ``min_replicas: 0`` its demand is 0 (its activation query may wake it; in recommend mode, once
        the zero is known); otherwise, in apply mode, it was scaled to zero by hand and is left there,
        as the HPA leaves it. Pods expected (its scale in apply mode, else :meth:`_start`; and every pod seen
        holding a GPU) without a forecast are missing."""
        demand = view.workloads.get(spec.key) if view else None
        total = demand.total if demand and demand.pods else None
        covered = len(demand.pods) if demand else 0
        seen = covered + (len(demand.missing) if demand else 0)
        active = self._active(spec)
        rec = self.recommenders[spec.key]
        apply = self.kube is not None and self.apply
        if not apply:
            current = self._start(spec.key, seen)
        else:
            try:
                current = self.kube.replicas(spec)
            except KubernetesError as exc:
                self.errors_total["kubernetes"] += 1
                log.warning("%s", exc)
                return self.decisions.get(spec.key)
            if current == 0 and spec.policy.min_replicas > 0:
                return Decision(0, 0, 0, total, "paused: scaled to zero by hand")
        expected = max(current, seen, self.replicas_seen.get(spec.key, 0) if not apply else 0)
        # at zero for sure: the scale read in apply mode, the last recommendation, or the activation query says
        # whether work waits (in recommend mode a workload never recommended may have pods not forecast yet)
        known_zero = apply or spec.key in self._recommended or active is not None
        if total is None and view is not None and expected == 0 and spec.policy.min_replicas == 0 and known_zero:
            total = 0.0
        missing = 0 if view is None else max(0, expected - covered)
        if not apply:
            return self._recommend(now, spec.key, rec, total, current, active, missing, covered)
        return self._decide(now, spec.key, rec, total, current, partial(self.kube.scale, spec), self.events_total,
                            obj=ObjectRef.of(spec), active=active, missing=missing, covered=covered)

    def _active(self, spec: WorkloadSpec) -> bool | None:
        """What the workload's activation query says (None: it has none). A query that fails keeps the
        workload as it is: counted, logged once, taken as active while it runs, inactive at zero."""
        if not spec.activation_query:
            return None
        query = "{}/{}: activation query".format(*spec.key)
        try:
            value = activation_value(self.config, spec.activation_query)
        except SourceError as exc:
            self._query_failed(query, exc, "kept as it is")
            self.activations.pop(spec.key, None)
            previous = self.decisions.get(spec.key)
            return bool(previous and previous.replicas > 0)
        self._query_failures.pop(query, None)
        self.activations[spec.key] = value, value > spec.activation_query_threshold
        return self.activations[spec.key][1]

    def _start(self, key: tuple[str, str], observed: int) -> int:
        """The count a recommend-mode decision starts from: the last recommendation once one has been made
        from a forecast (or the fallback), as if it had been followed; else the last run's (restored), else
        the workload's replicas (``replicas_query``), else the ``observed`` pods."""
        previous = self.decisions.get(key)
        if previous is not None and key in self._recommended:
            return previous.replicas
        if self._restored and key in self._restored:
            return self._restored[key]
        return self.replicas_seen.get(key, observed)

    def _recommend(self, now: float, key: tuple[str, str], rec: Recommender, demand: float | None, current: int,
                   active: bool | None = None, missing: int = 0, covered: int = 0) -> Decision:
        """A recommend-mode decision from ``current`` (:meth:`_start`)."""
        decision = self._decide(now, key, rec, demand, current, None, self.events_total, active=active,
                                missing=missing, covered=covered)
        if decision.demand is not None or decision.reason.startswith("fallback"):
            self._recommended.add(key)
        return decision

    def _decide(self, now: float, key: tuple[str, str], rec: Recommender, demand: float | None, current: int,
                apply: Callable[[int], None] | None, events: Counter, unit: str = "replicas",
                obj: ObjectRef | None = None, active: bool | None = None, missing: int = 0,
                covered: int = 0) -> Decision:
        """Decide, log a change, ``apply`` it (if given; with an Event on ``obj``) and count it in ``events``
        by key and direction. A decision on data (or the fallback) is published from then on."""
        decision = rec.decide(now, demand, current, active, missing, covered)
        if decision.demand is not None or decision.reason.startswith("fallback"):
            self._published.add(key)
        decision = replace(decision, published=key in self._published)
        if decision.replicas != current:
            shown = "no forecast" if demand is None else f"demand {demand:.2f}"
            log.info("%s: %d -> %d %s (%s, %s; desired %d)", "/".join(filter(None, key)), current,
                     decision.replicas, unit, decision.reason, shown, decision.desired)
            if apply is not None:
                try:
                    apply(decision.replicas)
                except KubernetesError as exc:
                    self.errors_total["kubernetes"] += 1
                    log.warning("%s", exc)
                    self._event(obj, "FailedRescale", f"New size: {decision.replicas}; error: {exc}", warning=True)
                    rec.applied(now, decision.replicas, current)
                    return decision
                c = self.config
                why = "no forecast" if demand is None else (
                    f"demand {demand:.2f} {'GPUs' if unit == 'GPUs' else 'pod-equivalents'} "
                    f"(p{100 * c.quantile:g} of GPU utilisation {c.horizon_seconds} s ahead)")
                self._event(obj, "SuccessfulRescale", f"New size: {decision.replicas}; reason: {decision.reason}; {why}")
            events[(*filter(None, key), decision.direction)] += 1
        return decision

    def _event(self, obj: ObjectRef | None, reason: str, message: str, warning: bool = False) -> None:
        """Record a Kubernetes Event on ``obj`` (``events`` option); a failure is counted, logged once."""
        if obj is None or self.kube is None or not self.config.events:
            return
        try:
            self.kube.record_event(obj, reason, message, warning)
        except KubernetesError as exc:
            self.errors_total["events"] += 1
            log.log(logging.WARNING if self.errors_total["events"] == 1 else logging.DEBUG,
                    "%s (further failures to record events are counted in dprobe_scaler_errors_total"
                    "{stage=\"events\"})", exc)

    def _decide_vcs(self, now: float, vcs: dict[str, Demand]) -> dict[str, Decision]:
        """One GPU decision per virtual cluster; in apply mode with ``vc_quota_name``, from and to the GPU
        limit of the ResourceQuota of that name in the cluster's namespace."""
        out = {}
        quotas = self.apply and self.kube is not None and bool(self.config.vc_quota_name)
        name, resource = self.config.vc_quota_name, self.config.vc_quota_resource
        for vc, demand in vcs.items():
            rec = self.vc_recommenders.setdefault(vc, Recommender(self.config.gpu_policy()))
            previous = self.vc_decisions.get(vc)
            if previous is not None and (vc, "") in self._published:
                current = previous.replicas
            else:
                current = (self._restored or {}).get((vc, ""), demand.gpus)
            apply = None
            if quotas:
                try:
                    current = self.kube.quota(vc, name, resource)
                except KubernetesError as exc:
                    self.errors_total["kubernetes"] += 1
                    log.warning("%s", exc)
                    if previous is not None:
                        out[vc] = previous
                    continue
                apply = partial(self.kube.set_quota, vc, name, resource)
            total = demand.total if demand.pods or demand.pending or not demand.missing_gpus else None
            covered = demand.gpus - demand.missing_gpus
            out[vc] = self._guarded((vc, ""), lambda vc=vc, rec=rec, total=total, current=current, apply=apply,
                                    covered=covered, demand=demand: self._decide(
                now, (vc, ""), rec, total, current, apply, self.vc_events_total, "GPUs",
                obj=ObjectRef(vc, "ResourceQuota", name, "v1") if quotas else None,
                missing=demand.missing_gpus, covered=covered))
        for vc in set(self.vc_recommenders) - set(vcs):
            self._published.discard((vc, ""))
            del self.vc_recommenders[vc]
            for direction in ("up", "down"):
                self.vc_events_total.pop((vc, direction), None)
        return out

    # lifecycle ------------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.last_cycle_at is None:
            return False, "no decision cycle yet"
        if self._query_failure:
            return False, f"cannot read the forecasts: {self._query_failure}"
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
                     self.config.listen_address, self.server.port, self.config.mode, len(self.specs),
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
