"""What the scaler reads from Prometheus each cycle: the demand view, the activation queries and the counts a
decision starts from where it does not set them (kube-state-metrics', the last run's recommendations). A failed
query is counted (``errors["query"]``) and logged once per reason, at debug level while the same reason repeats."""

from __future__ import annotations

import logging
from collections import Counter

from dprobe.scaling.policy import Decision
from dprobe.services.scaler.config import QueryOptions, VcOptions, WorkloadSpec
from dprobe.services.scaler.demand import (
    DemandView,
    activation_value,
    add_pending,
    group_demand,
    pending_gpus,
    pod_forecasts,
    pod_gpus,
    pod_owners,
    previous_recommendations,
    previous_vc_data,
    vc_gpus,
    workload_replicas,
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
        self.gpus: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}  # the last read's GPUs per pod

    def read(self) -> DemandView | None:
        """This cycle's demand, or None when Prometheus could not be read (counted, logged)."""
        try:
            forecasts = pod_forecasts(self.queries, self.rejected_total)
        except SourceError as exc:
            self.errors["query"] += 1
            # once when it starts failing (and again if the reason changes), not every cycle
            (log.warning if str(exc) != self.failure else log.debug)("reading forecasts failed: %s", exc)
            self.failure = str(exc)
            return None
        if self.failure:
            log.info("reading forecasts again after %s", self.failure)
            self.failure = ""
        gpus: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        try:
            gpus = pod_gpus(self.queries)
            self._failures.pop("gpus_query", None)
        except SourceError as exc:  # virtual clusters then count one GPU per pod; no pod is known missing
            self.failed("gpus_query", exc, "one GPU per pod, pods without forecasts unseen")
        self.gpus = gpus
        view = group_demand(forecasts, self.specs, gpus, self.vc.label, self.discover, self.owners())
        if self.vc.pending_query.strip():
            try:
                add_pending(view.vcs, pending_gpus(self.queries, self.vc))
                self._failures.pop("vc_pending_query", None)
            except SourceError as exc:  # the clusters' demand is then their pods' forecasts alone
                self.failed("vc_pending_query", exc, "demand without waiting GPUs this cycle")
        return view

    def owners(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Each pod's owner from ``owners_query``; empty (pods grouped by name) when it is not set, fails
        (counted, logged once) or finds no kube-state-metrics series (logged once)."""
        if not self.queries.owners_query.strip():
            return {}
        try:
            owners = pod_owners(self.queries)
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
        if not spec.activation_query:
            return None
        query = "{}/{}: activation query".format(*spec.key)
        try:
            value = activation_value(self.queries, spec.activation_query)
        except SourceError as exc:
            self.failed(query, exc, "kept as it is")
            self.activations.pop(spec.key, None)
            return bool(previous and previous.replicas > 0)
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
