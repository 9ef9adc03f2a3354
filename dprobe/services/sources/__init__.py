"""Metric sources behind one interface: NVML, dcgm-exporter, Prometheus, trace replay (and synthetic).

Each source's ``poll()`` returns :class:`Sample` objects (one per target,
base units) or raises :class:`SourceError`; :func:`screen_samples` refuses
what no GPU can read (NaN, infinite, negative, future timestamps).
"""

from dprobe.services.sources.base import (
    IDENTITY_LABELS,
    REJECT_REASONS,
    Sample,
    Source,
    SourceError,
    check_reading,
    screen_samples,
    target_name,
)

__all__ = ["IDENTITY_LABELS", "REJECT_REASONS", "Sample", "Source", "SourceError", "check_reading",
           "screen_samples", "target_name"]
