"""What the scaler reads from Prometheus each cycle: the demand view, the activation queries and the counts a
decision starts from where it does not set them (kube-state-metrics', the last run's recommendations). A failed
query is counted (``errors["query"]``) and logged once per reason, at debug level while the same reason repeats."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dprobe.scaling.policy import Decision
from dprobe.services.scaler.config import QueryOptions, VcOptions, WorkloadSpec
from dprobe.services.scaler.demand import (
    DemandView,
    activation_values,
    add_pending,
    answer_warnings,
    exported_horizons,
    group_demand,
    pending_gpus,
    pod_forecasts,
    pod_gpus,
    pod_owners,
    pods_forecast,
    previous_recommendations,
    previous_vc_data,
    recorded_demand,
    recorded_pairs,
    vc_gpus,
    workload_replicas,
    workload_values,
)
from dprobe.services.sources.base import SourceError

log = logging.getLogger(__name__)


class DemandReader:
    """The Prometheus queries of one scaler (``queries``), its virtual clusters (``vc``) and whether it ``discover``s
    workloads not in ``specs``; ``errors``: the scaler's error counts, by stage."""

    def __init__(self, queries: QueryOptions, vc: VcOptions, discover: bool, specs: list[WorkloadSpec],
                 errors: Counter[str]) -> None:
        self.queries, self.vc, self.discover, self.specs, self.errors = queries, vc, discover, specs, errors
        self.rejected_total: Counter[str] = Counter()  # forecasts left out, by reason
        self.activations: dict[tuple[str, str], tuple[float, bool]] = {}  # activation queries: (value, active)
        self.failure = ""  # why the forecasts could not be read ('' while they can)
        self._failures: dict[str, str] = {}  # the other queries: the last failure's reason
        self.grouping = ""  # how pods were last put in workloads: "owner" (kube-state-metrics), "name", ""
        # this cycle's GPUs per pod (the pod-level read; for GPU shares), let go of before the next cycle's answers
        self.gpus: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        self.warnings_total = 0  # warnings Prometheus sent with its answers (partial responses)
        self._warned: set[str] = set()  # the warnings logged already
        self.horizon_missing_total = 0  # cycles without a forecast at horizon_seconds while others were exported
        self._horizons: tuple[str, ...] = ()  # the other horizons found, last warned of
        self._activation_values: dict[str, float] = {}  # this cycle's activation queries: value
        self._activation_errors: dict[str, SourceError] = {}  # or why they failed
        self._batch_failed: set[str] = set()  # those whose batch failed as a whole (counted once, for them all)
        self._shared: dict[tuple[str, str], float] = {}  # this cycle's activations_query, per workload
        self._shared_error: SourceError | None = None  # or why it failed
        self._rules_missing = False  # recorded_series: the recording rules' series were not there last cycle
        self._pairs: tuple[tuple[str, str], ...] = ()  # recorded_series: the other pairs recorded, last warned of
        # the pod-level read's other queries, asked while the forecasts' answer is awaited and parsed: Prometheus
        # evaluates them on its other cores meanwhile (a failure is raised where the answer is used, as before)
        self._pool: ThreadPoolExecutor | None = None
        self._asked: dict[str, Future[Any]] = {}

    def read(self) -> DemandView | None:
        """This cycle's demand, or None when Prometheus could not be read (counted, logged). The listed workloads'
        activation queries are asked first, many to a query (:meth:`read_activations`)."""
        self.gpus = {}
        self._asked = {}
        self.read_activations()
        view: DemandView | None = None
        try:
            if self.queries.recorded_series:
                view = self.read_recorded()
            if view is None:
                self.ask_alongside()
                forecasts = pod_forecasts(self.queries, self.rejected_total, (self.vc.label, "horizon_seconds"))
                wanted = str(self.queries.horizon_seconds)
                self.check_horizon(any(lab.get("horizon_seconds") == wanted for _, lab in forecasts.values()),
                                   exported_horizons)
        except SourceError as exc:
            self.errors["query"] += 1
            # once when it starts failing (and again if the reason changes), not every cycle
            (log.warning if str(exc) != self.failure else log.debug)("reading forecasts failed: %s", exc)
            self.failure = str(exc)
            return None
        if self.failure:
            log.info("reading forecasts again after %s", self.failure)
            self.failure = ""
        if view is None:
            view = self.group(forecasts)
        if self.vc.pending_query.strip():
            try:
                add_pending(view.vcs, self.answer("pending", lambda: pending_gpus(self.queries, self.vc)))
                self._failures.pop("vc_pending_query", None)
            except SourceError as exc:  # the clusters' demand is then their pods' forecasts alone
                self.failed("vc_pending_query", exc, "demand without waiting GPUs this cycle")
        return view

    def ask_alongside(self) -> None:
        """Send the pod-level read's other queries (GPUs per pod, owners, waiting GPUs) now, each on a thread of
        its own, so that Prometheus answers them while the forecasts' answer is read; :meth:`answer` takes them."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="dprobe-query")
        self._asked = {"gpus": self._pool.submit(pod_gpus, self.queries, (self.vc.label,))}
        if self.queries.owners_query.strip():
            self._asked["owners"] = self._pool.submit(pod_owners, self.queries)
        if self.vc.pending_query.strip():
            self._asked["pending"] = self._pool.submit(pending_gpus, self.queries, self.vc)

    def answer(self, name: str, ask: Callable[[], Any]) -> Any:
        """The answer to query ``name`` sent by :meth:`ask_alongside` this cycle (its error raised here), else
        ``ask()``'s."""
        future = self._asked.pop(name, None)
        return future.result() if future is not None else ask()

    def group(self, forecasts: dict[tuple[str, str], tuple[float, dict[str, str]]]) -> DemandView:
        """Every pod's forecast put in its workload and virtual cluster, with the pods holding GPUs."""
        gpus: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        try:
            gpus = self.answer("gpus", lambda: pod_gpus(self.queries, (self.vc.label,)))
            self._failures.pop("gpus_query", None)
        except SourceError as exc:  # virtual clusters then count one GPU per pod; no pod is known missing
            self.failed("gpus_query", exc, "one GPU per pod, pods without forecasts unseen")
        self.gpus = gpus
        return group_demand(forecasts, self.specs, gpus, self.vc.label, self.discover, self.owners())

    def read_recorded(self) -> DemandView | None:
        """The demand from the recording rules' series (``recorded_series``), or None where Prometheus holds none
        of them: then every pod's forecast is read this cycle, and where the sidecars' forecasts are there (the
        rules are not loaded), that is counted (``errors["recording_rules"]``) and logged once."""
        view = recorded_demand(self.queries, self.specs, self.vc.label, self.discover)
        if view is None:
            if pods_forecast(self.queries):
                self.errors["recording_rules"] += 1
                (log.error if not self._rules_missing else log.debug)(
                    "recorded_series: Prometheus holds the sidecars' forecasts but none of the series of dprobe's "
                    "recording rules (is deploy/prometheus/dprobe-rules.yaml, group dprobe-scaler-workloads, "
                    "loaded?); reading every pod's forecast instead")
                self._rules_missing = True
            return None
        if self._rules_missing:
            log.info("recorded_series: reading the recording rules' series again")
            self._rules_missing = False
        if not any(d.covered for d in (*view.workloads.values(), *view.discovered.values(), *view.vcs.values())) \
                and self.other_pairs_recorded():
            return None
        self._pairs = ()
        self.gpus = {}
        self.grouping = "owner"
        return view

    def other_pairs_recorded(self) -> bool:
        """Whether the rules record forecasts for other horizons or quantiles than ``horizon_seconds`` and
        ``quantile`` and none for them (their selectors not changed with the scaler's settings): then counted
        (``errors["recording_rules"]``) and logged once per set of pairs found, and every pod's forecast is read."""
        wanted = str(self.queries.horizon_seconds), f"{self.queries.quantile:g}"
        pairs = recorded_pairs(self.queries)
        if not pairs or wanted in pairs:
            self._pairs = ()
            return False
        found = tuple(sorted(pairs))
        self.errors["recording_rules"] += 1
        (log.error if found != self._pairs else log.debug)(
            "recorded_series: the recording rules record forecasts at horizon_seconds / quantile %s, not at the "
            "scaler's %s / %s: set horizon_seconds=\"%s\", quantile=\"%s\" in the selectors of their group "
            "dprobe-scaler-workloads (docs/scaler.md, \"Fleet scale\"); reading every pod's forecast instead",
            ", ".join(f"{h} / {q}" for h, q in found), *wanted, *wanted)
        self._pairs = found
        return True

    def take_warnings(self) -> None:
        """Count the warnings Prometheus sent with this cycle's answers (``warnings_total``: a partial response
        of Thanos or Mimir, a store or ingester missing) and log each new one once: the decisions go on with
        what was answered, pods whose forecasts are missing counting as missing pods (never lowering a count)."""
        sink = answer_warnings(self.queries)
        for warning in sink:
            self.warnings_total += 1
            (log.warning if warning not in self._warned else log.debug)(
                "Prometheus answered with a warning (a partial response?): %s; deciding on what it answered, "
                "pods without forecasts counted as missing", warning)
            self._warned.add(warning)
        sink.clear()

    def check_horizon(self, at_horizon: bool, horizons: Callable[[QueryOptions], set[str]]) -> None:
        """Warn (once per set of horizons found) and count (``horizon_missing_total``) when the answer holds no
        forecast at ``horizon_seconds`` (``at_horizon`` False) but the sidecars export others (``horizons``, asked
        only then): a horizon they are not configured with."""
        if at_horizon:
            self._horizons = ()
            return
        wanted = str(self.queries.horizon_seconds)
        found = tuple(sorted((h for h in horizons(self.queries) if h != wanted), key=float))
        if not found:
            return
        self.horizon_missing_total += 1
        if found != self._horizons:
            log.warning("no forecast at horizon_seconds %s: the sidecars export horizons %s (set horizon_seconds to "
                        "one of them, or add %s to the sidecars' horizons)", wanted, ", ".join(found), wanted)
        self._horizons = found

    def read_activations(self) -> None:
        """The listed workloads' activation queries, many in one query to Prometheus (:func:`activation_values`),
        and ``activations_query`` (every workload's value, one query); :meth:`active` then answers from them."""
        batch = [spec.activation_query for spec in self.specs if spec.activation_query]
        self._activation_values, self._activation_errors = activation_values(self.queries, batch)
        shared: dict[int, list[str]] = {}  # a request's failure, shared by several queries: counted and logged once
        for query, exc in self._activation_errors.items():
            shared.setdefault(id(exc), []).append(query)
        self._batch_failed = set()
        for queries in (q for q in shared.values() if len(q) > 1):
            exc = self._activation_errors[queries[0]]
            reason = str(exc).rsplit("': ", 1)[-1]  # not the batch's text (it names every query)
            self.failed("activation queries", SourceError(f"{len(queries)} activation queries: {reason}"),
                        "their workloads kept as they are")
            self._batch_failed.update(queries)
        if not self._batch_failed:
            self.answered("activation queries")
        self._shared, self._shared_error = {}, None
        if self.queries.activations_query.strip() and any(self._shared_by(s) for s in self.specs):
            try:
                self._shared = workload_values(self.queries, self.queries.activations_query)
                self.answered("activations_query")
            except SourceError as exc:
                self._shared_error = exc
                self.failed("activations_query", exc, "the workloads it wakes kept as they are")

    def _shared_by(self, spec: WorkloadSpec) -> bool:
        """Whether ``activations_query`` wakes the workload: it may rest at zero and has no query of its own."""
        return bool(self.queries.activations_query.strip()) and not spec.activation_query \
            and spec.policy.min_replicas == 0

    def owners(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Each pod's owner from ``owners_query``; empty (pods grouped by name) when it is not set, fails
        (counted, logged once) or finds no kube-state-metrics series (logged once)."""
        if not self.queries.owners_query.strip():
            return {}
        try:
            owners = self.answer("owners", lambda: pod_owners(self.queries))
            self._failures.pop("owners_query", None)
        except SourceError as exc:
            self.failed("owners_query", exc, "pods grouped by name")
            owners = {}
        grouping = "owner" if owners else "name"
        if grouping != self.grouping:
            if owners:
                log.info("grouping pods into workloads by owner (kube-state-metrics: %d pods)", len(owners))
            else:
                log.warning("owners_query found no pod owners (is kube-state-metrics scraped?): grouping pods "
                            "into workloads by name (the workloads' pods patterns)")
            self.grouping = grouping
        return owners

    def active(self, spec: WorkloadSpec, previous: Decision | None) -> bool | None:
        """What the workload's activation query says (None: it has none). A query that fails keeps the
        workload as it is (``previous``: its last decision): counted, logged once, taken as active while it
        runs, inactive at zero."""
        if self._shared_by(spec):
            if self._shared_error is not None:  # (counted and logged once, by read_activations)
                self.activations.pop(spec.key, None)
                return bool(previous and previous.replicas > 0)
            value = self._shared.get(spec.key, 0.0)
            self.activations[spec.key] = value, value > self.queries.activations_query_threshold
            return self.activations[spec.key][1]
        if not spec.activation_query:
            return None
        query = "{}/{}: activation query".format(*spec.key)
        if spec.activation_query not in self._activation_values:
            exc = self._activation_errors.get(spec.activation_query, SourceError("not asked this cycle"))
            if spec.activation_query not in self._batch_failed:  # its own failure (a batch's: read_activations)
                self.failed(query, exc, "kept as it is")
            self.activations.pop(spec.key, None)
            return bool(previous and previous.replicas > 0)
        value = self._activation_values[spec.activation_query]
        self._failures.pop(query, None)
        self.activations[spec.key] = value, value > spec.activation_query_threshold
        return self.activations[spec.key][1]

    def replicas(self) -> dict[tuple[str, str], int]:
        """Each workload's replicas as kube-state-metrics shows them (``replicas_query``; empty when it fails)."""
        try:
            replicas = workload_replicas(self.queries)
        except SourceError as exc:
            self.failed("replicas_query", exc, "expected pods from the last recommendations")
            return {}
        self._failures.pop("replicas_query", None)
        return replicas

    def vc_gpus(self) -> dict[str, int]:
        """Each virtual cluster's GPUs as kube-state-metrics shows them (``vc_gpus_query``; empty when it fails)."""
        try:
            gpus = vc_gpus(self.queries, self.vc)
        except SourceError as exc:
            self.failed("vc_gpus_query", exc, "clusters' counts from their last recommendations")
            return {}
        self._failures.pop("vc_gpus_query", None)
        return gpus

    def recommendations(self) -> tuple[dict[tuple[str, str], int], dict[str, int],
                                       dict[str, tuple[int, float]]] | None:
        """What the scaler's last run left (``restore_seconds``; nothing when 0): its recommendations per workload
        and per virtual cluster, and per virtual cluster the GPUs its pods held at its last decision on data and
        how long ago (s). None when a query fails (counted, logged once): asked again next cycle."""
        if self.queries.restore_seconds <= 0:
            return {}, {}, {}
        try:
            workloads, vcs = previous_recommendations(self.queries)
            held = previous_vc_data(self.queries)
        except SourceError as exc:
            self.failed("restore", exc, "counts not known yet, asked again next cycle")
            return None
        self._failures.pop("restore", None)
        if workloads or vcs:
            log.info("starting from %d recommendations of the last %g s", len(workloads) + len(vcs),
                     self.queries.restore_seconds)
        return workloads, vcs, held

    def answered(self, query: str) -> None:
        """``query`` answered again: its next failure is logged at warning level."""
        self._failures.pop(query, None)

    def failed(self, query: str, exc: SourceError, outcome: str) -> None:
        """Count a failed query; log it once per reason (at debug level while the same reason repeats)."""
        self.errors["query"] += 1
        (log.warning if self._failures.get(query) != str(exc) else log.debug)(
            "%s failed (%s): %s", query, outcome, exc)
        self._failures[query] = str(exc)
