"""SenseTime Helios (Earth cluster): per-VC GPU demand on a 5-minute grid."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dprobe.data.common import NON_NEGATIVE, DatasetError, SeriesDataset, read_csv, to_regular_grid

NAME = "helios-earth-vc"
QUOTA_FILE = "Earth_gpu_number.csv"
FREQ = pd.Timedelta(minutes=5)
LEAD_STEPS = (6, 12, 24)  # 30, 60 and 120 minutes
SEASON_LENGTH = 288  # one day of 5-minute steps
VC_COLUMNS = ["time", "running_gpu_num", "pending_gpu_num", "running_job_num", "pending_job_num"]


def vc_files(directory: Path) -> list[Path]:
    """The per-VC files (``vc*.csv.gz`` or ``vc*.csv``) of a Helios-like directory."""
    files = sorted(set(directory.glob("vc*.csv.gz")) | set(directory.glob("vc*.csv")))
    return files


def quota_file(directory: Path) -> Path | None:
    """The VCs' daily quota file: ``Earth_gpu_number.csv``, else the one ``<Cluster>_gpu_number.csv`` of
    another Helios cluster's directory (None without one; DatasetError if there are several)."""
    if (directory / QUOTA_FILE).is_file():
        return directory / QUOTA_FILE
    found = sorted(directory.glob("*_gpu_number.csv"))
    if len(found) > 1:
        raise DatasetError(f"{directory}: several quota files ({', '.join(p.name for p in found)}); keep the one "
                           "of the cluster whose VCs are here")
    return found[0] if found else None


def load_helios(directory: str | Path) -> SeriesDataset:
    """Load a directory laid out like ``datasets/helios-earth-vc``.

    Target: ``gpu_demand`` = ``running_gpu_num + pending_gpu_num`` (GPUs), the
    per-minute rows averaged onto a 5-minute grid. Covariates: running and
    pending job counts and ``quota_gpus`` (from ``Earth_gpu_number.csv``, or another
    cluster's ``<Cluster>_gpu_number.csv``, when present, by day; NaN where the VC
    has no quota column). Negative or infinite counts and quotas are a :class:`DatasetError`
    naming the file, the column and the row.
    """
    directory = Path(directory)
    files = vc_files(directory)
    if not files:
        raise DatasetError(f"{directory}: no per-VC files (vc*.csv.gz) found")
    parts = []
    for path in files:
        vc = path.name.split(".")[0]
        df = read_csv(path, VC_COLUMNS, numeric=VC_COLUMNS[1:], ranges=dict.fromkeys(VC_COLUMNS[1:], NON_NEGATIVE))
        ds = pd.to_datetime(df["time"], errors="coerce")
        if ds.isna().any():
            row = int(ds.isna().to_numpy().argmax())
            raise DatasetError(f"{path}: column 'time' has an unreadable timestamp at row {row + 2}: "
                               f"{df['time'].iloc[row]!r}")
        parts.append(pd.DataFrame({
            "unique_id": vc,
            "ds": ds,
            "gpu_demand": df["running_gpu_num"] + df["pending_gpu_num"],
            "running_jobs": df["running_job_num"],
            "pending_jobs": df["pending_job_num"],
        }))
    raw = pd.concat(parts, ignore_index=True)
    origin = raw["ds"].min().floor("D")
    frame = to_regular_grid(raw, FREQ, ["gpu_demand", "running_jobs", "pending_jobs"], origin=origin,
                            source=directory)
    frame["gap"] = frame["gpu_demand"].isna()

    quota_path = quota_file(directory)
    frame["quota_gpus"] = float("nan")
    if quota_path is not None:
        header = pd.read_csv(quota_path, nrows=0).columns
        vcs = [c for c in header if c != "date"]
        quota = read_csv(quota_path, ["date"], numeric=vcs, ranges=dict.fromkeys(vcs, NON_NEGATIVE))
        quota["date"] = pd.to_datetime(quota["date"], errors="coerce")
        long = quota.melt(id_vars="date", var_name="unique_id", value_name="quota_gpus").dropna(subset=["date"])
        frame["date"] = frame["ds"].dt.floor("D")
        frame = frame.drop(columns="quota_gpus").merge(
            long.rename(columns={"date": "date"}), on=["unique_id", "date"], how="left"
        ).drop(columns="date")
    frame = frame.sort_values(["unique_id", "ds"], ignore_index=True)
    return SeriesDataset(
        name=NAME,
        frame=frame[["unique_id", "ds", "gpu_demand", "running_jobs", "pending_jobs", "quota_gpus", "gap"]],
        targets=["gpu_demand"],
        covariates=["running_jobs", "pending_jobs", "quota_gpus"],
        freq=FREQ,
        lead_steps=LEAD_STEPS,
        season_length=SEASON_LENGTH,
        units={"gpu_demand": "GPUs", "quota_gpus": "GPUs"},
    )
