"""Cluster job logs for the simulator: Microsoft Philly (Pollux's copy) and ITP (ElasticFlow)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dprobe.data.common import DURATION, SECONDS, DatasetError, Range, check_range, find_file, read_csv

JOB_COLUMNS = ["job_id", "cluster", "submit_time", "duration", "num_gpus"]
# the most GPUs a job may ask for: a million, more than any cluster has (a bigger count is a wrong value)
MAX_JOB_GPUS = 1_000_000


def _require(path: Path, values: pd.Series, column: str) -> pd.Series:
    """The column, or a clear error naming the file, column and row where a value is missing."""
    if values.isna().any():
        row = int(values.isna().to_numpy().argmax())
        raise DatasetError(f"{path}: column {column!r} has no value at row {row + 2}")
    return values


def _gpu_counts(path: Path, values: pd.Series, column: str) -> pd.Series:
    """GPU counts as int: present, whole, at least 1 and at most ``MAX_JOB_GPUS``, else an error naming file,
    column and row."""
    values = _require(path, values, column)
    check_range(path, column, values, Range(1, MAX_JOB_GPUS, whole=True, what="a whole number of GPUs from 1 to "
                                            f"{MAX_JOB_GPUS:,} (more than any cluster has)"))
    return values.astype(int)


def load_philly(directory: str | Path) -> pd.DataFrame:
    """Jobs of ``philly.csv.gz``: ``submit_time`` in seconds since the first submission, ``cluster`` = VC."""
    path = find_file(Path(directory), "philly")
    df = read_csv(path, ["timestamp", "duration", "num_gpus", "cluster"], numeric=["duration", "num_gpus"],
                  ranges={"duration": DURATION})
    ts = pd.to_datetime(df["timestamp"], errors="coerce")
    if ts.isna().any():
        row = int(ts.isna().to_numpy().argmax())
        raise DatasetError(f"{path}: column 'timestamp' has an unreadable value at row {row + 2}")
    out = pd.DataFrame({
        "job_id": [f"philly-{i}" for i in range(len(df))],
        "cluster": df["cluster"].astype(str),
        "submit_time": (ts - ts.min()).dt.total_seconds(),
        "duration": _require(path, df["duration"], "duration"),
        "num_gpus": _gpu_counts(path, df["num_gpus"], "num_gpus"),
    })
    return out.sort_values("submit_time", ignore_index=True)


def load_itp(directory: str | Path) -> pd.DataFrame:
    """Jobs of every ``cluster*.csv.gz`` of an ITP directory; ``cluster`` is the file's name."""
    directory = Path(directory)
    files = sorted(set(directory.glob("cluster*.csv.gz")) | set(directory.glob("cluster*.csv")))
    if not files:
        raise DatasetError(f"{directory}: no cluster*.csv.gz files found")
    parts = []
    for path in files:
        df = read_csv(path, ["job_id", "submission_time", "duration", "num_gpu"],
                      numeric=["submission_time", "duration", "num_gpu"],
                      ranges={"submission_time": SECONDS, "duration": DURATION})
        parts.append(pd.DataFrame({
            "job_id": df["job_id"].astype(str),
            "cluster": path.name.split(".")[0],
            "submit_time": _require(path, df["submission_time"], "submission_time").astype(float),
            "duration": _require(path, df["duration"], "duration").astype(float),
            "num_gpus": _gpu_counts(path, df["num_gpu"], "num_gpu"),
        }))
    return pd.concat(parts, ignore_index=True).sort_values("submit_time", ignore_index=True)
