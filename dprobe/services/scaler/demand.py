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
from dprobe.services.scaler.config import VC_GPUS_QUERY, QueryOptions, VcOptions, WorkloadSpec, default_pods
from dprobe.services.sources.base import SourceError
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
    counted: int = 0  # pods with a forecast known by their number only (recorded series), besides ``pods``
    counted_missing: int = 0  # missing pods known by their number only, besides ``missing``

    @property
    def covered(self) -> int:
        """Pods with a usable forecast (a virtual cluster's, from recorded series: GPUs)."""
        return len(self.pods) + self.counted

    @property
    def n_missing(self) -> int:
        """Pods expected to have a forecast without one."""
        return len(self.missing) + self.counted_missing


@dataclass
class DemandView:
    """One cycle's demand per configured workload, per discovered workload and per virtual cluster."""

    workloads: dict[tuple[str, str], Demand]
    discovered: dict[tuple[str, str], Demand]
    vcs: dict[str, Demand]
    grouped: Counter[str] = field(default_factory=Counter)  # pods put in a workload, by method


def _vector(queries: QueryOptions, query: str) -> list[tuple[dict[str, str], float]]:
    """An instant ``query`` at the configured Prometheus, with its credentials (SourceError on failure); the
    warnings of its answer (a partial response) are kept for :func:`answer_warnings`."""
    server = queries.prometheus
    return query_vector(server.url, query, queries.http_timeout, server.auth(), answer_warnings(queries))


def answer_warnings(queries: QueryOptions) -> list[str]:
    """The warnings Prometheus sent with its answers to ``queries`` since the list was last emptied: Thanos and
    Mimir send one with a partial response (a store or an ingester not answering), Prometheus with some
    queries. The reader counts, logs and empties it each cycle."""
    return queries.__dict__.setdefault("_answer_warnings", [])


def _forecast_selectors(queries: QueryOptions) -> tuple[str, str]:
    """The selectors of every pod's forecast at the configured horizon and quantile, and (``job_profiles``; else
    '') of its training job's cold-start utilisation (p50 for a quantile up to 0.5, else p90: the profiles'
    highest)."""
    extra = f",{queries.forecast_selector.strip().strip(',')}" if queries.forecast_selector.strip() else ""
    query = (f'{PREDICTED_UTILIZATION}{{horizon_seconds="{queries.horizon_seconds}",'
             f'quantile="{queries.quantile:g}",pod!=""{extra}}}')
    if not queries.job_profiles:
        return query, ""
    return query, f'{JOB_UTILIZATION}{{quantile="{job_profile_quantile(queries)}",pod!=""{extra}}}'


def job_profile_quantile(queries: QueryOptions) -> str:
    """The cold-start profiles' quantile read for the configured forecast quantile: 0.5 up to 0.5, else 0.9."""
    return "0.5" if queries.quantile <= 0.5 else "0.9"


def forecast_query(queries: QueryOptions) -> str:
    """The PromQL selecting every pod's forecast at the configured horizon and quantile, and with
    ``job_profiles`` the cold-start utilisation of pods without one (p50 for a quantile up to 0.5,
    else p90: the profiles' highest)."""
    query, job = _forecast_selectors(queries)
    return f"{query} or on (namespace, pod) {job}" if job else query


def pod_forecast_query(queries: QueryOptions, keep: tuple[str, ...] = ()) -> str:
    """:func:`forecast_query` with each pod's series taken ``max by`` the labels the scaler reads (namespace, pod,
    target, ``horizon_seconds`` of a forecast, and ``keep``: the ``vc_label``), so that Prometheus answers one
    short row per pod and target instead of every series with all its labels: several sidecars' copies of a
    pod's forecast are one row, their highest."""
    by = ", ".join(dict.fromkeys(("namespace", "pod", "target", *(k for k in keep if k and k != "horizon_seconds"))))
    query, job = _forecast_selectors(queries)
    out = f"max by ({by}, horizon_seconds) ({query})"
    return f"{out} or on (namespace, pod) max by ({by}) ({job})" if job else out


def exported_horizons(queries: QueryOptions) -> set[str]:
    """The horizons (s) of the utilisation forecasts Prometheus holds (``forecast_selector`` applied)."""
    extra = f",{queries.forecast_selector.strip().strip(',')}" if queries.forecast_selector.strip() else ""
    query = f'count by (horizon_seconds) ({PREDICTED_UTILIZATION}{{pod!=""{extra}}})'
    return {h for labels, _ in _vector(queries, query) if (h := labels.get("horizon_seconds", ""))}


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


class LabelKeeper:
    """Keeps only the ``keep`` labels of each row of an answer (all of them where ``keep`` is None), in one dict per
    distinct set of values shared by the rows that have it, and one string per namespace: what the scaler holds
    per pod (at 80,000 pods, tens of MB less than each row's labels as decoded)."""

    def __init__(self, keep: tuple[str, ...] | None) -> None:
        self.keep = tuple(dict.fromkeys(k for k in keep if k)) if keep is not None else None
        self._dicts: dict[tuple[str, ...], dict[str, str]] = {}
        self._names: dict[str, str] = {}

    def labels(self, labels: dict[str, str]) -> dict[str, str]:
        """``labels`` as kept."""
        if self.keep is None:
            return labels
        values = tuple(labels.get(k, "") for k in self.keep)
        kept = self._dicts.get(values)
        if kept is None:
            kept = self._dicts[values] = {k: v for k, v in zip(self.keep, values, strict=True) if v}
        return kept

    def name(self, value: str) -> str:
        """One string object for every row's equal ``value`` (a namespace)."""
        return self._names.setdefault(value, value)


def pod_forecasts(queries: QueryOptions, rejected: Counter[str] | None = None, keep: tuple[str, ...] | None = None
                  ) -> dict[tuple[str, str], tuple[float, dict[str, str]]]:
    """``(namespace, pod) -> (forecast, labels)`` for every pod-level target (``target`` is
    ``namespace/pod``; a GPU's own series are skipped, so no pod is counted twice), asked by
    :func:`pod_forecast_query`; with ``keep`` (the ``vc_label``, ``horizon_seconds``: what the scaler reads) only
    those labels are kept (:class:`LabelKeeper`). Where several sidecars export the same pod, the highest forecast
    is kept (Prometheus's ``max``, which passes over NaN). A forecast that cannot be used (see
    :func:`forecast_problem`) is left out and counted in ``rejected`` by reason."""
    out: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
    keeper = LabelKeeper(keep)
    for labels, value in _vector(queries, pod_forecast_query(queries, keep or ())):
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if labels.get("target") not in (f"{ns}/{pod}", pod):
            continue
        problem = forecast_problem(value)
        if problem:
            if rejected is not None:
                rejected[problem] += 1
            continue
        if (ns, pod) not in out or value > out[(ns, pod)][0]:
            out[(keeper.name(ns), pod)] = (min(1.0, value), keeper.labels(labels))
    return out


def pod_gpus(queries: QueryOptions, keep: tuple[str, ...] | None = None
             ) -> dict[tuple[str, str], tuple[int, dict[str, str]]]:
    """GPUs per pod from ``gpus_query`` (empty when it is not set), with the row's labels (with ``keep``, only
    those: :class:`LabelKeeper`): the pods that hold GPUs, whether or not they have a forecast."""
    if not queries.gpus_query.strip():
        return {}
    keeper = LabelKeeper(keep)
    return {(keeper.name(lab.get("namespace", "")), lab.get("pod", "")): (max(1, int(round(v))), keeper.labels(lab))
            for lab, v in _vector(queries, queries.gpus_query) if math.isfinite(v) and lab.get("pod")}


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
    when it is not set), its samples summed by the ``vc_label`` label. With ``recorded_series``, the default query
    is read from what the rules record (:data:`RECORDED_REQUESTED_GPUS`)."""
    if not vcs.gpus_query.strip() or not vcs.label:
        return {}
    query = vcs.gpus_query
    if queries.recorded_series and query == VC_GPUS_QUERY:
        query = f"max by (namespace) ({RECORDED_REQUESTED_GPUS})"
    out: dict[str, float] = defaultdict(float)
    for labels, value in _vector(queries, query):
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


def workload_values(queries: QueryOptions, query: str) -> dict[tuple[str, str], float]:
    """``(namespace, workload) -> value`` of ``query`` (``activations_query``), the samples of one workload summed
    (NaN left out)."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for labels, value in _vector(queries, query):
        key = labels.get("namespace", ""), labels.get("workload", "")
        if key[1] and value == value:
            out[key] += value
    return dict(out)


ACTIVATION_LABEL = "dprobe_activation"  # which query of a batch a sample answers
# activation queries asked in one request: Prometheus (2.42) takes a time growing with the square of the parts of
# one expression to run it (measured: 100 parts 0.03 s, 1,000 parts 3.5 s, 2,000 parts 13 s), so a batch is cut
# at this many parts
ACTIVATION_BATCH = 100


def activation_batch(batch: list[str]) -> str:
    """One PromQL expression answering every activation query of ``batch``: each one's samples summed (NaN
    left out, as :func:`activation_value` does), labelled ``dprobe_activation="<its index>"``, the parts joined
    by ``or`` as a balanced tree (a chain would cost Prometheus O(n^2) label-set comparisons). An empty part
    answers nothing: 0."""
    parts = [f'label_replace(sum(({q}) >= -Inf), "{ACTIVATION_LABEL}", "{i}", "", "")' for i, q in enumerate(batch)]
    while len(parts) > 1:
        parts = [f"({' or '.join(parts[i:i + 2])})" if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def query_fault(exc: SourceError) -> bool:
    """Whether a failed query was refused for what it asks (bad PromQL, a scalar where a vector is expected, a
    query too heavy to run), rather than for the server (down, credentials, a timeout)."""
    text = str(exc)
    return any(m in text for m in ("HTTP 400", "HTTP 422", "query failed", "expected a vector"))


def activation_values(queries: QueryOptions, batch: list[str]) -> tuple[dict[str, float], dict[str, SourceError]]:
    """Each distinct activation query of ``batch``: its value (samples summed; none: 0), or why it failed. One
    query to Prometheus for every :data:`ACTIVATION_BATCH` of them (:func:`activation_batch`); a batch Prometheus
    refuses for what it asks is split in halves until the queries at fault are found (a bad query costs about
    log2(n) more queries, the others are still answered); one it fails for the server fails its queries with that
    error, and the batches after it are not asked (the same error)."""
    values: dict[str, float] = {}
    errors: dict[str, SourceError] = {}
    distinct = list(dict.fromkeys(batch))
    pending = [distinct[i:i + ACTIVATION_BATCH] for i in range(0, len(distinct), ACTIVATION_BATCH)][::-1]
    while pending:
        part = pending.pop()
        try:
            if len(part) == 1:
                values[part[0]] = activation_value(queries, part[0])
                continue
            rows = _vector(queries, activation_batch(part))
        except SourceError as exc:
            if len(part) > 1 and query_fault(exc):
                pending += [part[len(part) // 2:], part[:len(part) // 2]]
            elif query_fault(exc):
                errors[part[0]] = exc
            else:  # the server: the rest would fail alike
                errors.update(dict.fromkeys([q for rest in (part, *pending) for q in rest], exc))
                break
            continue
        found = {part[int(i)]: v for lab, v in rows
                 if (i := lab.get(ACTIVATION_LABEL, "")).isdigit() and int(i) < len(part)}
        values.update({q: float(found.get(q, 0.0)) for q in part})
    return values, errors


class SpecIndex:
    """The listed workloads indexed for the join of pods to workloads, so that grouping costs O(pods), not
    O(pods x workloads): by ``(namespace, owner)``, and by the workload name a default ``pods`` pattern
    implies (``NAME-HASH-XXXXX`` for a Deployment or Rollout, ``NAME-N`` for a StatefulSet). Only custom ``pods``
    patterns are tried one by one (those of the pod's namespace). Where several specs match, the first listed
    wins, as when each was tried in turn."""

    def __init__(self, specs: list[WorkloadSpec]) -> None:
        self.owners: dict[tuple[str, tuple[str, str]], tuple[int, WorkloadSpec]] = {}
        self.names: dict[tuple[str, str], list[tuple[int, WorkloadSpec]]] = defaultdict(list)
        self.custom: dict[str, list[tuple[int, WorkloadSpec]]] = defaultdict(list)
        for i, spec in enumerate(specs):
            self.owners.setdefault((spec.namespace, spec.owner_ref), (i, spec))
            if spec.pods.pattern == default_pods(spec.name, spec.kind):
                self.names[(spec.namespace, spec.name)].append((i, spec))
            else:
                self.custom[spec.namespace].append((i, spec))

    def by_owner(self, namespace: str, owner: tuple[str, str]) -> WorkloadSpec | None:
        """The first spec of ``namespace`` whose pods ``owner`` owns."""
        found = self.owners.get((namespace, owner))
        return found[1] if found else None

    def by_name(self, namespace: str, pod: str) -> WorkloadSpec | None:
        """The first spec of ``namespace`` whose ``pods`` pattern matches the pod's name."""
        candidates = [c for prefix in (pod.rsplit("-", 2)[0], pod.rsplit("-", 1)[0])
                      for c in self.names.get((namespace, prefix), ())]
        candidates += self.custom.get(namespace, ())
        return min(((i, s) for i, s in candidates if s.pods.fullmatch(pod)), key=lambda c: c[0],
                   default=(0, None))[1]


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
    index = SpecIndex(specs)
    discovered: dict[tuple[str, str], Demand] = defaultdict(Demand)
    vcs: dict[str, Demand] = defaultdict(Demand)
    grouped: Counter[str] = Counter()
    pods: list[tuple[tuple[str, str], float | None, dict[str, str]]] = [
        (key, value, labels) for key, (value, labels) in forecasts.items()]
    pods += [(key, None, labels) for key, (_, labels) in gpus.items() if key not in forecasts]
    for (ns, pod), value, labels in sorted(pods, key=lambda row: row[0]):
        demand: Demand | None = None
        owner = owners.get((ns, pod))
        if owner is not None:
            spec = index.by_owner(ns, owner)
            if spec is not None:
                demand = workloads[spec.key]
            elif discover and owner[0] in SCALABLE_OWNERS and (ns, owner[1]) not in workloads:
                demand = discovered[(ns, owner[1])]
            method = "owner"
        else:
            spec = index.by_name(ns, pod)
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


# the recording rules' series (deploy/prometheus/dprobe-rules.yaml, group dprobe-scaler-workloads)
RECORDED_WORKLOAD = {
    "demand": "dprobe:workload_gpu_utilization_forecast:sum", "covered": "dprobe:workload_forecast_pods:count",
    "seen": "dprobe:workload_pods:count", "job_demand": "dprobe:workload_job_gpu_utilization:sum",
    "job_pods": "dprobe:workload_job_pods:count"}
RECORDED_NAMESPACE = {
    "demand": "dprobe:namespace_gpu_demand_forecast:sum", "covered": "dprobe:namespace_forecast_gpus:sum",
    "seen": "dprobe:namespace_pod_gpus:sum", "job_demand": "dprobe:namespace_job_gpu_demand:sum",
    "job_pods": "dprobe:namespace_job_gpus:sum"}
RECORDED_REQUESTED_GPUS = "dprobe:namespace_requested_gpus:sum"  # vc_gpus_query's default, recorded
SERIES_LABEL = "dprobe_series"  # which recorded series a sample of the combined query is


def recorded_query(queries: QueryOptions, series: dict[str, str], by: str) -> str:
    """One query for the recorded ``series`` (:data:`RECORDED_WORKLOAD` or :data:`RECORDED_NAMESPACE`) at the
    configured horizon and quantile, each labelled ``dprobe_series``; ``max by`` takes one of the copies that
    Prometheus servers of an HA pair (un-deduplicated behind Thanos or Mimir) record alike."""
    profile = job_profile_quantile(queries)
    selectors = {"demand": f'{{horizon_seconds="{queries.horizon_seconds}",quantile="{queries.quantile:g}"}}',
                 "covered": f'{{horizon_seconds="{queries.horizon_seconds}",quantile="{queries.quantile:g}"}}',
                 "seen": "", "job_demand": f'{{quantile="{profile}"}}', "job_pods": f'{{quantile="{profile}"}}'}
    kinds = [k for k in series if queries.job_profiles or not k.startswith("job_")]
    return " or ".join(f'label_replace(max by ({by}) ({series[k]}{selectors[k]}), "{SERIES_LABEL}", "{k}", "", "")'
                       for k in kinds)


def recorded_demand(queries: QueryOptions, specs: list[WorkloadSpec], vc_label: str, discover: bool
                    ) -> DemandView | None:
    """The demand view from the recording rules' series (``recorded_series``): two queries whatever the number of
    pods and workloads. A workload's pods are those its owner owns (kube-state-metrics); missing pods are those
    seen (holding a GPU, or with a forecast at the horizon and quantile the rules record) without a usable one
    (or a cold-start profile). None when Prometheus holds none of the series (the rules not loaded,
    or nothing to record)."""
    rows = _vector(queries, recorded_query(queries, RECORDED_WORKLOAD, "namespace, owner_kind, owner_name"))
    per: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for labels, value in rows:
        if math.isfinite(value):
            key = labels.get("namespace", ""), labels.get("owner_kind", ""), labels.get("owner_name", "")
            per[key][labels.get(SERIES_LABEL, "")] = value
    vc_rows = _vector(queries, recorded_query(queries, RECORDED_NAMESPACE, "namespace")) if vc_label else []
    if not rows and not vc_rows:
        return None
    index = SpecIndex(specs)
    workloads = {s.key: Demand() for s in specs}
    discovered: dict[tuple[str, str], Demand] = {}
    grouped: Counter[str] = Counter()
    for (ns, kind, owner), values in sorted(per.items()):
        spec = index.by_owner(ns, (kind, owner))
        if spec is not None:
            demand = workloads[spec.key]
        elif discover and kind in SCALABLE_OWNERS and (ns, owner) not in workloads:
            demand = discovered.setdefault((ns, owner), Demand())
        else:
            continue
        covered = int(round(values.get("covered", 0) + values.get("job_pods", 0)))
        demand.total += values.get("demand", 0.0) + values.get("job_demand", 0.0)
        demand.counted += covered
        demand.counted_missing += max(0, int(round(values.get("seen", 0))) - covered)
        grouped["owner"] += demand.covered + demand.n_missing
    per_vc: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in vc_rows:
        if math.isfinite(value) and labels.get("namespace"):
            per_vc[labels["namespace"]][labels.get(SERIES_LABEL, "")] = value
    vcs: dict[str, Demand] = {}
    for vc, values in per_vc.items():  # a virtual cluster's "pods" are GPUs here
        covered = int(round(values.get("covered", 0) + values.get("job_pods", 0)))
        gpus = max(covered, int(round(values.get("seen", 0))))
        vcs[vc] = Demand(total=values.get("demand", 0.0) + values.get("job_demand", 0.0), gpus=gpus,
                         missing_gpus=gpus - covered, counted=covered, counted_missing=gpus - covered)
    return DemandView(workloads, discovered, vcs, grouped)


def recorded_pairs(queries: QueryOptions) -> set[tuple[str, str]]:
    """The (horizon (s), quantile) pairs of the recorded per-workload forecasts Prometheus holds: those the rules'
    selectors name (the scaler's defaults as shipped)."""
    query = f'count by (horizon_seconds, quantile) ({RECORDED_WORKLOAD["demand"]})'
    return {(labels.get("horizon_seconds", ""), labels.get("quantile", "")) for labels, _ in _vector(queries, query)}


def pods_forecast(queries: QueryOptions) -> bool:
    """Whether Prometheus holds any pod's utilisation forecast (the sidecars are scraped)."""
    return bool(_vector(queries, f'count({PREDICTED_UTILIZATION}{{pod!=""}})'))
