"""Replay of a bundled trace at a chosen speed, so the sidecar runs without a GPU.

``alibaba``: alibaba-genai-2026 pods (GPU duty cycle as utilisation, GPU memory).
``h200``: h200-profiles NVML samples, one target per run on the GPU.
The trace is read from ``$DPROBE_DATA_DIR``, ``./datasets`` or the source checkout; where none holds it (dprobe
installed from the package), alibaba's falls back to the few pods that ship in the package
(:func:`dprobe.data.registry.packaged_sample`). The source logs which copy it replays.
Each poll emits, for every target active at the current replay time, its
latest reading (as an exporter does between its own updates), stamped now;
a gap in the trace is a NaN reading, which the sidecar takes as missing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dprobe.core.options import at_least, option, zero_means
from dprobe.services.sources.base import Sample, target_name
from dprobe.services.sources.registry import SourceContext, register

log = logging.getLogger(__name__)
DATASET_DIRS = {"alibaba": "alibaba-genai-2026", "h200": "h200-profiles"}
DEFAULT_SPEED = {"alibaba": 60.0, "h200": 1.0}


@dataclass
class ReplayOptions:
    """The options of the ``replay`` source (``replay_*``; YAML ``replay: {dataset: ...}``)."""

    dataset: str = option("alibaba", "trace replayed: alibaba or h200", choices=tuple(DATASET_DIRS))
    path: str = option("", "directory laid out like the data set (default: the bundled copy, from "
                           "$DPROBE_DATA_DIR or ./datasets; else the sample in the package)")
    speed: float = option(0.0, "trace seconds per second (0 = the data set's default: 60 alibaba, 1 h200)",
                          check=zero_means("the data set's default"))
    loop: bool = option(True, "start the trace again at its end")
    max_targets: int = option(0, "replay only the first N targets (0 = all)", check=at_least(0))


def default_data_dir(dataset: str) -> Path:
    """Where the bundled trace ``dataset`` lives (:func:`dprobe.data.registry.find_data_dir`): a full copy, else
    the sample that ships in the package; FileNotFoundError, in one line, where there is neither."""
    return find_default(dataset)[0]


def find_default(dataset: str) -> tuple[Path, bool]:
    """:func:`default_data_dir` and whether it is the packaged sample."""
    from dprobe.data.registry import find_data_dir

    return find_data_dir(DATASET_DIRS[dataset], "the replay path (--replay-path)", sample=True)


@dataclass
class Trace:
    """Per-target arrays on one clock (seconds from the trace start)."""

    t: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    utilization: dict[str, np.ndarray]
    hold: float  # a reading stays current this long (trace seconds)
    span: float
    labels: dict[str, dict[str, str]]


def load_alibaba_trace(path: Path) -> Trace:
    from dprobe.data import load_alibaba

    ds = load_alibaba(path)
    f = ds.frame
    t0 = f["ds"].min()
    secs = (f["ds"] - t0).dt.total_seconds().to_numpy()
    t, mem, util, labels = {}, {}, {}, {}
    for uid, idx in f.groupby("unique_id", sort=True).indices.items():
        t[uid] = secs[idx]
        mem[uid] = f["gpu_memory_bytes"].to_numpy(dtype=float)[idx]
        util[uid] = f["gpu_duty_cycle_pct"].to_numpy(dtype=float)[idx] / 100.0
        labels[uid] = {"pod": str(uid), "namespace": ""}
    step = ds.freq.total_seconds()
    return Trace(t, mem, util, hold=2 * step, span=float(secs.max()) + step, labels=labels)


def load_h200_trace(path: Path) -> Trace:
    from dprobe.data import load_h200_profiles

    s = load_h200_profiles(path).samples.sort_values(["collection", "t"])
    offset, clock = 0.0, []
    for _, g in s.groupby("collection", sort=True):
        clock.append(g["t"].to_numpy() - g["t"].min() + offset)
        offset = clock[-1].max() + 1.0
    s = s.assign(clock=np.concatenate(clock)) if clock else s.assign(clock=[])
    s = s[s["label"] != "idle"]
    t, mem, util, labels = {}, {}, {}, {}
    for label, g in s.groupby("label", sort=True):
        t[label] = g["clock"].to_numpy()
        mem[label] = g["mem_used_bytes"].to_numpy(dtype=float)
        util[label] = g["gpu_util_pct"].to_numpy(dtype=float) / 100.0
        labels[label] = {"pod": str(label), "namespace": "h200"}
    return Trace(t, mem, util, hold=0.5, span=offset, labels=labels)


LOADERS: dict[str, Callable[[Path], Trace]] = {"alibaba": load_alibaba_trace, "h200": load_h200_trace}


class ReplaySource:
    """Replays a trace: ``speed`` trace seconds per wall second, looping at the end when ``loop``."""

    name = "replay"

    def __init__(self, dataset: str = "alibaba", path: str | Path | None = None, speed: float | None = None,
                 loop: bool = True, max_targets: int | None = None, clock: Callable[[], float] = time.time):
        if dataset not in LOADERS:
            raise ValueError(f"replay dataset must be one of {', '.join(LOADERS)}, got {dataset!r}")
        self.dataset = dataset
        sample = False
        if path:
            self.path = Path(path)
        else:
            self.path, sample = find_default(dataset)
        self.trace = LOADERS[dataset](self.path)
        if max_targets is not None:
            keep = sorted(self.trace.t)[:max_targets]
            for d in (self.trace.t, self.trace.memory, self.trace.utilization):
                for k in list(d):
                    if k not in keep:
                        del d[k]
        log.info("replay: %s from %s (%d targets%s)", DATASET_DIRS[dataset], self.path, len(self.trace.t),
                 "; the sample in the package: set DPROBE_DATA_DIR for the whole data set" if sample else "")
        self.speed = float(speed if speed is not None else DEFAULT_SPEED[dataset])
        if self.speed <= 0:
            raise ValueError(f"replay speed must be positive, got {self.speed}")
        self.loop = loop
        self.clock = clock
        self.started = clock()
        self.names = {k: target_name(self.trace.labels[k]) or str(k) for k in self.trace.t}

    def trace_time(self, now: float) -> float:
        t = (now - self.started) * self.speed
        return t % self.trace.span if self.loop and self.trace.span > 0 else t

    def poll(self) -> list[Sample]:
        now = self.clock()
        tt = self.trace_time(now)
        out = []
        for target, times in self.trace.t.items():
            i = int(np.searchsorted(times, tt, side="right")) - 1
            if i < 0 or tt - times[i] > self.trace.hold:
                continue
            out.append(Sample(  # as read: a gap (NaN) or an impossible value is the sidecar's to refuse and count
                target=self.names[target], ts=now, memory_bytes=float(self.trace.memory[target][i]),
                utilization_ratio=float(self.trace.utilization[target][i]), labels=self.trace.labels[target],
            ))
        return out

    def close(self) -> None:
        pass


    @classmethod
    def from_options(cls, options: ReplayOptions, context: SourceContext) -> ReplaySource:
        return cls(options.dataset, options.path or None, options.speed or None, loop=options.loop,
                   max_targets=options.max_targets or None)


register("replay", ReplaySource.from_options)
