"""A job log derived from ``helios-earth-vc``'s per-minute counts, for ``dprobe simulate``.

The Helios VC files give, every minute and per VC, the running and pending GPU jobs and their GPUs, split
into jobs of fewer than 8 GPUs (``*_less_8``) and of 8 or more (``*_noless_8``); not the jobs themselves.
A log is rebuilt per VC and size class under these assumptions:

- **Arrivals** are increases in the class's job count (running + pending) from one minute to the next, at
  that minute; **departures** are decreases. Only net changes are seen: a job that arrives and one that
  ends in the same minute cancel out, and a job shorter than a minute is not seen at all.
- **Who leaves**: the oldest jobs present (first in, first out).
- **Sizes**: the class's GPUs (running + pending) minus those of the jobs still present, split evenly
  over the arrivals, each kept within its class (1-7 GPUs, or at least 8).
- **Duration** is the time a job was present, queueing in the trace included: an overestimate of its
  run time where the trace's VC queued.
- Jobs present at the first minute arrive then; jobs still present after the last minute end a minute
  later (both counted in :class:`DeriveStats`).

How far the rebuilt GPU counts drift from the trace's is measured (``gpu_mismatch``).
"""

from __future__ import annotations

import gzip
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.data import DatasetError

MINUTE = 60.0
CLASSES = (("less_8", 1, 7), ("noless_8", 8, None))  # (column suffix, fewest GPUs, most GPUs)
COLUMNS = ("time", *(f"{state}_{what}_num_{suffix}" for suffix, _, _ in CLASSES
                     for state in ("running", "pending") for what in ("job", "gpu")))


@dataclass
class DeriveStats:
    """How the log was rebuilt: jobs, those cut off at either end, and the GPU counts' drift."""

    jobs: int = 0
    present_at_start: int = 0
    present_at_end: int = 0
    gpu_minutes_trace: float = 0.0
    gpu_minutes_off: float = 0.0  # sum over minutes of |rebuilt GPUs - trace GPUs|
    per_vc: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_mismatch(self) -> float:
        """Rebuilt GPU-minutes off the trace's, as a share of the trace's."""
        return self.gpu_minutes_off / self.gpu_minutes_trace if self.gpu_minutes_trace else 0.0


def _read(path: Path) -> pd.DataFrame:
    with gzip.open(path, "rt") as f:
        frame = pd.read_csv(f)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DatasetError(f"{path}: missing column {missing[0]} (needed to derive jobs)")
    counts = frame[list(COLUMNS[1:])]
    bad = counts.isna().any(axis=1) | (counts < 0).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        col = next(c for c in COLUMNS[1:] if pd.isna(counts[c].iloc[row]) or counts[c].iloc[row] < 0)
        raise DatasetError(f"{path}: column {col}, row {row + 2}: a count must be a number >= 0")
    times = pd.to_datetime(frame["time"], errors="coerce")
    if times.isna().any():
        row = int(np.flatnonzero(times.isna().to_numpy())[0])
        raise DatasetError(f"{path}: column time, row {row + 2}: not a time")
    frame["time"] = times.astype("int64") / 1e9
    return frame.sort_values("time", kind="stable")


def derive_class(t: np.ndarray, jobs: np.ndarray, gpus: np.ndarray, lo: int, hi: int | None,
                 stats: DeriveStats) -> list[tuple[float, float, int]]:
    """One VC's jobs of one size class ``(submit, duration, gpus)`` from its per-minute job and GPU counts."""
    live: deque[list] = deque()  # [submit, gpus], oldest first
    held = 0
    out: list[tuple[float, float, int]] = []
    for k in range(len(t)):
        n, g = int(jobs[k]), int(gpus[k])
        while len(live) > n:
            submit, size = live.popleft()
            held -= size
            out.append((submit, t[k] - submit, size))
        new = n - len(live)
        if new > 0:
            each, extra = divmod(max(g - held, 0), new)
            for i in range(new):
                size = max(lo, each + (1 if i < extra else 0))
                size = min(size, hi) if hi is not None else size
                live.append([t[k], size])
                held += size
            if k == 0:
                stats.present_at_start += new
        stats.gpu_minutes_trace += g
        stats.gpu_minutes_off += abs(held - g)
    end = t[-1] + MINUTE if len(t) else 0.0
    stats.present_at_end += len(live)
    out += [(submit, end - submit, size) for submit, size in live]
    return out


def derive_jobs(directory: str | Path) -> tuple[pd.DataFrame, DeriveStats]:
    """The derived log of every ``vc*.csv.gz`` in ``directory``: a frame in the job loaders' layout
    (``job_id, cluster, submit_time, duration, num_gpus``) and how it was rebuilt."""
    files = sorted(Path(directory).glob("vc*.csv.gz"))
    if not files:
        raise DatasetError(f"{directory}: no vc*.csv.gz files to derive jobs from")
    stats = DeriveStats()
    rows: list[tuple[str, float, float, int]] = []
    for path in files:
        frame = _read(path)
        vc = path.name.removesuffix(".csv.gz")
        t = frame["time"].to_numpy(dtype=np.float64)
        before = len(rows)
        for suffix, lo, hi in CLASSES:
            n = frame[f"running_job_num_{suffix}"].to_numpy() + frame[f"pending_job_num_{suffix}"].to_numpy()
            g = frame[f"running_gpu_num_{suffix}"].to_numpy() + frame[f"pending_gpu_num_{suffix}"].to_numpy()
            rows += [(vc, s, d, size) for s, d, size in derive_class(t, n, g, lo, hi, stats)]
        stats.per_vc[vc] = len(rows) - before
    stats.jobs = len(rows)
    out = pd.DataFrame(rows, columns=["cluster", "submit_time", "duration", "num_gpus"])
    out.insert(0, "job_id", [f"{c}-{i}" for i, c in enumerate(out["cluster"])])
    return out, stats
