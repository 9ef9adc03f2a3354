"""The Prometheus exporter of the sidecar: a custom collector and a small HTTP server."""

from dprobe.exporter.collector import SidecarCollector
from dprobe.exporter.server import ExporterServer
from dprobe.exporter.state import ExporterState, ForecastSnapshot, Latest, SourceStatus

__all__ = ["ExporterServer", "ExporterState", "ForecastSnapshot", "Latest", "SidecarCollector", "SourceStatus"]
