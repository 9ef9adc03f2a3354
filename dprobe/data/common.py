"""Shared pieces of the loaders: the dataset container, CSV reading with clear errors, regular grids."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


class DatasetError(ValueError):
    """A data directory or file is missing, malformed or not understood."""


# the most seconds a time may lie from 1970 (or a span may last): pandas' timestamps end there (years 1677-2262)
MAX_SECONDS = float((pd.Timestamp.max - pd.Timestamp(0)) // pd.Timedelta(seconds=1))
# the most points a series may have on its regular grid (3.6 years of 57-second steps, 19 years of 5-minute
# ones): a series longer than that has a wrong timestamp, and would not fit in memory
MAX_GRID_POINTS = 2_000_000


@dataclass(frozen=True)
class Range:
    """What a numeric column may hold: finite values in ``[low, high]`` (whole numbers with ``whole``).

    Missing values (blank cells, NaN) are left to the caller: they are gaps, never zero.
    """

    low: float | None = None
    high: float | None = None
    whole: bool = False
    what: str = ""  # how an error names the range (default: from the bounds)

    def describe(self) -> str:
        if self.what:
            return self.what
        kind = "a whole number" if self.whole else "a number"
        if self.low is not None and self.high is not None:
            return f"{kind} between {self.low:g} and {self.high:g}"
        if self.low is not None:
            return f"{kind} >= {self.low:g}"
        if self.high is not None:
            return f"{kind} <= {self.high:g}"
        return f"a finite {kind[2:]}"


TIMESTAMP = Range(-MAX_SECONDS, MAX_SECONDS, what="seconds since 1970 within years 1677-2262 (what a timestamp holds)")
SECONDS = Range(-MAX_SECONDS, MAX_SECONDS, what=f"a time in seconds within +-{MAX_SECONDS:.4g} (292 years)")
DURATION = Range(0.0, MAX_SECONDS, what=f"a number of seconds between 0 and {MAX_SECONDS:.4g} (292 years)")
PERCENT = Range(0.0, 100.0)
NON_NEGATIVE = Range(0.0)
COUNT = Range(0.0, whole=True)  # a whole number >= 0 (bytes, steps, parameters)
POSITIVE_COUNT = Range(1.0, whole=True)  # a whole number >= 1 (batch, image side, tokens)


def check_range(path: Path | str, column: str, values: pd.Series, allowed: Range,
                where: str = "row {row}", rows: Sequence[int] | None = None) -> None:
    """A :class:`DatasetError` naming the file, column and row of the first value of ``values`` (numbers,
    NaN where missing) outside ``allowed``; ``where`` names a position, ``{row}`` its number in ``rows``
    (default: a CSV's, its index + 2)."""
    v = values.to_numpy(dtype=np.float64)
    bad = ~np.isnan(v) & ~np.isfinite(v)
    if allowed.low is not None:
        bad |= v < allowed.low
    if allowed.high is not None:
        bad |= v > allowed.high
    if allowed.whole:
        bad |= np.isfinite(v) & (v != np.round(v))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = values.iloc[i]
        shown = value.item() if isinstance(value, np.generic) else value  # 1e+20, not np.float64(1e+20)
        raise DatasetError(f"{path}: column {column!r} must be {allowed.describe()}; "
                           f"{where.format(row=rows[i] if rows is not None else i + 2)} has {shown!r}")


@dataclass
class SeriesDataset:
    """Many regular time series, one per target (pod, GPU, virtual cluster).

    ``frame`` is tidy: one row per ``unique_id`` and ``ds`` (a regular grid per
    series), one column per metric in ``targets`` and per covariate in
    ``covariates``. Grid points without a measurement are kept with NaN in the
    metric columns and ``True`` in the ``gap`` column; nothing is interpolated.
    """

    name: str
    frame: pd.DataFrame
    targets: list[str]
    covariates: list[str]
    freq: pd.Timedelta
    lead_steps: tuple[int, ...]
    season_length: int
    units: dict[str, str] = field(default_factory=dict)
    # a data set of whole jobs: series id -> its group (model family); such a data set is split by group
    # (:meth:`~dprobe.core.split.Split.group_role`), not in time. None: split each series in time
    groups: dict[str, str] | None = None
    # the first step a forecast is made at (a job is forecast from its first second on); 0: any
    first_origin: int = 0

    @property
    def series_ids(self) -> list[str]:
        return sorted(self.frame["unique_id"].unique())

    def to_long(self, target: str) -> pd.DataFrame:
        """The ``unique_id`` / ``ds`` / ``y`` frame of one metric (plus covariates)."""
        if target not in self.targets:
            raise KeyError(f"{target!r} is not a target of {self.name}; targets: {self.targets}")
        cols = ["unique_id", "ds", target, *self.covariates]
        return self.frame[cols].rename(columns={target: "y"})

    def arrays(self, target: str) -> dict[str, np.ndarray]:
        """Each series' values of one metric as a float array (NaN at gaps), keyed by ``unique_id``."""
        return {
            uid: g[target].to_numpy(dtype=np.float64)
            for uid, g in self.frame.groupby("unique_id", sort=True)
        }

    def covariate_arrays(self) -> dict[str, np.ndarray]:
        """Each series' covariates as a ``(time, n_covariates)`` float array."""
        if not self.covariates:
            return {}
        return {
            uid: g[self.covariates].to_numpy(dtype=np.float64)
            for uid, g in self.frame.groupby("unique_id", sort=True)
        }


def family_of(model: str) -> str:
    """A model's family by a generic rule: lower-case, cut at the first digit, size word or separator
    (``timm:resnet50`` and ``torchvision:resnet18`` are both ``resnet``); what leave-family-out scores and
    the split of a data set of whole jobs (:meth:`dprobe.core.split.Split.group_role`) group by."""
    name = model.lower().split(":")[-1].split("/")[-1]
    name = re.sub(r"(config|for[a-z]+|lmheadmodel|model)$", "", name)
    stem = re.split(r"[\d_\-.]|(?<=[a-z])(?:tiny|small|base|large|medium|wide|xl)\b", name)[0]
    return stem or name


def find_file(directory: Path, stem: str) -> Path:
    """``stem`` with ``.csv.gz`` or ``.csv``; a clear error naming both when neither exists."""
    for suffix in (".csv.gz", ".csv"):
        path = directory / f"{stem}{suffix}"
        if path.is_file():
            return path
    raise DatasetError(f"{directory}: missing file {stem}.csv.gz (or {stem}.csv)")


def read_csv(path: Path, required: Sequence[str], numeric: Iterable[str] = (),
             ranges: Mapping[str, Range] | None = None) -> pd.DataFrame:
    """Read a CSV and check that ``required`` columns exist and ``numeric`` ones parse as finite numbers
    (blank cells stay NaN: missing) within their ``ranges`` where given."""
    try:
        df = pd.read_csv(path, low_memory=False)
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: file not found") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, EOFError,
            zlib.error) as exc:
        raise DatasetError(f"{path}: cannot be read as CSV ({exc})") from exc
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DatasetError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(map(str, df.columns))})"
        )
    for col in numeric:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise DatasetError(
                f"{path}: column {col!r} must be numeric; row {row + 2} has {df[col].iloc[row]!r}"
            )
        check_range(path, col, values, (ranges or {}).get(col, Range()))
        df[col] = values
    if df.empty:
        raise DatasetError(f"{path}: no rows")
    return df


def snap_to_grid(ds: pd.Series, origin: pd.Timestamp, freq: pd.Timedelta) -> pd.Series:
    """Floor timestamps onto the grid ``origin + k * freq`` (tolerant of float rounding)."""
    steps = np.floor((ds - origin) / freq + 1e-6).astype("int64")
    return origin + steps * freq


def to_regular_grid(
    df: pd.DataFrame,
    freq: pd.Timedelta,
    value_cols: Sequence[str],
    origin: pd.Timestamp | None = None,
    how: str = "mean",
    source: Path | str = "",
) -> pd.DataFrame:
    """Put each series (``unique_id``) on a regular grid of step ``freq``.

    Samples are binned (floored) onto grid points anchored at ``origin`` (default: the
    earliest timestamp in ``df``) and aggregated with ``how``. Each series spans
    its own first to last bin; empty bins inside that span become explicit gaps
    (NaN values, ``gap=True``). A series longer than ``MAX_GRID_POINTS`` steps is a
    :class:`DatasetError` (``source``: the file or directory it names).
    """
    if origin is None:
        origin = df["ds"].min()
    spans = df.groupby("unique_id")["ds"].agg(["min", "max"])
    points = (spans["max"] - spans["min"]) / freq
    if (points > MAX_GRID_POINTS).any():
        uid = points.idxmax()
        raise DatasetError(f"{source or 'data'}: series {uid}: its timestamps run from {spans.loc[uid, 'min']} to "
                           f"{spans.loc[uid, 'max']}, more than {MAX_GRID_POINTS:,} steps of {freq.total_seconds():g} s; "
                           "is a timestamp wrong?")
    df = df.copy()
    df["ds"] = snap_to_grid(df["ds"], origin, freq)
    grouped = df.groupby(["unique_id", "ds"], sort=True)[list(value_cols)].agg(how)
    parts = []
    for uid, g in grouped.groupby(level=0, sort=True):
        g = g.droplevel(0)
        grid = pd.date_range(g.index.min(), g.index.max(), freq=freq)
        g = g.reindex(grid)
        g.index.name = "ds"
        g = g.reset_index()
        g.insert(0, "unique_id", uid)
        parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    out["gap"] = out[list(value_cols)].isna().all(axis=1)
    return out
