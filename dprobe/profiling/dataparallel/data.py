"""Measured data-parallel steps laid out like ``datasets/pollux-placements``: a folder per model with
``placements.csv`` (``placement``, ``local_bsz``, ``step_time``, ``sync_time``) and, optionally,
``scalability.csv`` (``num_nodes``, ``num_replicas`` instead of ``placement``); ``models.csv`` gives each
model's parameter count and, optionally, its backward window (:mod:`.timeline`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.profiling.dataparallel.placement import parse_placement, spread
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW, check_window

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "datasets" / "pollux-placements"
BYTES_PER_GRADIENT = 4  # fp32 gradients (the measured jobs train in fp32)
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")


def parameter_counts(root: Path, extra: dict[str, int] | None = None) -> dict[str, int]:
    """Parameters of each model: ``models.csv`` of ``root`` (``model``, ``parameters``), then ``extra``."""
    counts: dict[str, int] = {}
    table = root / "models.csv"
    if table.is_file():
        frame = pd.read_csv(table)
        for col in ("model", "parameters"):
            if col not in frame.columns:
                raise ValueError(f"{table}: no column {col!r}")
        for row in frame.itertuples():
            if not (isinstance(row.parameters, int | np.integer) and row.parameters > 0):
                raise ValueError(f"{table}: parameters of {row.model!r} must be a positive integer, not {row.parameters!r}")
            counts[str(row.model)] = int(row.parameters)
    counts.update(extra or {})
    return counts


def backward_windows(root: Path) -> dict[str, float]:
    """Backward window of each model with one in ``models.csv``'s optional ``backward_window`` column (an
    empty cell, or no column, leaves the model to :data:`~.timeline.UNIFORM_WINDOW`)."""
    table = root / "models.csv"
    if not table.is_file():
        return {}
    frame = pd.read_csv(table)
    if "backward_window" not in frame.columns:
        return {}
    return {str(model): check_window(value, f"{table}: backward_window of {model!r}")
            for model, value in zip(frame.model, frame.backward_window, strict=True) if not pd.isna(value)}


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"placement": str})
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(map(repr, missing))}")
    numeric = [c for c in columns if c != "placement"]
    bad = frame[numeric].isna().any(axis=1) | (frame[numeric] <= 0).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: row {row + 2} has a missing or non-positive value in {', '.join(numeric)}")
    return frame


def load_steps(root: str | Path | None = None, params: dict[str, int] | None = None,
               scalability: bool = False) -> pd.DataFrame:
    """One row per measured multi-GPU configuration of every model under ``root``: ``model``, ``placement``
    (as text), ``gpus``, ``nodes``, ``busiest`` (GPUs on the fullest node), ``local_bsz``, ``step_time``,
    ``sync_time``, ``single_step`` (the model's one-GPU step time at the same per-GPU batch), ``grad_bytes``
    and ``window`` (the model's backward window, :data:`~.timeline.UNIFORM_WINDOW` where models.csv gives
    none). Rows whose per-GPU batch has no one-GPU measurement are left out (counted in
    ``attrs["no_single"]``). ``scalability``: read ``scalability.csv`` instead (GPUs spread evenly)."""
    base = Path(root) if root is not None else DEFAULT_DIR
    if not base.is_dir():
        raise ValueError(f"--data {base} is not a directory")
    counts = parameter_counts(base, params)
    windows = backward_windows(base)
    frames, dropped = [], 0
    for folder in sorted(p for p in base.iterdir() if (p / "placements.csv").is_file()):
        model = folder.name
        if model not in counts:
            raise ValueError(f"{folder}: no parameter count for model {model!r}: add it to models.csv or pass "
                             f"--param-count {model}=N")
        placed = _read(folder / "placements.csv", PLACEMENT_COLUMNS)
        one = placed[placed.placement.str.strip() == "1"].groupby("local_bsz").step_time.median()
        if scalability:
            if not (folder / "scalability.csv").is_file():
                continue
            rows = _read(folder / "scalability.csv", SCALABILITY_COLUMNS)
            where = [spread(int(r), int(n)) for r, n in zip(rows.num_replicas, rows.num_nodes, strict=True)]
        else:
            rows = placed
            where = [parse_placement(p) for p in rows.placement]
        rows = rows.assign(model=model, placement=[str(w) for w in where], gpus=[w.gpus for w in where],
                           nodes=[w.nodes for w in where], busiest=[w.busiest for w in where],
                           single_step=rows.local_bsz.map(one),
                           grad_bytes=float(BYTES_PER_GRADIENT * counts[model]),
                           window=windows.get(model, UNIFORM_WINDOW))
        rows = rows[rows.gpus > 1]
        dropped += int(rows.single_step.isna().sum())
        frames.append(rows.dropna(subset=["single_step"]))
    if not frames:
        raise ValueError(f"--data {base}: no model folder with a placements.csv")
    out = pd.concat(frames, ignore_index=True)[["model", "placement", "gpus", "nodes", "busiest", "local_bsz",
                                                "step_time", "sync_time", "single_step", "grad_bytes", "window"]]
    out.attrs["no_single"] = dropped
    return out
