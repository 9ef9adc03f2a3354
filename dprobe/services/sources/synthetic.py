"""A deterministic synthetic source (benchmarks, tests, demos): smooth periodic load per target."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dprobe.core.options import at_least, option
from dprobe.services.sources.base import Sample
from dprobe.services.sources.registry import SourceContext, register

GIB = 1024**3


@dataclass
class SyntheticOptions:
    """The options of the ``synthetic`` source (``synthetic_*``)."""

    targets: int = option(64, "targets of the synthetic source", check=at_least(0))  # 1 where it is the source


class SyntheticSource:
    """``n_targets`` pods ``synthetic/pod-N`` with periodic memory (1-40 GiB) and utilisation."""

    name = "synthetic"

    def __init__(self, n_targets: int = 64, period: float = 300.0, clock: Callable[[], float] = time.time):
        self.n_targets, self.period, self.clock = n_targets, period, clock

    def poll(self) -> list[Sample]:
        now = self.clock()
        out = []
        for i in range(self.n_targets):
            phase = 2 * math.pi * (now / self.period + i / max(1, self.n_targets))
            wobble = 0.05 * math.sin(now * 1.7 + i)  # deterministic jitter
            util = min(1.0, max(0.0, 0.5 + 0.4 * math.sin(phase) + wobble))
            mem = GIB * (1 + (i % 40)) * (0.8 + 0.2 * math.sin(phase))
            out.append(Sample(target=f"synthetic/pod-{i}", ts=now, memory_bytes=mem, utilization_ratio=util,
                              labels={"namespace": "synthetic", "pod": f"pod-{i}"}))
        return out

    def close(self) -> None:
        pass


    @classmethod
    def from_options(cls, options: SyntheticOptions, context: SourceContext) -> SyntheticSource:
        return cls(options.targets)


register("synthetic", SyntheticSource.from_options)
