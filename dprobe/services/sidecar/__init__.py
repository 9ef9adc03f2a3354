"""The forecasting sidecar: sample GPU metrics, forecast per target, export to Prometheus.

The exports are imported when first used: a child process that reads a model graph
(:mod:`dprobe.services.sidecar.child`) imports its own module only, not the forecasters.
"""

from dprobe.core.lazy import lazy_exports

_EXPORTS = {"SidecarConfig": "dprobe.services.sidecar.config", "load_config": "dprobe.services.sidecar.config"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
