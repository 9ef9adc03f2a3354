"""What a run of ``dprobe simulate sharing`` is set by (:class:`SharingSettings`, the shipped defaults) and the
names its options choose from: without numpy, so that ``dprobe simulate sharing --help`` builds its options from
here in a fraction of a second. :mod:`dprobe.sim.sharing.packing` runs them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dprobe.sharing.planner import PlanSettings

SHARING_POLICIES = ("one-per-gpu", "peak", "peak-headroom", "last-value", "dprobe", "oracle")
RULES = ("guarded-peak", "peak", "forecast")
GUARD_MODES = ("free", "always")


@dataclass(frozen=True)
class SharingSettings:
    """What a run of :func:`simulate_policies` is set by; the defaults are what ``dprobe simulate sharing``
    ships (chosen by :mod:`dprobe.sim.sharing.cv`, see docs/sharing.md).

    ``rule`` is how the ``dprobe`` and ``last-value`` policies size a pod: ``"guarded-peak"`` (its peak over
    the last ``history_hours``, raised to the ``guard_quantile`` of the forecast plus ``guard_margin`` where
    that is higher; with ``guard_mode="free"`` only as far as that costs no GPU beyond peak packing, and
    with ``guard_swap`` also by swapping pods between GPUs),
    ``"peak"`` (peak packing, no forecast) or ``"forecast"`` (the ``memory_quantile`` of the forecast plus
    ``memory_margin``, with room on each GPU for a burst to the ``burst_quantile`` or the peak)."""

    gpu_memory_bytes: int = 80 * 10**9  # each GPU's memory (80 GB)
    repack_steps: int = 30
    packing: str = "best-fit"
    history_hours: float = 2.0
    headroom: float = 0.1
    duty_quantile: float = 0.9
    rule: str = "guarded-peak"
    guard_quantile: float = 0.99
    guard_margin: float = 0.0
    guard_mode: str = "free"
    guard_swap: bool = False
    memory_quantile: float = 0.5
    burst_quantile: float = 0.99
    burst_overlap: float = 0.0
    burst_combine: str = "max"
    memory_margin: float = 0.0
    sticky: bool = True

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; choose from {', '.join(RULES)}")
        if self.guard_mode not in GUARD_MODES:
            raise ValueError(f"unknown guard_mode {self.guard_mode!r}; choose from {', '.join(GUARD_MODES)}")
        if not (math.isfinite(self.gpu_memory_bytes) and self.gpu_memory_bytes > 0):
            raise ValueError(f"gpu_memory_bytes must be a positive number of bytes, got {self.gpu_memory_bytes!r}")
        if self.repack_steps < 1:
            raise ValueError(f"repack_steps must be >= 1, got {self.repack_steps!r}")
        if not self.history_hours > 0:
            raise ValueError(f"history_hours must be > 0, got {self.history_hours!r}")
        for name in ("headroom", "guard_margin", "memory_margin"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("duty_quantile", "guard_quantile", "memory_quantile", "burst_quantile"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)!r}")
        self.plan_settings()  # packing, burst_overlap and burst_combine checked by the planner

    def plan_settings(self) -> PlanSettings:
        """The planner's settings of this run."""
        from dprobe.sharing.planner import PlanSettings  # numpy: not for dprobe simulate sharing --help

        return PlanSettings(policy=self.packing, burst_overlap=self.burst_overlap, burst_combine=self.burst_combine)

    def window(self, step_seconds: float) -> int:
        """``history_hours`` in steps of the trace."""
        return max(1, int(round(self.history_hours * 3600 / step_seconds)))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
