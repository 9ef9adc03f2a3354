"""Apply mode: reading and setting a workload's replicas through the Kubernetes scale subresource, and a
virtual cluster's GPUs through its ResourceQuota.

The official ``kubernetes`` client (the scaler extra, ``pip install 'dprobe[scaler]'``: imported only where it is
used, and :func:`kubernetes_uses` says at the start what needs it); the scaler needs RBAC ``get`` and ``patch`` on
``deployments/scale`` and ``statefulsets/scale`` (and ``rollouts/scale`` of ``argoproj.io`` for Argo Rollouts), and ``create`` on ``events`` for the Events it records
on what it rescales, as the HPA does (``deploy/scaler/rbac.yaml``).
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dprobe.scaling.policy import Decision
from dprobe.services.scaler.actuator import Actuator, ActuatorError
from dprobe.services.scaler.config import ApplyOptions, QueryOptions, VcOptions, WorkloadSpec

log = logging.getLogger(__name__)


class KubernetesError(ActuatorError):
    """The API server refused or could not be reached; names the workload and the reason. ``status``: the HTTP
    status where the API server answered."""

    stage = "kubernetes"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (its ``involvedObject``)."""

    namespace: str
    kind: str
    name: str
    api_version: str

    @staticmethod
    def of(spec: WorkloadSpec) -> ObjectRef:
        return ObjectRef(spec.namespace, spec.kind, spec.name, ROLLOUTS[0] + "/" + ROLLOUTS[1]
                         if spec.kind == "Rollout" else "apps/v1")


ROLLOUTS = ("argoproj.io", "v1alpha1", "rollouts")  # Argo Rollouts: group, version, plural


EVENT_SOURCE = "dprobe-scaler"


def kubernetes_uses(apply: ApplyOptions, leader_election: bool, in_cluster: bool) -> list[str]:
    """What of a scaler's configuration talks to the Kubernetes API, and so needs the ``kubernetes`` client:
    apply mode, leader election, and reading the workloads' scales in recommend mode (with a kubeconfig, or in
    a cluster)."""
    uses = ["--mode apply"] if apply.mode == "apply" else []
    if leader_election:
        uses.append("--leader-election")
    if apply.mode != "apply" and (apply.kubeconfig or in_cluster):
        uses.append("--kubeconfig (reading workloads' scales)" if apply.kubeconfig
                    else "reading workloads' scales in a cluster")
    return uses


def require_kubernetes(uses: list[str]) -> None:
    """ValueError, in one line, where ``uses`` (:func:`kubernetes_uses`) need the ``kubernetes`` client and it is
    not installed (the base install leaves it out)."""
    from dprobe.core.lazy import SCALER_EXTRA, installed

    if uses and not installed("kubernetes"):
        raise ValueError(f"{', '.join(uses)} needs the Kubernetes client, which is not installed here: install it "
                         f"with `{SCALER_EXTRA}`")


def api_client(kubeconfig: str = "") -> Any:
    """A Kubernetes ``ApiClient`` of ``kubeconfig`` (default: in-cluster, else ``~/.kube/config``), configured on
    its own (several clients in one process do not share a configuration). Raises ValueError, in one line, for a
    configuration that cannot be used: refused at start."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)  # outside a cluster: ~/.kube/config
    except Exception as exc:  # unreadable, malformed, incomplete
        where = kubeconfig or "in-cluster config or ~/.kube/config"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"cannot use the kubeconfig ({where}): {detail}") from exc
    return client.ApiClient(configuration)


class ScaleClient:
    """``replicas(spec)`` / ``scale(spec, n)`` on Deployments and StatefulSets, ``quota`` / ``set_quota``
    on a ResourceQuota's hard limit of one resource (a virtual cluster's GPUs)."""

    def __init__(self, kubeconfig: str = "", timeout: float = 5.0, apps: Any = None, core: Any = None,
                 custom: Any = None) -> None:
        from kubernetes import client

        api = api_client(kubeconfig) if apps is None or core is None or custom is None else None
        self.apps = apps if apps is not None else client.AppsV1Api(api)
        self.core = core if core is not None else client.CoreV1Api(api)
        self.custom = custom if custom is not None else client.CustomObjectsApi(api)
        self.timeout = timeout

    def _call(self, what: str, method: Any, *args: Any) -> Any:
        """``method(*args)``; any failure a :class:`KubernetesError` that names ``what``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return method(*args, _request_timeout=self.timeout)
        except ApiException as exc:
            raise KubernetesError(f"{what}: HTTP {exc.status} {exc.reason or ''}".rstrip(), exc.status) from exc
        except (HTTPError, OSError) as exc:
            raise KubernetesError(f"{what}: {exc}") from exc

    def _scale(self, spec: WorkloadSpec, verb: str, *args: Any) -> Any:
        what = f"{spec.kind} {spec.namespace}/{spec.name}: {verb} scale"
        if spec.kind == "Rollout":  # a custom resource's scale subresource: a dict
            method = getattr(self.custom, f"{'get' if verb == 'read' else verb}_namespaced_custom_object_scale")
            return self._call(what, method, ROLLOUTS[0], ROLLOUTS[1], spec.namespace, ROLLOUTS[2], spec.name, *args)
        kind = "deployment" if spec.kind == "Deployment" else "stateful_set"
        return self._call(what, getattr(self.apps, f"{verb}_namespaced_{kind}_scale"), spec.name, spec.namespace,
                          *args)

    def replicas(self, spec: WorkloadSpec) -> int:
        """The workload's desired replica count (``spec.replicas`` of its scale)."""
        scale = self._scale(spec, "read")
        if isinstance(scale, dict):
            return int((scale.get("spec") or {}).get("replicas") or 0)
        return int(scale.spec.replicas or 0)

    def scale(self, spec: WorkloadSpec, replicas: int) -> None:
        """Set the workload's replica count."""
        self._scale(spec, "patch", {"spec": {"replicas": int(replicas)}})
        log.debug("%s %s/%s scaled to %d", spec.kind, spec.namespace, spec.name, replicas)

    def quota(self, namespace: str, name: str, resource: str) -> int:
        """The hard limit of ``resource`` in ResourceQuota ``namespace/name`` (a whole number)."""
        what = f"ResourceQuota {namespace}/{name}"
        hard = (self._call(f"{what}: read", self.core.read_namespaced_resource_quota, name, namespace).spec.hard
                or {})
        if resource not in hard:
            raise KubernetesError(f"{what}: no hard limit on {resource} (set one, e.g. {resource}: \"8\")")
        try:
            return int(float(hard[resource]))
        except ValueError as exc:
            raise KubernetesError(f"{what}: {resource} is {hard[resource]!r}, not a whole number") from exc

    def set_quota(self, namespace: str, name: str, resource: str, value: int) -> None:
        """Set the hard limit of ``resource`` in ResourceQuota ``namespace/name``."""
        self._call(f"ResourceQuota {namespace}/{name}: patch", self.core.patch_namespaced_resource_quota, name,
                   namespace, {"spec": {"hard": {resource: str(int(value))}}})

    def record_event(self, obj: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        """An Event on ``obj`` (``kubectl describe`` and ``kubectl get events`` show it), as the HPA records
        ``SuccessfulRescale`` / ``FailedRescale`` on itself."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"metadata": {"generateName": f"{obj.name}.", "namespace": obj.namespace},
                "involvedObject": {"kind": obj.kind, "name": obj.name, "namespace": obj.namespace,
                                   "apiVersion": obj.api_version},
                "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                "source": {"component": EVENT_SOURCE}, "reportingComponent": EVENT_SOURCE,
                "reportingInstance": socket.gethostname(), "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        self._call(f"{obj.kind} {obj.namespace}/{obj.name}: record event", self.core.create_namespaced_event,
                   obj.namespace, body)


class Cluster(Protocol):
    """What :class:`KubernetesActuator` calls: a :class:`ScaleClient` (or a stand-in for one)."""

    def replicas(self, spec: WorkloadSpec) -> int: ...

    def scale(self, spec: WorkloadSpec, replicas: int) -> None: ...

    def quota(self, namespace: str, name: str, resource: str) -> int: ...

    def set_quota(self, namespace: str, name: str, resource: str, value: int) -> None: ...

    def record_event(self, obj: ObjectRef, reason: str, message: str, warning: bool = False) -> None: ...


class KubernetesActuator(Actuator):
    """Apply mode: a listed workload's decision starts from its scale and sets it; with ``vc_quota_name``, a
    virtual cluster's from and to the GPU limit of the ResourceQuota of that name in its namespace (without,
    its GPUs are recommended only). Each change is recorded as an Event on the object (``events`` option),
    ``SuccessfulRescale`` or ``FailedRescale``, as the HPA records them; a failure to record one is counted
    (``errors["events"]``) and logged once."""

    mode = "apply"

    def __init__(self, apply: ApplyOptions, vc: VcOptions, queries: QueryOptions, client: Cluster,
                 errors: Counter[str]) -> None:
        """``apply``: whether to record events; ``vc``: the quota set; ``queries``: what the forecasts read
        (their quantile and horizon, said in the events)."""
        self.apply, self.vc, self.queries, self.client, self.errors = apply, vc, queries, client, errors

    def replicas(self, spec: WorkloadSpec) -> int:
        return self.client.replicas(spec)

    def scale(self, spec: WorkloadSpec, decision: Decision, demand: float | None) -> bool:
        return self._set(ObjectRef.of(spec), lambda: self.client.scale(spec, decision.replicas), decision, demand,
                         "pod-equivalents")

    def gpus(self, vc: str) -> int | None:
        if not self.vc.quota_name:
            return None
        return self.client.quota(vc, self.vc.quota_name, self.vc.quota_resource)

    def set_gpus(self, vc: str, decision: Decision, demand: float | None) -> bool:
        if not self.vc.quota_name:
            return True  # recommended only
        name, resource = self.vc.quota_name, self.vc.quota_resource
        return self._set(ObjectRef(vc, "ResourceQuota", name, "v1"),
                         lambda: self.client.set_quota(vc, name, resource, decision.replicas), decision, demand, "GPUs")

    def _set(self, obj: ObjectRef, patch: Callable[[], None], decision: Decision, demand: float | None, unit: str) -> bool:
        """``patch()``, then an Event on ``obj`` saying how it went; False when the patch failed (counted, logged)."""
        try:
            patch()
        except KubernetesError as exc:
            self.errors[exc.stage] += 1
            log.warning("%s", exc)
            self._event(obj, "FailedRescale", f"New size: {decision.replicas}; error: {exc}", warning=True)
            return False
        c = self.queries
        why = "no forecast" if demand is None else (
            f"demand {demand:.2f} {unit} (p{100 * c.quantile:g} of GPU utilisation {c.horizon_seconds} s ahead)")
        self._event(obj, "SuccessfulRescale", f"New size: {decision.replicas}; reason: {decision.reason}; {why}")
        return True

    def _event(self, obj: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        """Record a Kubernetes Event on ``obj`` (``events`` option); a failure is counted, logged once."""
        if not self.apply.events:
            return
        try:
            self.client.record_event(obj, reason, message, warning)
        except KubernetesError as exc:
            self.errors["events"] += 1
            log.log(logging.WARNING if self.errors["events"] == 1 else logging.DEBUG,
                    "%s (further failures to record events are counted in dprobe_scaler_errors_total"
                    "{stage=\"events\"})", exc)
