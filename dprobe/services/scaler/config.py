"""Scaler settings (defaults < YAML file < ``DPROBE_SCALER_*`` variables < flags; read and type-checked with
pydantic-settings, :mod:`dprobe.core.option_sources`) and the scaled objects.

The options come in groups (:mod:`dprobe.core.options`): the forecasts and Prometheus queries read
(:class:`QueryOptions`, with the server's :class:`PrometheusServer`), the policy (:class:`PolicyOptions`), the
virtual clusters (:class:`VcOptions`), apply mode (:class:`ApplyOptions`), GPU shares
(:class:`~dprobe.services.scaler.sharing_config.SharingOptions`), leader election (:class:`LeaderOptions`) and
the HTTP server (:class:`~dprobe.services.exporter.options.WebOptions`). Their flags, variables and YAML keys
keep their flat names (``--vc-label``, ``sharing: {enabled: true}``), and so does :class:`ScalerConfig`
(``config.vc_label`` is ``config.vc.label``).

The policy options set the defaults of every workload's :class:`~dprobe.scaling.policy.Policy`; a
workload listed under ``workloads:`` may override any of them, and its behaviour per direction
(the HPA's ``behavior``)::

    workloads:
      - namespace: serving
        name: llm-server           # the Deployment (kind: Deployment | StatefulSet | Rollout)
        owner: {kind: Deployment, name: llm-server}  # whose pods are its replicas (default: kind and name)
        pods: "llm-server-.*"      # regex on pod names, for pods kube-state-metrics does not show an owner of
        target: 0.6
        max_replicas: 8
        scale_up: {tolerance: 0}   # scale up as soon as demand exceeds capacity
        scale_down: {stabilization_seconds: 600, policies: [{type: pods, value: 1, period_seconds: 60}]}
      - namespace: batch
        name: trainer
        min_replicas: 0            # scales to zero, and is woken from it by the activation query
        activation_query: sum(kueue_pending_workloads{cluster_queue="batch"})
        activation_query_threshold: 0
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dprobe.core.names import QUANTILES
from dprobe.core.options import (
    Check,
    OptionSet,
    check_options,
    group,
    http_url,
    non_negative,
    one_of,
    option,
    period,
    positive,
    ratio,
    settings,
)
from dprobe.scaling.policy import (
    DEFAULT_POLICY,
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    MAX_GPUS,
    MIN_GPUS,
    Policy,
    RatePolicy,
    ScalingRules,
)
from dprobe.services.exporter.options import WebOptions
from dprobe.services.scaler.sharing_config import SharingOptions, SharingSettings
from dprobe.services.sources.http import HttpAuth
from dprobe.services.sources.prometheus import PrometheusAccess

ENV_PREFIX = "DPROBE_SCALER_"
MODES = ("recommend", "apply")
KINDS = ("Deployment", "StatefulSet", "Rollout")  # Rollout: Argo Rollouts (argoproj.io/v1alpha1)
# kube-state-metrics: each pod's controller, through its ReplicaSet to the Deployment or Rollout that owns that
# (a StatefulSet, DaemonSet or Job owns its pods directly); labels namespace, pod, owner_kind, owner_name
OWNERS_QUERY = (
    'max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner{owner_kind!~"ReplicaSet|<none>|",'
    'owner_is_controller="true"}) or max by (namespace, pod, owner_kind, owner_name) ('
    'max by (namespace, pod, replicaset) (label_replace(kube_pod_owner{owner_kind="ReplicaSet",'
    'owner_is_controller="true"}, "replicaset", "$1", "owner_name", "(.+)")) * on (namespace, replicaset) '
    'group_left (owner_kind, owner_name) max by (namespace, replicaset, owner_kind, owner_name) ('
    'kube_replicaset_owner{owner_kind!~"<none>|",owner_is_controller="true"}))')
# kube-state-metrics: the GPUs each namespace's running pods request (two kube-state-metrics replicas counted once)
VC_GPUS_QUERY = (
    'sum by (namespace) (max by (namespace, pod, container) (kube_pod_container_resource_requests{'
    'resource="nvidia_com_gpu"}) * on (namespace, pod) group_left () max by (namespace, pod) ('
    'kube_pod_status_phase{phase="Running"} == 1))')
POLICY_FIELDS = {f.name for f in fields(Policy)} - {"scale_up", "scale_down"}
MIN_INTERVAL = 0.1  # s: the shortest decision interval (each cycle queries Prometheus)
ACTIVATION_KEYS = ("activation_query", "activation_query_threshold")


@dataclass
class PrometheusServer(PrometheusAccess):
    """The Prometheus server the scaler reads (``prometheus_*``): where, and its credentials and TLS settings."""

    url: str = option("http://127.0.0.1:9090", "Prometheus server holding the sidecars' forecasts",
                      check=http_url("http://HOST:9090"))


@dataclass
class QueryOptions:
    """What the scaler asks Prometheus: the forecasts (horizon, quantile, selector) and kube-state-metrics'
    series, and how long it waits for an answer."""

    prometheus: PrometheusServer = group(PrometheusServer)
    horizon_seconds: int = option(300, "forecast horizon the decisions use (one of the sidecars' horizons)",
                                  check=positive)
    quantile: float = option(0.9, "forecast quantile the decisions use (0.5, 0.9 or 0.99)",
                             check=one_of(QUANTILES, "one the sidecars export"))
    http_timeout: float = option(5.0, "timeout of Prometheus queries and Kubernetes calls (s)", check=positive)
    forecast_selector: str = option("", "extra PromQL label matchers for the forecasts, e.g. job=\"dprobe\"")
    job_profiles: bool = option(True, "count a pod without a forecast yet at its training job's cold-start "
                                      "utilisation, where its sidecar exports one (dprobe_job_*)")
    gpus_query: str = option('count by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})',
                             "PromQL giving each pod's GPU count (a pod it does not list counts 1)")
    replicas_query: str = option(
        'label_replace(kube_deployment_spec_replicas, "workload", "$1", "deployment", "(.+)") or '
        'label_replace(kube_statefulset_replicas, "workload", "$1", "statefulset", "(.+)")',
        "PromQL giving each workload's replicas by namespace and workload labels (kube-state-metrics): the pods "
        "a decision expects where it does not read the scale (recommend mode, discovered workloads), so that "
        "pods without a forecast count as missing, and where a count starts when no earlier recommendation is "
        "kept ('' = none: the last recommendation, else nothing published)")
    owners_query: str = option(OWNERS_QUERY, "PromQL giving each pod's owning workload by namespace, pod, owner_kind "
                                             "and owner_name labels (kube-state-metrics' kube_pod_owner, through "
                                             "kube_replicaset_owner): a workload's replicas are the pods its owner "
                                             "owns; a pod it does not list is grouped by name ('' = by name only)")
    activations_query: str = option("", "PromQL giving every workload's activation value at once, by namespace and "
                                        "workload labels (KEDA's activation, one query a cycle whatever the number "
                                        "of workloads): a listed workload with min_replicas 0 and no activation_query "
                                        "of its own is woken from zero while its value is above "
                                        "activations_query_threshold ('' = none)")
    activations_query_threshold: float = option(0.0, "the value of activations_query above which a workload is "
                                                     "active")
    recorded_series: bool = option(False, "read each workload's and namespace's forecast demand from the series "
                                          "dprobe's recording rules record (deploy/prometheus/dprobe-rules.yaml, "
                                          "group dprobe-scaler-workloads): O(workloads) series a cycle instead of "
                                          "every pod's; pods grouped by owner only (kube-state-metrics), virtual "
                                          "clusters by namespace; where the rules are not loaded, every pod's "
                                          "forecasts are read (logged, counted)")
    restore_seconds: float = option(3600.0, "a (re)started scaler (or a new leader) starts what it only recommends "
                                            "from its own last recommendations Prometheus (or the Lease) kept this "
                                            "far back (0 = don't)",
                                    check=non_negative)


@dataclass
class PolicyOptions:
    """The defaults of every workload's :class:`~dprobe.scaling.policy.Policy` (a ``workloads:`` entry may
    override them), and which workloads are scaled."""

    discover: bool = option(True, "also recommend (never apply) for Deployment-like pod groups not listed "
                                  "under workloads")
    target: float = option(DEFAULT_POLICY.target, "utilisation (0-1) one replica should carry; for GPUs, one GPU",
                           check=ratio)
    margin: float = option(DEFAULT_POLICY.margin, "safety margin added to the forecast demand (VPA)")
    tolerance: float = option(DEFAULT_POLICY.tolerance, "no change while demand / capacity is within this of 1 (HPA)")
    scale_up_tolerance: float | None = option(DEFAULT_SCALE_UP.tolerance, "tolerance above 1 only: a scale-up needs "
                                              "demand / capacity above 1 + this (unset: tolerance)",
                                              check=non_negative.or_unset("tolerance"))
    scale_down_tolerance: float | None = option(DEFAULT_SCALE_DOWN.tolerance, "tolerance below 1 only: a scale-down "
                                                "needs demand / capacity below 1 - this (unset: tolerance)",
                                                check=non_negative.or_unset("tolerance"))
    min_replicas: int = option(DEFAULT_POLICY.min_replicas, "fewest replicas recommended (0 allows scale to zero "
                                                            "below activation)")
    max_replicas: int = option(DEFAULT_POLICY.max_replicas, "most replicas recommended")
    activation: float = option(DEFAULT_POLICY.activation, "with min_replicas 0: demand below this scales to zero "
                                                          "(KEDA)")
    fallback_replicas: int | None = option(DEFAULT_POLICY.fallback_replicas, "replicas after failure_threshold "
                                           "cycles without a forecast (KEDA fallback; unset: hold the current count)")
    failure_threshold: int = option(DEFAULT_POLICY.failure_threshold, "cycles without a forecast before the fallback")
    min_forecast_coverage: float = option(DEFAULT_POLICY.min_forecast_coverage, "below this share of a workload's "
                                          "expected pods with a forecast, its count is held (as with no forecast)")
    scale_up_stabilization_seconds: float = option(DEFAULT_SCALE_UP.stabilization_seconds, "a scale-up takes the "
                                                   "lowest recommendation of this window")
    scale_down_stabilization_seconds: float = option(DEFAULT_SCALE_DOWN.stabilization_seconds, "a scale-down takes "
                                                     "the highest recommendation of this window")
    scale_up_policies: list[dict[str, Any]] = option(
        [asdict(r) for r in DEFAULT_SCALE_UP.policies],
        "rate limits of a scale-up, the largest change allowed wins: [{type: pods|percent, value, period_seconds}] "
        "(HPA behavior.scaleUp.policies; YAML, or JSON in env)")
    scale_down_policies: list[dict[str, Any]] = option(
        [asdict(r) for r in DEFAULT_SCALE_DOWN.policies],
        "rate limits of a scale-down, as scale_up_policies (HPA behavior.scaleDown.policies)")
    workloads: list[dict[str, Any]] = option([], "scaled workloads with their own settings (YAML, or JSON in env)")

    def default_policy(self) -> Policy:
        """The policy of a workload that sets nothing itself."""
        return Policy(
            target=self.target, margin=self.margin, tolerance=self.tolerance, min_replicas=self.min_replicas,
            max_replicas=self.max_replicas, activation=self.activation, fallback_replicas=self.fallback_replicas,
            failure_threshold=self.failure_threshold, min_forecast_coverage=self.min_forecast_coverage,
            scale_up=replace(DEFAULT_SCALE_UP, stabilization_seconds=self.scale_up_stabilization_seconds,
                             tolerance=self.scale_up_tolerance, policies=rate_policies(self.scale_up_policies)),
            scale_down=replace(DEFAULT_SCALE_DOWN, stabilization_seconds=self.scale_down_stabilization_seconds,
                               tolerance=self.scale_down_tolerance,
                               policies=rate_policies(self.scale_down_policies)))

    def workload_specs(self) -> list[WorkloadSpec]:
        """The ``workloads:`` entries, each checked (a clear error naming the entry)."""
        if not isinstance(self.workloads, list) or not all(isinstance(e, Mapping) for e in self.workloads):
            raise ValueError(f"workloads must be a list of mappings, got {self.workloads!r}")
        specs: list[WorkloadSpec] = []
        seen: dict[tuple[str, str], int] = {}
        for i, entry in enumerate(self.workloads):
            spec = WorkloadSpec.parse(entry, self.default_policy(), i)
            if spec.key in seen:
                raise ValueError("workloads[{}]: {}/{} is listed twice (also workloads[{}])".format(
                    i, *spec.key, seen[spec.key]))
            seen[spec.key] = i
            specs.append(spec)
        return specs


# the checks of the policy options a workloads: entry may override (target: a ratio)
POLICY_CHECKS = {f.name: f.metadata["check"] for f in fields(PolicyOptions) if "check" in f.metadata}


@dataclass
class VcOptions:
    """Virtual clusters (``vc_*``): how pods are grouped into them, their GPU bounds, and in apply mode the
    ResourceQuota set to their recommendation."""

    label: str = option("namespace", "label grouping pods into virtual clusters for dprobe_recommended_gpus "
                                     "('' = no virtual clusters)")
    quota_name: str = option("", "apply mode: the ResourceQuota (in each virtual cluster's namespace) whose "
                                 "GPU limit is set to the recommendation ('' = recommend GPUs only)")
    quota_resource: str = option("requests.nvidia.com/gpu", "the ResourceQuota resource that counts GPUs")
    gpus_query: str = option(VC_GPUS_QUERY, "PromQL giving the GPUs each virtual cluster's pods hold, by its "
                                            "vc_label label (kube-state-metrics: what its running pods request): "
                                            "where a cluster's count starts when no earlier recommendation is kept "
                                            "('' = none: from its last recommendation, else not known: nothing "
                                            "published for it)")
    pending_query: str = option("", "PromQL giving the GPUs waiting in each virtual cluster, by its vc_label "
                                    "label (pending pods, queued jobs: no sidecar forecasts them), added to "
                                    "the cluster's demand ('' = none)")
    min_gpus: int = option(MIN_GPUS, "fewest GPUs recommended for a virtual cluster", name="min_gpus")
    max_gpus: int = option(MAX_GPUS, "most GPUs recommended for a virtual cluster", name="max_gpus")


@dataclass
class ApplyOptions:
    """Whether and how the scaler acts on the cluster (Kubernetes)."""

    mode: str = option("recommend", "recommend: export and log only; apply: also set the workloads' replicas "
                                    "through the Kubernetes scale subresource", choices=MODES)
    kubeconfig: str = option("", "kubeconfig file for apply mode (default: in-cluster, else ~/.kube/config); "
                                 "recommend mode reads the workloads' scale where it has one (or runs in a cluster) "
                                 "and RBAC allows, to know where a count starts")
    events: bool = option(True, "apply mode: record a Kubernetes Event (SuccessfulRescale, FailedRescale) on each "
                                "workload or ResourceQuota it changes, as the HPA does")


LEASE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_SHARDS = 256  # each shard is a Lease every replica reads every leader_election_retry_seconds


@dataclass
class LeaderOptions:
    """Several replicas: leader election through a Lease (``leader_election_*``; :mod:`.leader`)."""

    enabled: bool = option(False, "only the replica holding the Lease (coordination.k8s.io/v1) publishes "
                                  "recommendations and acts; the others stand by (run 2 replicas; needs "
                                  "get, create and update on leases, and the kubeconfig or in-cluster "
                                  "credentials)", name="leader_election")
    lease_name: str = option("dprobe-scaler", "the Lease the replicas elect their leader with",
                             check=Check("must be a Kubernetes object name (lower case letters, digits, '-' and "
                                         "'.')", lambda v: bool(LEASE_NAME.fullmatch(v))))
    namespace: str = option("", "the Lease's namespace ('' = the pod's own, else default)",
                            check=Check("must be a namespace's name (or '' for the pod's own)",
                                        lambda v: not v or bool(NAMESPACE.fullmatch(v))))
    lease_seconds: int = option(15, "a replica takes the Lease once its holder has not renewed it for this long (s)")
    renew_seconds: float = option(10.0, "the holder stops leading when it could not renew the Lease for this long "
                                        "(s; below lease_seconds)")
    retry_seconds: float = option(2.0, "how often the holder renews the Lease, and the others try to take it (s)")
    shards: int = option(1, "spread the namespaces and virtual clusters over this many shards, each with its own "
                            "Lease (<lease_name>-shard-<i>) held by one replica; the replicas share them out "
                            "(needs leader_election; 1 = one Lease, lease_name, one leader)", name="shards",
                         check=Check(f"must be a whole number from 1 to {MAX_SHARDS}",
                                     lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SHARDS))

    def check(self) -> None:
        if not 0 < self.retry_seconds < self.renew_seconds < self.lease_seconds:
            raise ValueError("need 0 < leader_election_retry_seconds < leader_election_renew_seconds < "
                             f"leader_election_lease_seconds, got {self.retry_seconds:g}, {self.renew_seconds:g}, "
                             f"{self.lease_seconds:g}")
        if self.shards > 1 and not self.enabled:
            raise ValueError(f"shards: {self.shards} needs leader_election: true (each shard is a Lease)")
        longest = f"{self.lease_name}-shard-{self.shards - 1}" if self.shards > 1 else self.lease_name
        for lease in (longest, f"{self.lease_name}-members") if self.shards > 1 else (longest,):
            if not LEASE_NAME.fullmatch(lease):
                raise ValueError(f"leader_election_lease_name {self.lease_name!r} makes the Lease name {lease!r}, "
                                 "which is not a Kubernetes object name (at most 253 characters)")


@settings
class ScalerConfig:
    """Every option of ``dprobe scaler``, in its groups; also by flat name (``ScalerConfig(vc_label=...)``,
    ``config.vc_label``). The ``prometheus_*`` credential and TLS options
    (:class:`~dprobe.services.sources.prometheus.PrometheusAccess`) are the sidecar's too."""

    interval: float = option(30.0, "seconds between decisions", check=period(MIN_INTERVAL))
    queries: QueryOptions = group(QueryOptions, "forecast and Prometheus queries", prefix="")
    web: WebOptions = group(WebOptions, prefix="web_", port=9478)
    policy: PolicyOptions = group(PolicyOptions, "policy (the HPA's and VPA's settings)", prefix="")
    vc: VcOptions = group(VcOptions, "virtual clusters")
    apply: ApplyOptions = group(ApplyOptions, "apply mode (Kubernetes)", prefix="")
    sharing: SharingOptions = group(SharingOptions, "GPU shares", when="enabled")
    leader: LeaderOptions = group(LeaderOptions, "leader election", prefix="leader_election_")
    log_level: str = option("info", "debug, info, warning or error")

    def validate(self) -> ScalerConfig:
        """Check every option (:func:`~dprobe.core.options.check_options`), then the options together; a
        ValueError naming the option(s)."""
        check_options(self)
        self.web.check()
        self.queries.prometheus.check_access(self.queries.prometheus.url)
        if self.vc.pending_query.strip() and not self.vc.label:
            raise ValueError("vc_pending_query needs vc_label (the label that names each virtual cluster)")
        if self.queries.recorded_series:
            self.check_recorded()
        if self.vc.quota_name and self.vc.label != "namespace":
            raise ValueError("vc_quota_name needs vc_label: namespace (a ResourceQuota lives in a namespace), "
                             f"got vc_label {self.vc.label!r}")
        for name in ("scale_up_policies", "scale_down_policies"):
            try:
                rate_policies(getattr(self.policy, name))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from exc
        self.leader.check()
        if not 0 <= self.vc.min_gpus <= self.vc.max_gpus:
            raise ValueError(f"need 0 <= min_gpus <= max_gpus, got {self.vc.min_gpus}, {self.vc.max_gpus}")
        self.default_policy()  # checks the policy options
        self.sharing_settings()  # checks the sharing options (None when sharing is off)
        self.workload_specs()  # checks every workload entry
        return self

    def check_recorded(self) -> None:
        """What ``recorded_series`` cannot do (a ValueError naming the option): the rules record per namespace,
        from every sidecar's series, and sharing needs each pod's memory forecast."""
        if self.vc.label not in ("namespace", ""):
            raise ValueError(f"recorded_series needs vc_label: namespace (or ''): the rules record per namespace, "
                             f"got vc_label {self.vc.label!r}")
        if self.queries.forecast_selector.strip():
            raise ValueError("recorded_series reads the recording rules' series, which forecast_selector does not "
                             "select: put the matchers in the rules (deploy/prometheus/dprobe-rules.yaml) instead")
        if self.sharing.enabled:
            raise ValueError("sharing reads each pod's memory forecast: it needs recorded_series: false")

    def prometheus_auth(self) -> HttpAuth:
        """The credentials and TLS settings of the Prometheus server read."""
        return self.queries.prometheus.auth()

    def sharing_settings(self) -> SharingSettings | None:
        """The ``sharing:`` options checked (a clear error naming the option), or None when sharing is off."""
        return SharingSettings.from_options(self.sharing) if self.sharing.enabled else None

    def default_policy(self) -> Policy:
        """The policy of a workload that sets nothing itself."""
        return self.policy.default_policy()

    def gpu_policy(self) -> Policy:
        """The policy of a virtual cluster's GPU count: one GPU carries ``target`` of utilisation."""
        return replace(self.default_policy(), min_replicas=self.vc.min_gpus, max_replicas=self.vc.max_gpus,
                       fallback_replicas=None)

    def workload_specs(self) -> list[WorkloadSpec]:
        """The ``workloads:`` entries (:meth:`PolicyOptions.workload_specs`)."""
        return self.policy.workload_specs()


@dataclass(frozen=True)
class WorkloadSpec:
    """A scaled workload: what to scale, which pods are its replicas, and its policy."""

    namespace: str
    name: str
    kind: str
    pods: re.Pattern[str]  # pod names, for pods without a known owner
    policy: Policy
    activation_query: str = ""  # PromQL: the workload is active while its value (summed) is above the threshold
    activation_query_threshold: float = 0.0
    owner: tuple[str, str] = ("", "")  # (kind, name) of the controller owning its pods; default (kind, name)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def owner_ref(self) -> tuple[str, str]:
        return self.owner if self.owner[0] else (self.kind, self.name)

    @staticmethod
    def parse(entry: Mapping[str, Any], defaults: Policy, index: int = 0) -> WorkloadSpec:
        """One ``workloads:`` entry; a clear error naming the entry for anything wrong in it."""
        where = f"workloads[{index}]"
        entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
        unknown = sorted(set(entry) - POLICY_FIELDS - {"namespace", "name", "kind", "pods", "owner", "scale_up",
                                                         "scale_down", *ACTIVATION_KEYS})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for key in ("namespace", "name"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ValueError(f"{where}: {key} is required")
        where = f"workloads[{index}] ({entry['namespace']}/{entry['name']})"
        kind = entry.get("kind", "Deployment")
        if kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        owner = _owner(entry.get("owner", {}), kind, entry["name"], where)
        try:
            pods = re.compile(str(entry.get("pods") or default_pods(entry["name"], kind)))
            overrides = {k: entry[k] for k in POLICY_FIELDS if k in entry}
            for key, value in overrides.items():  # the checks of the options they override
                check = POLICY_CHECKS.get(key)
                if check is not None:
                    check(key, value)
            for direction in ("scale_up", "scale_down"):
                if direction in entry:
                    overrides[direction] = _rules(entry[direction], getattr(defaults, direction))
            policy = replace(defaults, **overrides)
            query, threshold = _activation(entry, policy)
        except (re.error, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
        return WorkloadSpec(entry["namespace"], entry["name"], kind, pods, policy, query, threshold, owner)


def default_pods(name: str, kind: str) -> str:
    """The ``pods`` pattern of a workload that sets none: a StatefulSet's ``NAME-N``, else a Deployment's (or
    Rollout's) ``NAME-HASH-XXXXX``."""
    return rf"{re.escape(name)}-\d+" if kind == "StatefulSet" else rf"{re.escape(name)}-[a-z0-9]+-[a-z0-9]{{5}}"


def _owner(doc: Any, kind: str, name: str, where: str) -> tuple[str, str]:
    """A workload's ``owner: {kind, name}``: the controller whose pods are its replicas (default: itself)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: owner must be a mapping {{kind, name}}, got {doc!r}")
    unknown = sorted(set(map(str, doc)) - {"kind", "name"})
    if unknown:
        raise ValueError(f"{where}: unknown owner key(s) {', '.join(unknown)}")
    owner = doc.get("kind", kind), doc.get("name", name)
    if not all(isinstance(v, str) and v for v in owner):
        raise ValueError(f"{where}: owner kind and name must be names, got {owner!r}")
    return owner


def _activation(entry: Mapping[str, Any], policy: Policy) -> tuple[str, float]:
    """A workload's activation query and threshold; only a workload that may scale to zero has one."""
    query = entry.get("activation_query") or ""
    if not isinstance(query, str):
        raise ValueError(f"activation_query must be a PromQL string, got {query!r}")
    threshold = entry.get("activation_query_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"activation_query_threshold must be a number, got {threshold!r}")
    if "activation_query_threshold" in entry and not query:
        raise ValueError("activation_query_threshold needs an activation_query")
    if query and policy.min_replicas != 0:
        raise ValueError(f"activation_query wakes a workload from zero replicas: it needs min_replicas: 0, "
                         f"got {policy.min_replicas}")
    return query.strip(), float(threshold)


def _rules(doc: Any, defaults: ScalingRules) -> ScalingRules:
    if not isinstance(doc, Mapping):
        raise ValueError(f"a scaling behaviour must be a mapping, got {doc!r}")
    unknown = sorted(set(doc) - {"stabilization_seconds", "policies", "select", "tolerance"})
    if unknown:
        raise ValueError(f"unknown behaviour key(s) {', '.join(unknown)}")
    policies = rate_policies(doc["policies"]) if "policies" in doc else defaults.policies
    tolerance = doc.get("tolerance", defaults.tolerance)
    return ScalingRules(float(doc.get("stabilization_seconds", defaults.stabilization_seconds)), policies,
                        doc.get("select", defaults.select), None if tolerance is None else float(tolerance))


def rate_policies(entries: Any) -> tuple[RatePolicy, ...]:
    """``[{type, value, period_seconds}, ...]`` as rate policies (type defaults to percent, period to 15 s)."""
    if not isinstance(entries, list) or not all(isinstance(p, Mapping) and "value" in p for p in entries):
        raise ValueError(f"policies must be a list of {{type, value, period_seconds}}, got {entries!r}")
    unknown = sorted({str(k) for p in entries for k in p} - {"type", "value", "period_seconds"})
    if unknown:
        raise ValueError(f"unknown rate policy key(s) {', '.join(unknown)}")
    try:
        return tuple(RatePolicy(p.get("type", "percent"), float(p["value"]), float(p.get("period_seconds", 15)))
                     for p in entries)
    except TypeError as exc:
        raise ValueError(f"rate policy values must be numbers: {exc}") from exc


# the flags `dprobe scaler --help` shows (every option's flag is taken: --help-all lists them)
MAIN_FLAGS = ("port", "listen_address", "log_level", "prometheus_url", "interval", "horizon_seconds", "quantile",
              "target", "mode", "kubeconfig", "leader_election", "sharing_enabled")
OPTIONS = OptionSet(ScalerConfig, ENV_PREFIX, "scaler", flags=MAIN_FLAGS)
add_arguments = OPTIONS.add_arguments


def load_config(args: argparse.Namespace | Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> ScalerConfig:
    """Merge defaults < YAML file < environment < flags into a validated :class:`ScalerConfig`."""
    return OPTIONS.load(args, env)
