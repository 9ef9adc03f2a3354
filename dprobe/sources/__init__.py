"""Metric sources behind one interface: NVML, dcgm-exporter, Prometheus, trace replay (and synthetic).

Each source's ``poll()`` returns :class:`Sample` objects (one per target,
base units) or raises :class:`SourceError`.
"""

from dprobe.sources.base import IDENTITY_LABELS, Sample, Source, SourceError, target_name

__all__ = ["IDENTITY_LABELS", "Sample", "Source", "SourceError", "target_name"]
