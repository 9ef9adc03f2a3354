"""The metric-source interface: each source yields timestamped samples per target."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

# dcgm-exporter's identity labels, kept on samples so a target can be traced back
IDENTITY_LABELS = ("gpu", "UUID", "pod", "namespace", "container")
# a ratio up to 1 + this is rounding (kept as 1.0); above it, an impossible reading
RATIO_TOLERANCE = 0.01
# why a reading or a sample is refused (label ``reason`` of dprobe_rejected_samples_total):
# nan: the source gave NaN, the reading is missing; infinite, negative, ratio_above_one: impossible readings;
# future_timestamp: stamped further ahead of the sidecar's clock than allowed; bad_timestamp: not a finite time
REJECT_REASONS = ("nan", "infinite", "negative", "ratio_above_one", "future_timestamp", "bad_timestamp")


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
    "NVIDIA H100 80GB HBM3"; "" where it does not say). A source may pass NaN, infinite or
    out-of-range readings on: :func:`screen_samples` makes them missing (None) and counts them, never 0.
    ``rejected``: the reasons (:data:`REJECT_REASONS`) of readings the source itself refused while
    combining several into one (a pod on several GPUs), for the count.
    """

    target: str
    ts: float
    memory_bytes: float | None = None
    utilization_ratio: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, float] = field(default_factory=dict)
    gpu_model: str = ""
    rejected: tuple[str, ...] = ()


def check_reading(value: float | None, ratio: bool = False) -> tuple[float | None, str]:
    """``(value, "")`` for a possible reading (bytes, or a ratio with ``ratio``), ``(None, "")`` for None,
    ``(None, reason)`` for NaN (missing), an infinite or negative value, or a ratio above 1 +
    :data:`RATIO_TOLERANCE` (one within the tolerance is read as 1.0): refused, never clipped."""
    if value is None:
        return None, ""
    value = float(value)
    if math.isnan(value):
        return None, "nan"
    if math.isinf(value):
        return None, "infinite"
    if value < 0:
        return None, "negative"
    if ratio and value > 1.0:
        return (1.0, "") if value <= 1.0 + RATIO_TOLERANCE else (None, "ratio_above_one")
    return value, ""


def screen_samples(samples: Iterable[Sample], now: float, max_skew: float) -> tuple[list[Sample], Counter[str]]:
    """The samples fit to store, and the count of what was refused, by reason (:data:`REJECT_REASONS`).

    A sample stamped more than ``max_skew`` seconds after ``now``, or not at a finite time, is refused
    whole; a NaN, infinite, negative or above-one (utilisation) reading becomes None, the rest of its
    sample is kept; a sample left without any reading is left out (it says nothing of its target, so
    it must not make it look fresh).
    """
    kept: list[Sample] = []
    refused: Counter[str] = Counter()
    for s in samples:
        refused.update(r for r in s.rejected if r in REJECT_REASONS)
        if not math.isfinite(s.ts):
            refused["bad_timestamp"] += 1
            continue
        if s.ts > now + max_skew:
            refused["future_timestamp"] += 1
            continue
        memory, why_memory = check_reading(s.memory_bytes)
        utilization, why_utilization = check_reading(s.utilization_ratio, ratio=True)
        refused.update(r for r in (why_memory, why_utilization) if r)
        if memory is None and utilization is None:
            continue
        if (memory, utilization) != (s.memory_bytes, s.utilization_ratio) or s.rejected:
            s = replace(s, memory_bytes=memory, utilization_ratio=utilization, rejected=())
        kept.append(s)
    return kept, refused


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
