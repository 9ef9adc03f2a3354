"""Alibaba GenAI serving trace (cluster-trace-v2026-GenAI): per-pod GPU duty cycle, memory and request rate."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from dprobe.data.common import (
    TIMESTAMP,
    DatasetError,
    Range,
    SeriesDataset,
    find_file,
    read_csv,
    snap_to_grid,
    to_regular_grid,
)

log = logging.getLogger(__name__)

NAME = "alibaba-genai-2026"
DUTY_FILE = "pod_gpu_duty_cycle_anon"
MEMORY_FILE = "pod_gpu_memory_used_bytes_anon"
QPS_FILE = "qps"
FREQ = pd.Timedelta(seconds=57)  # the trace's native sampling step
LEAD_STEPS = (5, 15, 30)
SEASON_LENGTH = 63  # about one hour of 57-second steps (the trace spans < 1 day)


# what each target's ``value`` may be: a GPU is busy 0-100 % of the time, and holds no negative memory
VALUE_RANGES = {"gpu_duty_cycle_pct": Range(0.0, 100.0, what="a duty cycle between 0 and 100 (percent)"),
                "gpu_memory_bytes": Range(0.0, what="a number of bytes >= 0")}


def _read_metric(path: Path, column: str) -> pd.DataFrame:
    df = read_csv(path, ["value", "timestamp_anon", "container_ip"], numeric=["value", "timestamp_anon"],
                  ranges={"value": VALUE_RANGES[column], "timestamp_anon": TIMESTAMP})
    df = df.dropna(subset=["container_ip", "timestamp_anon"])
    return pd.DataFrame(
        {
            "unique_id": df["container_ip"].astype(str),
            "ds": pd.to_datetime(df["timestamp_anon"], unit="s"),
            column: df["value"].astype("float64"),
        }
    )


def load_alibaba(directory: str | Path) -> SeriesDataset:
    """Load a directory laid out like ``datasets/alibaba-genai-2026``.

    Targets: ``gpu_duty_cycle_pct`` (GPU duty cycle, percent 0-100) and
    ``gpu_memory_bytes``, each where its file is there (one is enough).
    Covariates: ``qps`` (the pod's generative request rate; no row in ``qps``
    means no request, i.e. 0) and ``qps_api`` (the cluster-wide API request
    rate, same for every pod); both unknown (NaN) without a ``qps`` file.
    A duty cycle outside 0-100, negative memory or request rates, infinite values and timestamps a
    timestamp cannot hold are a :class:`DatasetError` naming the file, the column and the row.
    """
    directory = Path(directory)
    found = {target: _optional_file(directory, stem) for target, stem in
             (("gpu_duty_cycle_pct", DUTY_FILE), ("gpu_memory_bytes", MEMORY_FILE))}
    files = {t: path for t, path in found.items() if path is not None}
    targets = list(files)
    if not targets:
        raise DatasetError(f"{directory}: missing both {DUTY_FILE}.csv.gz and {MEMORY_FILE}.csv.gz (or .csv)")
    metrics = pd.concat([_read_metric(files[t], t) for t in targets], ignore_index=True)
    if metrics.empty:
        raise DatasetError(f"{directory}: no pod rows in {' or '.join(files[t].name for t in targets)}")
    origin = metrics["ds"].min()
    frame = to_regular_grid(metrics, FREQ, targets, origin=origin, source=directory)

    qps_path = _optional_file(directory, QPS_FILE)
    if qps_path is None:  # request rates not scraped: unknown (NaN), as the forecaster is trained to expect
        log.warning("%s: no %s.csv.gz: forecasting without request rates", directory, QPS_FILE)
        frame["qps"] = frame["qps_api"] = float("nan")
        return _dataset(frame, targets)
    qps = read_csv(qps_path, ["timestamp_anon", "value", "container_ip", "request_type"],
                   numeric=["value", "timestamp_anon"],
                   ranges={"value": Range(0.0, what="a request rate >= 0"), "timestamp_anon": TIMESTAMP})
    qps["ds"] = snap_to_grid(pd.to_datetime(qps["timestamp_anon"], unit="s"), origin, FREQ)
    pod_qps = (
        qps.dropna(subset=["container_ip"])
        .groupby(["container_ip", "ds"])["value"].sum()
        .rename("qps").rename_axis(["unique_id", "ds"]).reset_index()
    )
    api_qps = qps[qps["container_ip"].isna()].groupby("ds")["value"].sum().rename("qps_api").reset_index()
    frame = frame.merge(pod_qps, on=["unique_id", "ds"], how="left").merge(api_qps, on="ds", how="left")
    frame[["qps", "qps_api"]] = frame[["qps", "qps_api"]].fillna(0.0)
    return _dataset(frame, targets)


def _optional_file(directory: Path, stem: str) -> Path | None:
    try:
        return find_file(directory, stem)
    except DatasetError:
        return None


def _dataset(frame: pd.DataFrame, targets: list[str]) -> SeriesDataset:
    frame = frame.sort_values(["unique_id", "ds"], ignore_index=True)
    return SeriesDataset(
        name=NAME,
        frame=frame[["unique_id", "ds", *targets, "qps", "qps_api", "gap"]],
        targets=targets,
        covariates=["qps", "qps_api"],
        freq=FREQ,
        lead_steps=LEAD_STEPS,
        season_length=SEASON_LENGTH,
        units={"gpu_duty_cycle_pct": "percent", "gpu_memory_bytes": "bytes", "qps": "requests/s"},
    )
