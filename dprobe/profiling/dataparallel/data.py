"""Measured data-parallel steps: folders laid out like ``datasets/pollux-placements`` (a folder per model
with ``placements.csv``: ``placement``, ``local_bsz``, ``step_time``, ``sync_time``; optionally
``scalability.csv``: ``num_nodes``, ``num_replicas`` instead of ``placement``; ``models.csv`` gives each
model's parameter count and, optionally, its backward window, :mod:`.timeline`), and the data-parallel rows
of ``datasets/gavel-colocation/throughputs.csv`` (step time only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.profiling.dataparallel.placement import parse_placement, spread
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW, check_window

DATASETS = Path(__file__).resolve().parents[3] / "datasets"
DEFAULT_DIR = DATASETS / "pollux-placements"
GAVEL_FILE = DATASETS / "gavel-colocation" / "throughputs.csv"
POLLUX_CLUSTER = "pollux-t4"
STEP_COLUMNS = ["model", "group", "cluster", "placement", "gpus", "nodes", "busiest", "local_bsz", "step_time",
                "sync_time", "single_step", "grad_bytes", "window"]
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
               scalability: bool = False, cluster: str | None = None) -> pd.DataFrame:
    """One row per measured multi-GPU configuration of every model under ``root``: ``model``, ``group`` (the
    model: what leave-one-model-out holds out together), ``cluster``, ``placement`` (as text), ``gpus``,
    ``nodes``, ``busiest`` (GPUs on the fullest node), ``local_bsz``, ``step_time``, ``sync_time``,
    ``single_step`` (the model's one-GPU step time at the same per-GPU batch), ``grad_bytes`` and ``window``
    (the model's backward window, :data:`~.timeline.UNIFORM_WINDOW` where models.csv gives none). Rows whose
    per-GPU batch has no one-GPU measurement are left out (counted in ``attrs["no_single"]``).
    ``scalability``: read ``scalability.csv`` instead (GPUs spread evenly). ``cluster`` names the cluster that
    measured them (default: ``pollux-t4`` for the bundled data, else the folder's name)."""
    base = Path(root) if root is not None else DEFAULT_DIR
    if not base.is_dir():
        raise ValueError(f"--data {base} is not a directory")
    if cluster is None:
        cluster = POLLUX_CLUSTER if base.resolve() == DEFAULT_DIR.resolve() else base.resolve().name
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
        rows = rows.assign(model=model, group=model, cluster=cluster, placement=[str(w) for w in where],
                           gpus=[w.gpus for w in where],
                           nodes=[w.nodes for w in where], busiest=[w.busiest for w in where],
                           single_step=rows.local_bsz.map(one),
                           grad_bytes=float(BYTES_PER_GRADIENT * counts[model]),
                           window=windows.get(model, UNIFORM_WINDOW))
        rows = rows[rows.gpus > 1]
        dropped += int(rows.single_step.isna().sum())
        frames.append(rows.dropna(subset=["single_step"]))
    if not frames:
        raise ValueError(f"--data {base}: no model folder with a placements.csv")
    out = pd.concat(frames, ignore_index=True)[STEP_COLUMNS]
    out.attrs["no_single"] = dropped
    return out


def load_gavel_steps(path: str | Path | None = None) -> pd.DataFrame:
    """The data-parallel rows of Gavel's throughput table (``datasets/gavel-colocation/throughputs.csv``: rows
    without a second job, ``gpus_a`` above 1, of the job types of :data:`~.gavel_models.JOB_TYPES`), as
    :func:`load_steps` lays them out, with ``sync_time`` NaN (not measured). Gavel's throughput of a job on
    N GPUs counts every worker's steps: a data-parallel step takes ``N / throughput`` seconds, one GPU's
    step ``1 / throughput`` at the same per-GPU batch (``batch_a``). ``gpu`` names the cluster: ``v100`` =
    the GPUs of one server (placement ``N``), ``v100_unconsolidated`` = one GPU on each of N servers.
    Unmeasured rows (throughput 0) and rows without a one-GPU throughput are left out."""
    from dprobe.profiling.dataparallel.gavel_models import JOB_TYPES

    file = Path(path) if path is not None else GAVEL_FILE
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    table = pd.read_csv(file)
    wanted = ("gpu", "model_a", "batch_a", "gpus_a", "model_b", "alone_a")
    missing = [c for c in wanted if c not in table.columns]
    if missing:
        raise ValueError(f"{file}: no column {', '.join(map(repr, missing))}")
    alone = table[table.model_b.isna() & table.model_a.isin(list(JOB_TYPES)) & (table.alone_a > 0)
                  & table.batch_a.notna()]
    one = alone[alone.gpus_a == 1].groupby(["gpu", "model_a", "batch_a"]).alone_a.median()
    multi = alone[alone.gpus_a > 1]
    single = [one.get((g, m, b), np.nan) for g, m, b in zip(multi.gpu, multi.model_a, multi.batch_a, strict=True)]
    spread_out = multi.gpu.str.endswith("_unconsolidated").to_numpy()
    gpus = multi.gpus_a.astype(int).to_numpy()
    where = [spread(int(n), int(n)) if out else spread(int(n), 1) for n, out in zip(gpus, spread_out, strict=True)]
    jobs = [JOB_TYPES[m] for m in multi.model_a]
    out = pd.DataFrame({
        "model": [f"gavel {m}" for m in multi.model_a], "group": [j.group for j in jobs],
        "cluster": ["gavel-" + g.removesuffix("_unconsolidated") for g in multi.gpu],
        "placement": [str(w) for w in where], "gpus": gpus, "nodes": [w.nodes for w in where],
        "busiest": [w.busiest for w in where], "local_bsz": multi.batch_a.to_numpy(),
        "step_time": gpus / multi.alone_a.to_numpy(), "sync_time": np.nan,
        "single_step": 1.0 / np.asarray(single, dtype=np.float64),
        "grad_bytes": [float(BYTES_PER_GRADIENT * j.parameters) for j in jobs],
        "window": [j.backward_window for j in jobs]})
    dropped = int(out.single_step.isna().sum())
    out = out.dropna(subset=["single_step"]).reset_index(drop=True)[STEP_COLUMNS]
    out.attrs["no_single"] = dropped
    return out


def load_all(root: str | Path | None = None, params: dict[str, int] | None = None,
             gavel: str | Path | None | bool = None) -> pd.DataFrame:
    """Every measured step the fit learns from: pollux-placements (or ``root``) and, unless ``gavel`` is
    False, Gavel's data-parallel rows (``gavel``: a throughputs.csv, default the bundled one)."""
    frames = [load_steps(root, params)]
    if gavel is not False:
        frames.append(load_gavel_steps(None if gavel is None or gavel is True else gavel))
    return pd.concat(frames, ignore_index=True)
