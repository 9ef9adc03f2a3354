"""Reading and setting a workload's replicas through the Kubernetes scale subresource (apply mode).

The official ``kubernetes`` client; the scaler needs RBAC ``get`` and ``patch`` on
``deployments/scale`` and ``statefulsets/scale``, and ``create`` on ``events`` for the Events it records
on what it rescales, as the HPA does (``deploy/scaler/rbac.yaml``).
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from dataclasses import dataclass
from typing import Any

from dprobe.services.scaler.config import WorkloadSpec

log = logging.getLogger(__name__)


class KubernetesError(RuntimeError):
    """The API server refused or could not be reached; names the workload and the reason."""


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (its ``involvedObject``)."""

    namespace: str
    kind: str
    name: str
    api_version: str

    @staticmethod
    def of(spec: WorkloadSpec) -> ObjectRef:
        return ObjectRef(spec.namespace, spec.kind, spec.name, "apps/v1")


EVENT_SOURCE = "dprobe-scaler"


class ScaleClient:
    """``replicas(spec)`` / ``scale(spec, n)`` on Deployments and StatefulSets, ``quota`` / ``set_quota``
    on a ResourceQuota's hard limit of one resource (a virtual cluster's GPUs)."""

    def __init__(self, kubeconfig: str = "", timeout: float = 5.0, apps: Any = None, core: Any = None) -> None:
        from kubernetes import client, config

        if apps is None or core is None:
            try:
                if kubeconfig:
                    config.load_kube_config(config_file=kubeconfig)
                else:
                    try:
                        config.load_incluster_config()
                    except config.ConfigException:
                        config.load_kube_config()  # outside a cluster: ~/.kube/config
            except Exception as exc:  # unreadable, malformed, incomplete: refused at start, in one line
                where = kubeconfig or "in-cluster config or ~/.kube/config"
                detail = " ".join(str(exc).split()) or type(exc).__name__
                raise ValueError(f"cannot use the kubeconfig ({where}): {detail}") from exc
        self.apps = apps if apps is not None else client.AppsV1Api()
        self.core = core if core is not None else client.CoreV1Api()
        self.timeout = timeout

    def _call(self, what: str, method: Any, *args: Any) -> Any:
        """``method(*args)``; any failure a :class:`KubernetesError` that names ``what``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return method(*args, _request_timeout=self.timeout)
        except ApiException as exc:
            raise KubernetesError(f"{what}: HTTP {exc.status} {exc.reason or ''}".rstrip()) from exc
        except (HTTPError, OSError) as exc:
            raise KubernetesError(f"{what}: {exc}") from exc

    def _scale(self, spec: WorkloadSpec, verb: str, *args: Any) -> Any:
        kind = "deployment" if spec.kind == "Deployment" else "stateful_set"
        return self._call(f"{spec.kind} {spec.namespace}/{spec.name}: {verb} scale",
                          getattr(self.apps, f"{verb}_namespaced_{kind}_scale"), spec.name, spec.namespace, *args)

    def replicas(self, spec: WorkloadSpec) -> int:
        """The workload's desired replica count (``spec.replicas`` of its scale)."""
        return int(self._scale(spec, "read").spec.replicas or 0)

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
