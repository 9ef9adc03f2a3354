"""What the services share to export their metrics: the HTTP server (/metrics, /healthz, /readyz) and the base
of their collectors."""

from dprobe.services.exporter.collector import StateCollector
from dprobe.services.exporter.server import ExporterServer, run_until_signalled

__all__ = ["ExporterServer", "StateCollector", "run_until_signalled"]
