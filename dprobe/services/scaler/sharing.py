"""GPU shares from the sidecars' forecasts: per workload a GPU memory limit and a GPU fraction (time-slicing,
MPS) or a MIG profile; per virtual cluster the pods packed onto shared GPUs (:mod:`dprobe.sharing.planner`)
and the GPUs that takes beside the GPUs its pods hold without sharing.

A workload's memory limit is the largest of its pods' memory forecasts at ``sharing_memory_quantile``
(each pod's largest over the horizons up to the scaler's ``horizon_seconds``) plus ``sharing_memory_margin``,
as the VPA recommends one limit for all the replicas of a workload. It is lowered only to the highest limit of
the last ``sharing_stabilization_seconds``, and never while one of its pods has no memory forecast (missing
data never lowers a share); a restarted scaler starts from the limits its last run recommended
(``restore_seconds``), as it does for the counts. Its fraction is the larger of that limit over the GPU's memory and its
utilisation forecast at ``sharing_utilization_quantile`` (rounded up to a hundredth); its MIG profile the
smallest allowed one with room for both, and then its fraction the share of the GPU that profile takes (the
larger of its memory slices over 8 and its compute slices over 7).

Each pod is packed at its workload's share. A pod without a memory forecast keeps the GPUs it holds (it is
never packed as if it used nothing); one too large for a GPU or for every allowed MIG profile, or holding
several GPUs, keeps them too: each is counted by reason (:data:`UNPLACED_REASONS`) and logged.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dprobe.core.names import OBSERVED, PREDICTED, RECOMMENDED_GPU_MEMORY
from dprobe.services.scaler.config import QueryOptions
from dprobe.services.scaler.demand import DemandView, answer_warnings, query_vector
from dprobe.services.scaler.sharing_config import SharingSettings
from dprobe.sharing.mig import MigProfile
from dprobe.sharing.planner import Plan, PlanSettings, Workload, plan, plan_mig

log = logging.getLogger(__name__)
PREDICTED_MEMORY = PREDICTED["gpu_memory_bytes"]
PREDICTED_UTILIZATION = PREDICTED["gpu_utilization_ratio"]
OBSERVED_MEMORY_TOTAL = OBSERVED["memory_total_bytes"]
PLACEMENTS = ("shared", "own_gpus", "cannot_place")  # where a pod went (dprobe_scaler_sharing_pods)
# why a pod was not packed at its share: it keeps the GPUs it holds
UNPLACED_REASONS = ("no_memory_forecast", "multi_gpu", "too_large", "no_profile")
PodKey = tuple[str, str]


@dataclass
class PodNeed:
    """One pod to place: its workload (None: in none), virtual cluster, GPUs held and forecasts."""

    namespace: str
    pod: str
    workload: tuple[str, str] | None
    vc: str
    gpus: int = 1
    memory: float | None = None  # memory forecast at the memory quantile, largest over the horizons (bytes)
    utilization: float | None = None  # utilisation forecast at the utilisation quantile (0-1)
    memory_total: float | None = None  # the GPU memory the pod sees now (sidecar), e.g. its MIG instance's


@dataclass
class WorkloadShare:
    """One workload's recommended share."""

    memory_forecast: float | None  # its pods' largest memory forecast this cycle (bytes)
    memory_bytes: float | None  # the recommended limit (forecast plus margin, stabilised, held)
    utilization: float | None
    fraction: float | None = None  # of one GPU: time-slicing, mps; mig: what its profile takes
    mig_profile: str | None = None  # mig
    share_bytes: float | None = None  # the memory its pods can have: limit, capped by what a GPU gives
    reason: str = ""  # why it is not packed at its share ('' when it is)


@dataclass
class SharePlan:
    """One cycle's shares: per workload, per virtual cluster (GPUs without and with sharing), the co-location
    plan ``(vc, gpu, namespace, workload) -> pods``, pods by placement and the pods not packed by reason."""

    workloads: dict[tuple[str, str], WorkloadShare] = field(default_factory=dict)
    vc_gpus: dict[str, tuple[int, int]] = field(default_factory=dict)  # vc -> (none, shared)
    colocation: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    placements: Counter[tuple[str, str]] = field(default_factory=Counter)  # (vc, placement) -> pods
    unplaced: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (namespace, workload, reason)
    pod_reasons: dict[PodKey, str] = field(default_factory=dict)  # each pod not packed at its share: why


def _selector(queries: QueryOptions) -> str:
    return f",{queries.forecast_selector.strip().strip(',')}" if queries.forecast_selector.strip() else ""


def _pod_rows(queries: QueryOptions, query: str) -> list[tuple[PodKey, dict[str, str], float]]:
    """The pod-level rows of ``query`` (``target`` is the pod: a GPU's own series are skipped)."""
    out = []
    server = queries.prometheus
    for labels, value in query_vector(server.url, query, queries.http_timeout, server.auth(),
                                     answer_warnings(queries)):
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if pod and labels.get("target") in (f"{ns}/{pod}", pod):
            out.append(((ns, pod), labels, value))
    return out


def memory_forecasts(queries: QueryOptions, settings: SharingSettings, rejected: Counter[str] | None = None
                     ) -> dict[PodKey, tuple[float, dict[str, str]]]:
    """Each pod's memory forecast at the memory quantile, the largest over the horizons up to
    ``horizon_seconds`` (a value that is not a finite number >= 0 is left out, counted in ``rejected``)."""
    query = f'{PREDICTED_MEMORY}{{quantile="{settings.memory_quantile:g}",pod!=""{_selector(queries)}}}'
    out: dict[PodKey, tuple[float, dict[str, str]]] = {}
    for key, labels, value in _pod_rows(queries, query):
        try:
            horizon = float(labels.get("horizon_seconds", "nan"))
        except ValueError:
            continue
        if not horizon <= queries.horizon_seconds:
            continue
        if not (math.isfinite(value) and value >= 0):
            if rejected is not None:
                rejected["memory_nan" if math.isnan(value) else "memory_infinite" if math.isinf(value)
                         else "memory_negative"] += 1
            continue
        if key not in out or value > out[key][0]:
            out[key] = (value, labels)
    return out


def utilization_forecasts(queries: QueryOptions, settings: SharingSettings) -> dict[PodKey, float]:
    """Each pod's utilisation forecast at the utilisation quantile and ``horizon_seconds`` (0-1; others left out)."""
    query = (f'{PREDICTED_UTILIZATION}{{horizon_seconds="{queries.horizon_seconds}",'
             f'quantile="{settings.utilization_quantile:g}",pod!=""{_selector(queries)}}}')
    out: dict[PodKey, float] = {}
    for key, _, value in _pod_rows(queries, query):
        if 0 <= value <= 1:
            out[key] = max(out.get(key, 0.0), value)
    return out


def memory_totals(queries: QueryOptions) -> dict[PodKey, float]:
    """The GPU memory each pod sees now (the sidecar's ``dprobe_observed_gpu_memory_total_bytes``: its MIG
    instance's, or its GPUs' summed)."""
    out: dict[PodKey, float] = {}
    for key, _, value in _pod_rows(queries, f'{OBSERVED_MEMORY_TOTAL}{{pod!=""{_selector(queries)}}}'):
        if math.isfinite(value) and value > 0:
            out[key] = min(out.get(key, value), value)
    return out


def pods_to_place(view: DemandView, gpus: Mapping[PodKey, tuple[int, Mapping[str, str]]],
                  memory: Mapping[PodKey, tuple[float, Mapping[str, str]]], utilization: Mapping[PodKey, float],
                  totals: Mapping[PodKey, float], vc_label: str) -> dict[PodKey, PodNeed]:
    """Every pod the view, the GPU count query or the memory forecasts show, with its workload and cluster."""
    out: dict[PodKey, PodNeed] = {}
    vcs: dict[PodKey, str] = {}
    for vc, d in view.vcs.items():
        for name in (*d.pods, *d.missing):
            ns, _, pod = name.partition("/")
            vcs[(ns, pod)] = vc

    def need(key: PodKey) -> PodNeed:
        if key not in out:
            labels = gpus[key][1] if key in gpus else memory[key][1] if key in memory else {}
            vc = vcs.get(key) or (labels.get(vc_label, "") if vc_label else "")
            out[key] = PodNeed(key[0], key[1], None, vc, gpus[key][0] if key in gpus else 1,
                               memory[key][0] if key in memory else None, utilization.get(key), totals.get(key))
        return out[key]

    for groups in (view.workloads, view.discovered):
        for wkey, demand in groups.items():
            for pod in (*demand.pods, *demand.missing):
                need((wkey[0], pod)).workload = wkey
    for key in (*gpus, *memory, *vcs):
        need(key)
    return out


def read_pods(queries: QueryOptions, vc_label: str, settings: SharingSettings, view: DemandView,
              gpus: Mapping[PodKey, tuple[int, Mapping[str, str]]], rejected: Counter[str] | None = None
              ) -> dict[PodKey, PodNeed]:
    """This cycle's pods with their forecasts from Prometheus (SourceError when a query fails)."""
    return pods_to_place(view, gpus, memory_forecasts(queries, settings, rejected),
                         utilization_forecasts(queries, settings), memory_totals(queries), vc_label)


def previous_limits(queries: QueryOptions) -> dict[tuple[str, str], float]:
    """The memory limits the scaler's last run recommended within ``restore_seconds`` (SourceError on failure)."""
    query = (f"max by (namespace, workload) (last_over_time({RECOMMENDED_GPU_MEMORY}"
             f"[{int(queries.restore_seconds)}s]))")
    out: dict[tuple[str, str], float] = {}
    server = queries.prometheus
    for labels, value in query_vector(server.url, query, queries.http_timeout, server.auth(),
                                     answer_warnings(queries)):
        if labels.get("workload") and math.isfinite(value) and value > 0:
            out[(labels.get("namespace", ""), labels["workload"])] = value
    return out


class ShareRecommender:
    """Shares from one cycle's pods; keeps each workload's recent limits (stabilisation) and each pod's
    GPU in the last plan (a pod stays where it still fits)."""

    def __init__(self, settings: SharingSettings) -> None:
        self.settings = settings
        self.history: dict[tuple[str, str], list[tuple[float, float]]] = {}  # workload -> [(time, limit)]
        self.published: dict[tuple[str, str], float] = {}  # workload -> its last recommended limit
        self.previous: dict[PodKey, int] = {}  # pod -> its GPU in the last plan of its cluster

    def restore(self, now: float, limits: Mapping[tuple[str, str], float]) -> None:
        """Start from the limits of the scaler's last run, as if recommended ``now``: a restart lowers none of
        them before a full stabilisation window, nor while a pod has no forecast."""
        for key, value in limits.items():
            self.history[key] = [(now, float(value))]
            self.published[key] = float(value)

    # per workload ----------------------------------------------------------------------------------------
    def _limit(self, now: float, key: tuple[str, str], forecast: float | None, complete: bool) -> float | None:
        """The recommended limit: this cycle's forecast plus margin, lowered only to the highest limit of the
        stabilisation window, and not below the last one while a pod has no forecast (``complete`` False)."""
        s = self.settings
        window = [(t, v) for t, v in self.history.get(key, []) if t > now - s.stabilization_seconds]
        limit = None if forecast is None else forecast * (1 + s.memory_margin)
        if not complete and key in self.published:  # held: this cycle's limit is the last one, at least
            limit = max(limit or 0.0, self.published[key])
        if limit is not None:
            window.append((now, limit))
        self.history[key] = window
        value = max((v for _, v in window), default=None)
        if value is not None:
            self.published[key] = value
        return value

    def _profile(self, memory: float, utilization: float) -> MigProfile | None:
        return next((p for p in self.settings.mig_profiles
                     if p.memory_bytes >= memory and p.compute_fraction >= utilization - 1e-9), None)

    def workload_share(self, now: float, key: tuple[str, str], pods: list[PodNeed]) -> WorkloadShare:
        """``key``'s share from its pods' forecasts (see the module's docstring)."""
        known = [p.memory for p in pods if p.memory is not None]
        forecast = max(known) if known else None
        utils = [p.utilization for p in pods if p.utilization is not None]
        limit = self._limit(now, key, forecast, len(known) == len(pods))
        return self.share(forecast, limit, max(utils) if utils else None,
                          [p.memory_total for p in pods if p.memory_total is not None])

    def share(self, forecast: float | None, limit: float | None, util: float | None,
              seen: Sequence[float] = ()) -> WorkloadShare:
        """The fraction or MIG profile for a memory ``limit`` and utilisation; ``seen``: the GPU memory the
        pods see now, which caps what they can have."""
        s = self.settings
        share = WorkloadShare(forecast, limit, util)
        if limit is None:
            share.reason = "no_memory_forecast"
            return share
        if s.mode == "mig":
            profile = self._profile(limit, util or 0.0)
            if profile is None:
                share.reason = "no_profile"
                share.share_bytes = min(limit, s.capacity)  # it keeps a whole GPU
            else:
                share.mig_profile, share.share_bytes = profile.name, profile.memory_bytes
                share.fraction = max(profile.memory_slices / 8, profile.compute_fraction)  # what it takes of a GPU
        else:
            if limit > s.capacity:
                share.reason = "too_large"
            else:
                share.fraction = min(1.0, math.ceil(max(limit / s.capacity, util or 0.0) * 100 - 1e-9) / 100)
            share.share_bytes = min(limit, s.capacity)
        if seen and share.share_bytes is not None:
            share.share_bytes = min(share.share_bytes, min(seen))
        return share

    # per cluster --------------------------------------------------------------------------------------
    def recommend(self, now: float, pods: Mapping[PodKey, PodNeed]) -> SharePlan:
        """Shares for every workload of ``pods`` and a packing plan per virtual cluster."""
        out = SharePlan()
        by_workload: dict[tuple[str, str], list[PodNeed]] = defaultdict(list)
        for p in pods.values():
            if p.workload is not None:
                by_workload[p.workload].append(p)
        for key, members in sorted(by_workload.items()):
            out.workloads[key] = self.workload_share(now, key, members)
        for key in set(self.published) - set(by_workload):  # workloads gone
            self.history.pop(key, None)
            del self.published[key]
        by_vc: dict[str, list[PodNeed]] = defaultdict(list)
        for p in pods.values():
            by_vc[p.vc].append(p)
        previous: dict[PodKey, int] = {}
        for vc, members in sorted(by_vc.items()):
            members.sort(key=lambda p: (p.namespace, p.pod))
            none, shared = self._pack(vc, members, out, previous)
            if vc:
                out.vc_gpus[vc] = (none, shared)
        self.previous = previous
        return out

    def _pod_share(self, p: PodNeed, out: SharePlan) -> tuple[float | None, float | None, str | None, str]:
        """A pod's memory to pack (before margin), utilisation, MIG profile and why it keeps its GPUs."""
        share = out.workloads.get(p.workload) if p.workload is not None else None
        if p.memory is None:
            return None, p.utilization, None, "no_memory_forecast"
        if p.gpus > 1:
            return None, p.utilization, None, "multi_gpu"
        if share is None:  # a pod in no workload: its own forecast
            share = self.share(p.memory, p.memory * (1 + self.settings.memory_margin), p.utilization)
        if share.reason or share.memory_bytes is None:
            return None, p.utilization, None, share.reason or "no_memory_forecast"
        memory = float(share.memory_bytes) / (1 + self.settings.memory_margin)
        return memory, share.utilization, share.mig_profile, ""

    def _pack(self, vc: str, members: list[PodNeed], out: SharePlan, previous: dict[PodKey, int]) -> tuple[int, int]:
        """Pack one cluster's pods; its GPUs without sharing (what its pods hold) and with."""
        s = self.settings
        none = sum(p.gpus for p in members)
        packed: list[tuple[PodNeed, Workload]] = []
        kept = 0
        for p in members:
            memory, util, profile, reason = self._pod_share(p, out)
            if reason:
                kept += p.gpus
                kind = "own_gpus" if reason == "no_memory_forecast" else "cannot_place"
                out.placements[(vc, kind)] += 1
                out.unplaced[(p.namespace, p.workload[1] if p.workload else "", reason)] += 1
                out.pod_reasons[(p.namespace, p.pod)] = reason
                continue
            packed.append((p, Workload(f"{p.namespace}/{p.pod}", memory, util, mig_profile=profile)))
        if not packed:
            return none, kept
        work = [w for _, w in packed]
        settings = PlanSettings(memory_margin=s.memory_margin, utilization_target=s.utilization_target,
                                policy=s.policy)
        result: Plan = (plan_mig(work, s.gpu, settings=settings) if s.mode == "mig" else
                        plan(work, s.capacity, settings=settings,
                             previous=[self.previous.get((p.namespace, p.pod), -1) for p, _ in packed]))
        for (p, _), placement in zip(packed, result.placements, strict=True):
            if not placement.placed:  # no room: cannot happen with as many GPUs as pods; kept, counted
                kept += p.gpus
                out.placements[(vc, "cannot_place")] += 1
                out.unplaced[(p.namespace, p.workload[1] if p.workload else "", "too_large")] += 1
                out.pod_reasons[(p.namespace, p.pod)] = placement.reason
                continue
            gpu = placement.gpus[0]
            previous[(p.namespace, p.pod)] = gpu
            out.placements[(vc, "shared")] += 1
            out.colocation[(vc, str(gpu), p.namespace, p.workload[1] if p.workload else "")] += 1
        return none, result.gpus_used + kept
