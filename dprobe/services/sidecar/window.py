"""Bounded per-target windows: samples binned onto a regular grid, one row of a matrix per target."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from dprobe.core.names import SIDECAR_METRICS
from dprobe.services.sidecar.state import Latest
from dprobe.services.sources.base import Sample

NO_EXTRA: Mapping[str, float] = MappingProxyType({})


def usable_extra(extra: Mapping[str, float]) -> Mapping[str, float]:
    """A sample's further readings that can be exported: finite and not negative (the rest is left out)."""
    if not extra:
        return NO_EXTRA
    return {k: float(v) for k, v in extra.items() if math.isfinite(v) and v >= 0}


class WindowStore:
    """Mean of the samples in each ``step``-second bin, the last ``length`` bins per target.

    Storage is a fixed ring of bins per target (rows of ``(capacity, length)``
    arrays, rows reused after a target is dropped), so memory is bounded by
    ``max_targets * length``. Thread-safe.
    """

    def __init__(self, step: float, length: int, max_targets: int = 5000, initial_capacity: int = 64):
        if step <= 0 or length < 2:
            raise ValueError(f"window needs step > 0 and length >= 2, got step={step}, length={length}")
        self.step, self.length, self.max_targets = float(step), int(length), int(max_targets)
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._free: list[int] = []
        self.latest: dict[str, Latest] = {}
        self.rejected_targets = 0
        self._alloc(min(initial_capacity, self.max_targets))

    def _alloc(self, capacity: int) -> None:
        old = getattr(self, "_bins", None)
        n_old = 0 if old is None else old.shape[0]
        bins = np.full((capacity, self.length), -1, dtype=np.int64)
        sums = np.zeros((len(SIDECAR_METRICS), capacity, self.length))
        counts = np.zeros((len(SIDECAR_METRICS), capacity, self.length), dtype=np.int32)
        last = np.full(capacity, -1, dtype=np.int64)
        if old is not None:
            bins[:n_old], sums[:, :n_old], counts[:, :n_old], last[:n_old] = (
                self._bins, self._sums, self._counts, self._last)
        self._bins, self._sums, self._counts, self._last = bins, sums, counts, last
        self._free.extend(range(capacity - 1, n_old - 1, -1))

    def _row(self, target: str) -> int | None:
        row = self._rows.get(target)
        if row is not None:
            return row
        if len(self._rows) >= self.max_targets:
            self.rejected_targets += 1
            return None
        if not self._free:
            self._alloc(min(self.max_targets, 2 * self._bins.shape[0]))
        row = self._free.pop()
        self._bins[row] = -1
        self._last[row] = -1
        self._rows[target] = row
        return row

    def add(self, samples: list[Sample], source: str = "") -> None:
        """Bin ``samples`` (any order; older than the window or non-finite values are ignored).

        A sample without a finite reading, or not at a finite time, is ignored whole: a target's latest
        sample, hence its freshness, is its newest one with a finite reading.
        """
        with self._lock:
            for s in samples:
                readings = (s.memory_bytes, s.utilization_ratio)
                if not math.isfinite(s.ts) or not any(v is not None and math.isfinite(v) for v in readings):
                    continue
                row = self._row(s.target)
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
                del self.latest[t]
                self._free.append(self._rows.pop(t))
            return gone

    def targets(self) -> list[str]:
        with self._lock:
            return list(self._rows)

    def snapshot_latest(self) -> dict[str, Latest]:
        with self._lock:
            return dict(self.latest)

    def windows(self, targets: list[str]) -> dict[str, np.ndarray]:
        """``{metric: (len(targets), length)}`` oldest first, NaN where a bin had no sample.

        Each target's window ends at its own latest bin.
        """
        with self._lock:
            rows = np.array([self._rows[t] for t in targets], dtype=np.int64)
            ids = self._last[rows, None] - np.arange(self.length - 1, -1, -1)[None, :]
            slots = ids % self.length
            valid = np.take_along_axis(self._bins[rows], slots, axis=1) == ids
            out = {}
            for k, metric in enumerate(SIDECAR_METRICS):
                sums = np.take_along_axis(self._sums[k, rows], slots, axis=1)
                counts = np.take_along_axis(self._counts[k, rows], slots, axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[metric] = np.where(valid & (counts > 0), sums / counts, np.nan)
            return out
