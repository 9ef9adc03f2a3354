"""The metric-source interface: each source yields timestamped samples per target."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# dcgm-exporter's identity labels, kept on samples so a target can be traced back
IDENTITY_LABELS = ("gpu", "UUID", "pod", "namespace", "container")


class SourceError(RuntimeError):
    """A source could not deliver samples this time (down, unreachable, garbage, driver error)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement of one target, in base units.

    ``target`` names a pod (``namespace/pod``) or a GPU (its UUID); ``ts`` is
    unix seconds. ``memory_bytes`` / ``utilization_ratio`` (0-1) are None when
    the source does not measure them. ``extra`` holds further readings
    (``memory_total_bytes``, ``power_watts``, ``sm_clock_hertz``, ...). ``gpu_model``:
    the GPU's model as the source names it (dcgm-exporter's ``modelName``, e.g.
    "NVIDIA H100 80GB HBM3"; "" where it does not say).
    """

    target: str
    ts: float
    memory_bytes: float | None = None
    utilization_ratio: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, float] = field(default_factory=dict)
    gpu_model: str = ""


@runtime_checkable
class Source(Protocol):
    """Anything with a ``name`` and ``poll()``; ``poll`` raises :class:`SourceError` on failure."""

    name: str

    def poll(self) -> list[Sample]: ...

    def close(self) -> None: ...


def target_name(labels: Mapping[str, str]) -> str | None:
    """A target's name from dcgm-exporter style labels: ``namespace/pod``, else the GPU UUID."""
    pod = labels.get("pod") or ""
    if pod:
        ns = labels.get("namespace") or ""
        return f"{ns}/{pod}" if ns else pod
    if labels.get("UUID"):
        return labels["UUID"]
    if labels.get("gpu") not in (None, ""):
        return f"gpu{labels['gpu']}"
    return None
