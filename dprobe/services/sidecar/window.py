"""Bounded per-target windows: samples binned onto a regular grid, one row of a matrix per target."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import numpy as np
from prometheus_client.metrics_core import CounterMetricFamily

from dprobe.core.names import SIDECAR_METRICS
from dprobe.services.sidecar.memory import DEFAULT_MAX_TARGETS, WINDOW_BYTES_PER_STEP
from dprobe.services.sidecar.state import Latest
from dprobe.services.sources.base import Sample

NO_EXTRA: Mapping[str, float] = MappingProxyType({})
SHED_REASONS = ("least_recent", "full")  # why a target was shed (dprobe_targets_shed_total{reason})
PREALLOCATE_BYTES = 2**30  # windows of max_targets made at once up to this size (memory only as rows are used)


def usable_extra(extra: Mapping[str, float]) -> Mapping[str, float]:
    """A sample's further readings that can be exported: finite and not negative (the rest is left out)."""
    if not extra:
        return NO_EXTRA
    return {k: float(v) for k, v in extra.items() if math.isfinite(v) and v >= 0}


class WindowStore:
    """Mean of the samples in each ``step``-second bin, the last ``length`` bins per target.

    Storage is a fixed ring of bins per target (rows of ``(capacity, length)``
    arrays, rows reused after a target is dropped), so memory is bounded by
    ``max_targets * length``. The arrays are made for ``max_targets`` at once where they take at most
    :data:`PREALLOCATE_BYTES` (left uninitialised, a row takes memory once a target uses it: no copies as
    targets come), else they double as targets come. With ``max_targets`` tracked, a new target takes the place of the least
    recently sampled one when that one has gone a step without a sample (it is shed); otherwise the new
    target's sample is not taken in. ``shed_total`` counts both, by reason (:data:`SHED_REASONS`). Thread-safe.
    """

    # made by _alloc, rows of (capacity, ...): per target its bins' numbers (-1: none yet), per metric the
    # bins' sums and sample counts, and its newest bin's number
    _bins: np.ndarray  # (capacity, length) int64
    _sums: np.ndarray  # (n_metrics, capacity, length) float
    _counts: np.ndarray  # (n_metrics, capacity, length) int32
    _last: np.ndarray  # (capacity,) int64

    def __init__(self, step: float, length: int, max_targets: int = DEFAULT_MAX_TARGETS,
                 initial_capacity: int = 64):
        if step <= 0 or length < 2:
            raise ValueError(f"window needs step > 0 and length >= 2, got step={step}, length={length}")
        if max_targets < 1:
            raise ValueError(f"max_targets must be at least 1, got {max_targets}")
        self.step, self.length, self.max_targets = float(step), int(length), int(max_targets)
        self._lock = threading.Lock()
        self._rows: OrderedDict[str, int] = OrderedDict()  # least recently sampled first
        self._free: list[int] = []
        self.latest: dict[str, Latest] = {}
        self.shed_total = dict.fromkeys(SHED_REASONS, 0)  # by reason: fixed keys, read by scrapes
        self._shed: list[str] = []  # tracked targets shed since take_shed()
        whole = self.max_targets * WINDOW_BYTES_PER_STEP * self.length <= PREALLOCATE_BYTES
        self._alloc(self.max_targets if whole else min(initial_capacity, self.max_targets))

    def _alloc(self, capacity: int) -> None:
        """Arrays of ``capacity`` rows, those in use copied over; a row is initialised when a target takes it
        (:meth:`_row`), and a bin when a sample first falls in it."""
        old = getattr(self, "_bins", None)
        n_old = 0 if old is None else old.shape[0]
        bins = np.empty((capacity, self.length), dtype=np.int64)
        sums = np.empty((len(SIDECAR_METRICS), capacity, self.length))
        counts = np.empty((len(SIDECAR_METRICS), capacity, self.length), dtype=np.int32)
        last = np.empty(capacity, dtype=np.int64)
        if old is not None:
            bins[:n_old], sums[:, :n_old], counts[:, :n_old], last[:n_old] = (
                self._bins, self._sums, self._counts, self._last)
        self._bins, self._sums, self._counts, self._last = bins, sums, counts, last
        self._free.extend(range(capacity - 1, n_old - 1, -1))

    def _row(self, target: str, ts: float) -> int | None:
        row = self._rows.get(target)
        if row is not None:
            self._rows.move_to_end(target)
            return row
        if len(self._rows) >= self.max_targets:
            oldest = next(iter(self._rows))
            if self.latest[oldest].ts > ts - self.step:  # sampled within a step of the newcomer: it stays
                self.shed_total["full"] += 1
                return None
            self.shed_total["least_recent"] += 1
            self._forget(oldest)
            if len(self._shed) < self.max_targets:  # read each forecast cycle; bounded should none read it
                self._shed.append(oldest)
        if not self._free:
            self._alloc(min(self.max_targets, 2 * self._bins.shape[0]))
        row = self._free.pop()
        self._bins[row] = -1
        self._last[row] = -1
        self._rows[target] = row
        return row

    def _forget(self, target: str) -> None:
        del self.latest[target]
        self._free.append(self._rows.pop(target))

    def add(self, samples: list[Sample], source: str = "") -> None:
        """Bin ``samples`` (any order; older than the window or non-finite values are ignored).

        A sample without a finite reading, or not at a finite time, is ignored whole: a target's latest
        sample, hence its freshness, is its newest one with a finite reading.
        """
        with self._lock:
            # the targets tracked first: a new target of this poll never sheds one the same poll samples
            for s in sorted(samples, key=lambda s: s.target not in self._rows):
                readings = (s.memory_bytes, s.utilization_ratio)
                if not math.isfinite(s.ts) or not any(v is not None and math.isfinite(v) for v in readings):
                    continue
                row = self._row(s.target, s.ts)
                if row is None:
                    continue
                b = math.floor(s.ts / self.step)
                if b <= self._last[row] - self.length:
                    continue
                slot = b % self.length
                if self._bins[row, slot] != b:
                    self._bins[row, slot] = b
                    self._sums[:, row, slot] = 0.0
                    self._counts[:, row, slot] = 0
                for k, v in enumerate(readings):
                    if v is not None and math.isfinite(v):
                        self._sums[k, row, slot] += v
                        self._counts[k, row, slot] += 1
                if b > self._last[row]:
                    self._last[row] = b
                prev = self.latest.get(s.target)
                if prev is None or s.ts >= prev.ts:
                    memory, utilization = (v if v is not None and math.isfinite(v) else None for v in readings)
                    self.latest[s.target] = Latest(s.ts, memory, utilization, source, s.labels, s.gpu_model,
                                                   usable_extra(s.extra))

    def drop_older_than(self, cutoff: float) -> list[str]:
        """Forget targets whose latest sample is older than ``cutoff``; returns their names."""
        with self._lock:
            gone = [t for t, lat in self.latest.items() if lat.ts < cutoff]
            for t in gone:
                self._forget(t)
            return gone

    def take_shed(self) -> list[str]:
        """The tracked targets shed since the last call (to forget what else is kept of them)."""
        with self._lock:
            shed, self._shed = self._shed, []
            return shed

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily("dprobe_targets_shed", "Targets shed because max_targets were tracked, by reason: "
                                  "least_recent (the least recently sampled target, forgotten for a new one), full "
                                  "(a new target's sample not taken in: every tracked target was sampled within a "
                                  "step).", labels=["reason"])
        for reason, count in self.shed_total.items():
            fam.add_metric([reason], count)
        yield fam

    def targets(self) -> list[str]:
        with self._lock:
            return list(self._rows)

    def snapshot_latest(self) -> dict[str, Latest]:
        with self._lock:
            return dict(self.latest)

    def windows(self, targets: list[str]) -> dict[str, np.ndarray]:
        """``{metric: (len(targets), length)}`` oldest first, NaN where a bin had no sample (all NaN for a target
        not tracked: shed or dropped).

        Each target's window ends at its own latest bin.
        """
        with self._lock:
            rows = np.array([self._rows.get(t, -1) for t in targets], dtype=np.int64)
            tracked = rows >= 0
            rows[~tracked] = 0
            ids = self._last[rows, None] - np.arange(self.length - 1, -1, -1)[None, :]
            slots = ids % self.length
            valid = (np.take_along_axis(self._bins[rows], slots, axis=1) == ids) & tracked[:, None]
            out = {}
            for k, metric in enumerate(SIDECAR_METRICS):
                sums = np.take_along_axis(self._sums[k, rows], slots, axis=1)
                counts = np.take_along_axis(self._counts[k, rows], slots, axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[metric] = np.where(valid & (counts > 0), sums / counts, np.nan)
            return out
