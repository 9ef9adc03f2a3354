"""The forecasting sidecar: sample GPU metrics, forecast per target, export to Prometheus."""

from dprobe.services.sidecar.config import SidecarConfig, load_config

__all__ = ["SidecarConfig", "load_config"]
