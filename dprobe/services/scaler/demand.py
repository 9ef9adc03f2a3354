"""Multi-level demand: the sidecars' per-pod forecasts, read from Prometheus, summed per workload and
per virtual cluster.

A pod's demand is its forecast GPU utilisation (0-1) at the configured horizon and quantile; a pod
without a forecast yet (not sampled long enough) counts at its training job's cold-start utilisation
where its sidecar exports one (``dprobe_job_predicted_gpu_utilization_ratio``, p50 or p90). A
workload's demand is the sum over its replicas (pod-equivalents: three pods at 0.5 are 1.5); a
virtual cluster's is the sum over its pods of utilisation times the pod's GPU count (GPUs), plus the
GPUs waiting in it where ``vc_pending_query`` says (pods not scheduled, jobs queued: none of them has a
sidecar yet).

A pod belongs to the workload whose owner (``owner``, default its own kind and name) owns it, as
kube-state-metrics shows (``owners_query``: ``kube_pod_owner``, through ``kube_replicaset_owner`` for a
Deployment's or a Rollout's pods); a pod it does not show (kube-state-metrics absent, or not scraped yet)
is grouped by its name (the workload's ``pods`` regex).

A forecast that is not a number, infinite, negative or above 1 is no forecast: the pod is dropped (and
counted by the scaler), never clipped to 0. A pod the GPU count query shows (it holds a GPU) but that has
no usable forecast is *missing*: the policy counts it as the HPA counts a pod without metrics.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from dprobe.core.names import JOB_PREDICTED, PREDICTED, RECOMMENDED_GPUS, RECOMMENDED_REPLICAS
from dprobe.services.scaler.config import QueryOptions, VcOptions, WorkloadSpec
from dprobe.services.sources.prometheus import query_vector

PREDICTED_UTILIZATION = PREDICTED["gpu_utilization_ratio"]
JOB_UTILIZATION = JOB_PREDICTED["gpu_utilization_ratio"]
# a Deployment's pods: <deployment>-<pod-template-hash>-<5 characters>
DEPLOYMENT_POD = re.compile(r"(?P<workload>.+)-[a-z0-9]{5,10}-[a-z0-9]{5}")
# owners whose pods are replicas a discovered workload may be recommended for
SCALABLE_OWNERS = ("Deployment", "StatefulSet", "Rollout")
GROUPING_METHODS = ("owner", "name")  # how a pod was put in its workload (dprobe_scaler_grouped_pods)
# what a virtual cluster's pods held at its last decision on data, and when (Unix time): read back after a restart
VC_DATA_GPUS = "dprobe_scaler_vc_last_data_gpus"
VC_DATA_TIME = "dprobe_scaler_vc_last_data_timestamp_seconds"


@dataclass
class Demand:
    """Forecast demand of one scaled object, and the pods it came from."""

    total: float = 0.0
    pods: list[str] = field(default_factory=list)
    gpus: int = 0  # GPUs those pods hold (virtual clusters)
    pending: float = 0.0  # GPUs waiting, from vc_pending_query (virtual clusters; part of total)
    missing: list[str] = field(default_factory=list)  # pods seen holding GPUs, without a usable forecast
    missing_gpus: int = 0  # the GPUs those pods hold (virtual clusters)


@dataclass
class DemandView:
    """One cycle's demand per configured workload, per discovered workload and per virtual cluster."""

    workloads: dict[tuple[str, str], Demand]
    discovered: dict[tuple[str, str], Demand]
    vcs: dict[str, Demand]
    grouped: Counter[str] = field(default_factory=Counter)  # pods put in a workload, by method


def _vector(queries: QueryOptions, query: str) -> list[tuple[dict[str, str], float]]:
    """An instant ``query`` at the configured Prometheus, with its credentials (SourceError on failure)."""
    server = queries.prometheus
    return query_vector(server.url, query, queries.http_timeout, server.auth())


def forecast_query(queries: QueryOptions) -> str:
    """The PromQL selecting every pod's forecast at the configured horizon and quantile, and with
    ``job_profiles`` the cold-start utilisation of pods without one (p50 for a quantile up to 0.5,
    else p90: the profiles' highest)."""
    extra = f",{queries.forecast_selector.strip().strip(',')}" if queries.forecast_selector.strip() else ""
    query = (f'{PREDICTED_UTILIZATION}{{horizon_seconds="{queries.horizon_seconds}",'
             f'quantile="{queries.quantile:g}",pod!=""{extra}}}')
    if not queries.job_profiles:
        return query
    profile = "0.5" if queries.quantile <= 0.5 else "0.9"
    return f'{query} or on (namespace, pod) {JOB_UTILIZATION}{{quantile="{profile}",pod!=""{extra}}}'



def forecast_problem(value: float) -> str:
    """Why a forecast of GPU utilisation (0-1) cannot be used ('' when it can)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "infinite"
    if value < 0:
        return "negative"
    if value > 1.0 + 1e-6:
        return "above_one"
    return ""


def pod_forecasts(queries: QueryOptions, rejected: Counter[str] | None = None
                  ) -> dict[tuple[str, str], tuple[float, dict[str, str]]]:
    """``(namespace, pod) -> (forecast, labels)`` for every pod-level target (``target`` is
    ``namespace/pod``; a GPU's own series are skipped, so no pod is counted twice). Where several
    sidecars export the same pod, the highest forecast is kept. A forecast that cannot be used (see
    :func:`forecast_problem`) is left out and counted in ``rejected`` by reason."""
    out: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
    for labels, value in _vector(queries, forecast_query(queries)):
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if labels.get("target") not in (f"{ns}/{pod}", pod):
            continue
        problem = forecast_problem(value)
        if problem:
            if rejected is not None:
                rejected[problem] += 1
            continue
        if (ns, pod) not in out or value > out[(ns, pod)][0]:
            out[(ns, pod)] = (min(1.0, value), labels)
    return out


def pod_gpus(queries: QueryOptions) -> dict[tuple[str, str], tuple[int, dict[str, str]]]:
    """GPUs per pod from ``gpus_query`` (empty when it is not set), with the row's labels: the pods that
    hold GPUs, whether or not they have a forecast."""
    if not queries.gpus_query.strip():
        return {}
    rows = _vector(queries, queries.gpus_query)
    return {(lab.get("namespace", ""), lab.get("pod", "")): (max(1, int(round(v))), lab) for lab, v in rows
            if math.isfinite(v) and lab.get("pod")}


def pod_owners(queries: QueryOptions) -> dict[tuple[str, str], tuple[str, str]]:
    """``(namespace, pod) -> (owner kind, owner name)`` from ``owners_query`` (empty when it is not set or
    kube-state-metrics' series are absent); a pod listed with two owners is left to its name."""
    if not queries.owners_query.strip():
        return {}
    out: dict[tuple[str, str], tuple[str, str]] = {}
    twice: set[tuple[str, str]] = set()
    for labels, _ in _vector(queries, queries.owners_query):
        key = labels.get("namespace", ""), labels.get("pod", "")
        owner = labels.get("owner_kind", ""), labels.get("owner_name", "")
        if not key[1] or not all(owner):
            continue
        if out.get(key, owner) != owner:
            twice.add(key)
        out[key] = owner
    for key in twice:
        del out[key]
    return out


def workload_replicas(queries: QueryOptions) -> dict[tuple[str, str], int]:
    """``(namespace, workload) -> replicas`` from ``replicas_query`` (kube-state-metrics' spec replicas;
    empty when it is not set or has no such series)."""
    if not queries.replicas_query.strip():
        return {}
    out: dict[tuple[str, str], int] = {}
    for labels, value in _vector(queries, queries.replicas_query):
        key = labels.get("namespace", ""), labels.get("workload", "")
        if key[1] and math.isfinite(value) and value >= 0:
            out[key] = max(out.get(key, 0), int(round(value)))
    return out


def previous_recommendations(queries: QueryOptions) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """The scaler's own last recommendations, as Prometheus kept them (``restore_seconds`` back): where a
    restarted scaler in recommend mode starts from, instead of the pods it happens to see."""
    window = f"[{int(queries.restore_seconds)}s]"
    workloads: dict[tuple[str, str], int] = {}
    for labels, value in _vector(queries, f"max by (namespace, workload) "
                                         f"(last_over_time({RECOMMENDED_REPLICAS}{window}))"):
        if labels.get("workload") and math.isfinite(value) and value >= 0:
            workloads[(labels.get("namespace", ""), labels["workload"])] = int(round(value))
    vcs: dict[str, int] = {}
    for labels, value in _vector(queries, f"max by (vc) "
                                         f"(last_over_time({RECOMMENDED_GPUS}{{sharing=\"\"}}{window}))"):
        if labels.get("vc") and math.isfinite(value) and value >= 0:
            vcs[labels["vc"]] = int(round(value))
    return workloads, vcs


def previous_vc_data(queries: QueryOptions) -> dict[str, tuple[int, float]]:
    """Per virtual cluster, the GPUs its pods held at the last run's last decision on data and how long ago that
    was (s, on Prometheus's clock, never negative), as Prometheus kept them (``restore_seconds`` back)."""
    window = f"[{int(queries.restore_seconds)}s]"
    held = {labels["vc"]: int(round(value)) for labels, value in
            _vector(queries, f"max by (vc) (last_over_time({VC_DATA_GPUS}{window}))")
            if labels.get("vc") and math.isfinite(value) and value >= 0}
    out: dict[str, tuple[int, float]] = {}
    for labels, age in _vector(queries, f"min by (vc) (time() - last_over_time({VC_DATA_TIME}{window}))"):
        vc = labels.get("vc", "")
        if vc in held and math.isfinite(age):
            out[vc] = held[vc], max(0.0, age)  # a timestamp ahead of Prometheus's clock: just now
    return out


def vc_gpus(queries: QueryOptions, vcs: VcOptions) -> dict[str, int]:
    """GPUs per virtual cluster from ``vc_gpus_query`` (kube-state-metrics: what its running pods request; empty
    when it is not set), its samples summed by the ``vc_label`` label."""
    if not vcs.gpus_query.strip() or not vcs.label:
        return {}
    out: dict[str, float] = defaultdict(float)
    for labels, value in _vector(queries, vcs.gpus_query):
        vc = labels.get(vcs.label, "")
        if vc and math.isfinite(value) and value >= 0:
            out[vc] += value
    return {vc: int(round(n)) for vc, n in out.items()}


def pending_gpus(queries: QueryOptions, vcs: VcOptions) -> dict[str, float]:
    """GPUs waiting per virtual cluster from ``vc_pending_query`` (samples without the ``vc_label``
    label are left out; several samples of one cluster are summed)."""
    out: dict[str, float] = defaultdict(float)
    for labels, value in _vector(queries, vcs.pending_query):
        vc = labels.get(vcs.label, "")
        if vc and value == value:
            out[vc] += max(0.0, value)
    return dict(out)


def add_pending(vcs: dict[str, Demand], pending: dict[str, float]) -> None:
    """Count each virtual cluster's waiting GPUs in its demand (a cluster with nothing running yet too)."""
    for vc, gpus in pending.items():
        demand = vcs.setdefault(vc, Demand())
        demand.pending = gpus
        demand.total += gpus


def activation_value(queries: QueryOptions, query: str) -> float:
    """A workload's activation query, its samples summed (no samples: 0, as KEDA's Prometheus
    scaler reads an empty result)."""
    rows = _vector(queries, query)
    return float(sum(v for _, v in rows if v == v))


def group_demand(forecasts: dict[tuple[str, str], tuple[float, dict[str, str]]], specs: list[WorkloadSpec],
                 gpus: dict[tuple[str, str], tuple[int, dict[str, str]]], vc_label: str, discover: bool,
                 owners: dict[tuple[str, str], tuple[str, str]] | None = None) -> DemandView:
    """Sum the pods' forecasts per workload, per discovered workload (pods no spec claims) and per virtual
    cluster (``vc_label``); a pod in ``gpus`` without a forecast is listed as missing where it belongs.

    A pod whose owner ``owners`` knows belongs to the first spec of its namespace with that owner
    (:attr:`WorkloadSpec.owner_ref`), else to the discovered workload of its owner (a Deployment, StatefulSet
    or Rollout); any other pod to the first spec whose ``pods`` pattern matches its name, else to the
    discovered Deployment its name looks like."""
    owners = owners or {}
    workloads = {s.key: Demand() for s in specs}
    discovered: dict[tuple[str, str], Demand] = defaultdict(Demand)
    vcs: dict[str, Demand] = defaultdict(Demand)
    grouped: Counter[str] = Counter()
    pods = [(key, value, labels) for key, (value, labels) in forecasts.items()]
    pods += [(key, None, labels) for key, (_, labels) in gpus.items() if key not in forecasts]
    for (ns, pod), value, labels in sorted(pods, key=lambda row: row[0]):
        demand: Demand | None = None
        owner = owners.get((ns, pod))
        if owner is not None:
            spec = next((s for s in specs if s.namespace == ns and s.owner_ref == owner), None)
            if spec is not None:
                demand = workloads[spec.key]
            elif discover and owner[0] in SCALABLE_OWNERS and (ns, owner[1]) not in workloads:
                demand = discovered[(ns, owner[1])]
            method = "owner"
        else:
            spec = next((s for s in specs if s.namespace == ns and s.pods.fullmatch(pod)), None)
            match = DEPLOYMENT_POD.fullmatch(pod) if spec is None and discover else None
            demand = workloads[spec.key] if spec else discovered[(ns, match["workload"])] if match else None
            method = "name"
        if demand is not None:
            grouped[method] += 1
            if value is None:
                demand.missing.append(pod)
            else:
                demand.total += value
                demand.pods.append(pod)
        vc = labels.get(vc_label, "") if vc_label else ""
        if vc:
            n = gpus[(ns, pod)][0] if (ns, pod) in gpus else 1
            vcs[vc].gpus += n
            if value is None:
                vcs[vc].missing.append(f"{ns}/{pod}")
                vcs[vc].missing_gpus += n
            else:
                vcs[vc].total += value * n
                vcs[vc].pods.append(f"{ns}/{pod}")
    return DemandView(workloads, dict(discovered), dict(vcs), grouped)
