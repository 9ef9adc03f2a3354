"""The Prometheus exporter of the sidecar: a custom collector and a small HTTP server."""

from dprobe.services.exporter.collector import SidecarCollector
from dprobe.services.exporter.server import ExporterServer
from dprobe.services.exporter.state import ExporterState, ForecastSnapshot, Latest, SourceStatus

__all__ = ["ExporterServer", "ExporterState", "ForecastSnapshot", "Latest", "SidecarCollector", "SourceStatus"]
