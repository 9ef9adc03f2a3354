"""Reading and setting a workload's replicas through the Kubernetes scale subresource (apply mode).

The official ``kubernetes`` client; the scaler needs RBAC ``get`` and ``patch`` on
``deployments/scale`` and ``statefulsets/scale`` (``deploy/scaler/rbac.yaml``).
"""

from __future__ import annotations

import logging
from typing import Any

from dprobe.scaler.config import WorkloadSpec

log = logging.getLogger(__name__)


class KubernetesError(RuntimeError):
    """The API server refused or could not be reached; names the workload and the reason."""


class ScaleClient:
    """``replicas(spec)`` and ``scale(spec, n)`` on Deployments and StatefulSets."""

    def __init__(self, kubeconfig: str = "", timeout: float = 5.0, api: Any = None) -> None:
        from kubernetes import client, config

        if api is None:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()  # outside a cluster: ~/.kube/config
            api = client.AppsV1Api()
        self.api, self.timeout = api, timeout

    def _call(self, spec: WorkloadSpec, verb: str, *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kind = "deployment" if spec.kind == "Deployment" else "stateful_set"
        method = getattr(self.api, f"{verb}_namespaced_{kind}_scale")
        try:
            return method(spec.name, spec.namespace, *args, _request_timeout=self.timeout)
        except ApiException as exc:
            reason = exc.reason or ""
            raise KubernetesError(f"{spec.kind} {spec.namespace}/{spec.name}: {verb} scale: "
                                  f"HTTP {exc.status} {reason}".rstrip()) from exc
        except (HTTPError, OSError) as exc:
            raise KubernetesError(f"{spec.kind} {spec.namespace}/{spec.name}: {verb} scale: {exc}") from exc

    def replicas(self, spec: WorkloadSpec) -> int:
        """The workload's desired replica count (``spec.replicas`` of its scale)."""
        return int(self._call(spec, "read").spec.replicas or 0)

    def scale(self, spec: WorkloadSpec, replicas: int) -> None:
        """Set the workload's replica count."""
        self._call(spec, "patch", {"spec": {"replicas": int(replicas)}})
        log.debug("%s %s/%s scaled to %d", spec.kind, spec.namespace, spec.name, replicas)
