"""The jobs a simulation replays: a cluster job log as arrays, and the demand it implies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.data import DatasetError, detect_dataset, load_itp, load_philly, registry

JOB_LOADERS = {"philly-jobs": load_philly, "itp-elasticflow": load_itp}
DEFAULT_DATASET = "philly-jobs"
DERIVED_DATASET = "helios-earth-vc"  # per-minute VC counts a job log is derived from (dprobe.sim.helios_jobs)
DAY = 86400.0


@dataclass
class JobTable:
    """Jobs sorted by submission; ``vc`` indexes ``vc_names``. Times in seconds, sizes in GPUs."""

    job_ids: np.ndarray  # (N,) str
    vc: np.ndarray  # (N,) int
    submit: np.ndarray  # (N,) float
    duration: np.ndarray  # (N,) float
    gpus: np.ndarray  # (N,) int
    vc_names: list[str]

    def __post_init__(self) -> None:
        n = len(self.submit)
        if not all(len(a) == n for a in (self.job_ids, self.vc, self.duration, self.gpus)):
            raise ValueError("job arrays must all have the same length")
        if n and np.any(np.diff(self.submit) < 0):
            raise ValueError("jobs must be sorted by submit time")
        if np.any(self.duration < 0) or np.any(self.gpus < 1):
            raise ValueError("job durations must be >= 0 and GPU counts >= 1")

    def __len__(self) -> int:
        return len(self.submit)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> JobTable:
        """From a frame with ``job_id, cluster, submit_time, duration, num_gpus`` (the loaders' layout)."""
        frame = frame.sort_values("submit_time", kind="stable", ignore_index=True)
        codes, names = pd.factorize(frame["cluster"].astype(str), sort=True)
        return cls(job_ids=frame["job_id"].astype(str).to_numpy(), vc=codes.astype(np.int64),
                   submit=frame["submit_time"].to_numpy(dtype=np.float64),
                   duration=frame["duration"].to_numpy(dtype=np.float64),
                   gpus=frame["num_gpus"].to_numpy(dtype=np.int64), vc_names=[str(n) for n in names])

    @classmethod
    def from_lists(cls, jobs: list[tuple[str, float, float, int]]) -> JobTable:
        """From ``(vc, submit, duration, gpus)`` tuples (handy for small examples)."""
        frame = pd.DataFrame(jobs, columns=["cluster", "submit_time", "duration", "num_gpus"])
        frame.insert(0, "job_id", [f"job-{i}" for i in range(len(frame))])
        return cls.from_frame(frame)

    def select(self, vcs: list[str] | None = None, days: float | None = None, start_day: float = 0.0) -> JobTable:
        """The jobs of ``vcs`` (default all) submitted in the ``days`` days (default: all) from
        ``start_day`` days after the log's first submission; VCs left without jobs are dropped."""
        keep = np.ones(len(self), dtype=bool)
        names = list(self.vc_names)
        if vcs:
            unknown = [v for v in vcs if v not in names]
            if unknown:
                raise ValueError(f"unknown virtual cluster(s) {', '.join(unknown)}; the log has "
                                 f"{', '.join(names)}")
            names = [v for v in names if v in vcs]
            keep &= np.isin(self.vc, [self.vc_names.index(v) for v in names])
        if days is not None and not days > 0:
            raise ValueError(f"--days must be positive, got {days:g}")
        if not start_day >= 0:
            raise ValueError(f"--start-day must be >= 0, got {start_day:g}")
        first = (self.submit.min() if len(self) else 0.0) + start_day * DAY
        keep &= self.submit >= first
        if days is not None:
            keep &= self.submit < first + days * DAY
        present = set(self.vc[keep].tolist())
        names = [v for v in names if self.vc_names.index(v) in present]  # VCs without jobs left out
        remap = np.full(len(self.vc_names), -1, dtype=np.int64)
        remap[[self.vc_names.index(v) for v in names]] = np.arange(len(names))
        return JobTable(self.job_ids[keep], remap[self.vc[keep]], self.submit[keep], self.duration[keep],
                        self.gpus[keep], names)


def bundled_dir(folder: str = DEFAULT_DATASET) -> Path:
    """Where a bundled job log lives (see :func:`dprobe.data.registry.bundled_dir`)."""
    return registry.bundled_dir(folder, "pass --data")


def load_jobs(directory: str | Path, derive: bool = False) -> tuple[str, JobTable]:
    """The data set's name and its jobs, for a directory laid out like philly-jobs or itp-elasticflow, or
    with ``derive`` like helios-earth-vc (a log derived from its per-minute counts, :mod:`dprobe.sim.helios_jobs`)."""
    name = detect_dataset(directory)
    if name == DERIVED_DATASET and derive:  # no job log: one rebuilt from the per-minute counts (assumptions there)
        from dprobe.sim.helios_jobs import derive_jobs

        return f"{name} (derived jobs)", JobTable.from_frame(derive_jobs(directory)[0])
    if name not in JOB_LOADERS:
        hint = "; dprobe simulate fixed derives a job log from it" if name == DERIVED_DATASET else ""
        raise DatasetError(f"{directory}: holds {name}, not a job log (expected the layout of "
                           f"{' or '.join(JOB_LOADERS)}){hint}")
    return name, JobTable.from_frame(JOB_LOADERS[name](Path(directory)))


def load_selected(directory: str | None, vcs: list[str] | None = None, days: float | None = None,
                  start_day: float = 0.0, derive: bool = False) -> tuple[str, str, JobTable]:
    """The data set's name, the directory (default: the bundled Philly log) and its jobs selected as
    :meth:`JobTable.select` (``derive``: as :func:`load_jobs`); a ValueError when the selection holds none."""
    directory = directory or str(bundled_dir())
    dataset, jobs = load_jobs(directory, derive)
    jobs = jobs.select(vcs, days, start_day)
    if not len(jobs):
        raise ValueError(f"{directory}: no jobs to simulate with these --vc / --days")
    return dataset, directory, jobs


def unconstrained_demand(jobs: JobTable, n_vcs: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per VC, the GPUs its jobs would hold if each started at submission: change times and the
    step function's value from each time on (``times[k] <= t < times[k+1]``)."""
    times, values = [], []
    for v in range(n_vcs):
        mine = jobs.vc == v
        t = np.concatenate([jobs.submit[mine], jobs.submit[mine] + jobs.duration[mine]])
        d = np.concatenate([jobs.gpus[mine], -jobs.gpus[mine]]).astype(np.int64)
        order = np.lexsort((d, t))  # at one instant, releases before arrivals: no phantom peak
        t, d = t[order], d[order]
        level = np.cumsum(d)
        last = np.r_[t[1:] != t[:-1], True] if len(t) else np.zeros(0, dtype=bool)  # value after each instant
        times.append(t[last])
        values.append(level[last])
    return times, values


def sample_step_function(times: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The value of a step function (as :func:`unconstrained_demand` gives) at the times ``at``."""
    idx = np.searchsorted(times, at, side="right") - 1
    return np.where(idx >= 0, values[np.clip(idx, 0, None)] if len(values) else 0, 0)


def peak_demand(jobs: JobTable) -> np.ndarray:
    """Per VC, the most GPUs its jobs would hold at once if each started at submission."""
    _, values = unconstrained_demand(jobs, len(jobs.vc_names))
    return np.array([int(v.max()) if len(v) else 0 for v in values], dtype=np.int64)
