"""``dprobe scaler``: the sidecars' forecasts in, replica and GPU recommendations out."""

from __future__ import annotations

import argparse

from dprobe.core.options import add_service_parser
from dprobe.services.scaler.config import OPTIONS, ScalerConfig

DESCRIPTION = """Read the sidecars' GPU utilisation forecasts from Prometheus, sum them per workload and per
virtual cluster, and turn them into replica and GPU recommendations with the HPA's semantics
(target, tolerance, stabilisation windows, rate policies), KEDA's (activation, fallback) and VPA's
(quantile, safety margin). Recommendations are served on /metrics (dprobe_recommended_replicas,
dprobe_recommended_gpus) for Grafana, KEDA or the HPA; with --mode apply the listed workloads'
replicas are also set through the Kubernetes scale subresource. With --leader-election several replicas
run and only the one holding a Kubernetes Lease publishes and acts.
Settings come from a YAML file (--config FILE, or DPROBE_SCALER_CONFIG), which may hold every option
and lists the workloads, from environment variables (DPROBE_SCALER_<OPTION>, e.g.
DPROBE_SCALER_PROMETHEUS_URL) and from the flags below; flags win over the environment, which wins
over the file."""


def run(config: ScalerConfig) -> int:
    import os

    from dprobe.services.scaler.kube import kubernetes_uses, require_kubernetes
    from dprobe.services.scaler.service import Scaler

    # the Kubernetes client is the scaler extra: refused in one line, before anything starts, where it is needed
    require_kubernetes(kubernetes_uses(config.apply, config.leader.enabled,
                                       bool(os.environ.get("KUBERNETES_SERVICE_HOST"))))
    return Scaler(config).run()


def register(subparsers: argparse._SubParsersAction) -> None:
    add_service_parser(subparsers, "scaler", "run the scaler (forecasts -> scaling recommendations)", DESCRIPTION,
                       OPTIONS, run)
