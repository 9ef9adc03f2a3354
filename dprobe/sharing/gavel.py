"""datasets/gavel-colocation: Gavel's job types measured alone and in pairs on K80, P100 and V100 GPUs, and
dprobe's cold-start profile of each job type (``gavel_profiles.json``, from tools/gavel_models.py).

:func:`load_pairs` gives one row per job of a co-located pair on one GPU: the job (``a``), the job beside
it (``b``), both throughputs alone and together, and ``speed`` (together over alone). Each measured pair
gives two rows, one per job. Gavel's file repeats each single-GPU pair under an ``_unconsolidated`` GPU
name with the same numbers, and lists multi-GPU pairs that were never run: both are left out. A pair with
no throughput together (0) did not fit in memory or was not run: ``measured`` is False and ``speed``
NaN.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CSV = ROOT / "datasets" / "gavel-colocation" / "throughputs.csv"
PROFILES = Path(__file__).with_name("gavel_profiles.json")
COLUMNS = ("gpu", "model_a", "batch_a", "gpus_a", "model_b", "batch_b", "gpus_b", "alone_a", "alone_b",
           "colocated_a", "colocated_b")


def job_key(model: str, batch: Any) -> str:
    """A job type's key, ``MODEL|BATCH`` (``MODEL|`` where Gavel gives no batch: A3C, CycleGAN)."""
    missing = batch is None or (isinstance(batch, float) and np.isnan(batch)) or batch == ""
    return f"{model}|{'' if missing else int(float(batch))}"


def load_pairs(path: str | Path | None = None) -> pd.DataFrame:
    """One row per job of each single-GPU pair (see the module docstring): ``gpu``, ``a``, ``b`` (job keys),
    ``model_a``, ``model_b``, ``alone_a``, ``alone_b``, ``colocated_a``, ``measured``, ``speed``.

    ``path``: a throughputs.csv, or a directory holding one (default: the bundled data set). A
    ValueError names a missing column."""
    path = Path(path) if path else DEFAULT_CSV
    if path.is_dir():
        path = path / "throughputs.csv"
    frame = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})")
    pairs = frame[frame["model_b"].notna() & (frame["gpus_a"] == 1) & (frame["gpus_b"] == 1)
                  & ~frame["gpu"].astype(str).str.endswith("_unconsolidated")].copy()
    pairs["a"] = [job_key(m, b) for m, b in zip(pairs["model_a"], pairs["batch_a"], strict=True)]
    pairs["b"] = [job_key(m, b) for m, b in zip(pairs["model_b"], pairs["batch_b"], strict=True)]
    pairs = pairs.drop_duplicates(["gpu", "a", "b"])
    pairs["measured"] = (pairs["colocated_a"].fillna(0) > 0) & (pairs["alone_a"].fillna(0) > 0)
    pairs["speed"] = np.where(pairs["measured"], pairs["colocated_a"] / pairs["alone_a"].where(pairs["alone_a"] > 0),
                              np.nan)
    keep = ["gpu", "a", "b", "model_a", "model_b", "alone_a", "alone_b", "colocated_a", "measured", "speed"]
    return pairs[keep].reset_index(drop=True)


def unordered_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """Each pair once (the rows with ``a <= b``): for whether a pair fits, which does not depend on order."""
    return pairs[pairs["a"] <= pairs["b"]].reset_index(drop=True)


@lru_cache(maxsize=4)
def _profiles(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_profiles(path: str | Path | None = None) -> dict[str, Any]:
    """``gavel_profiles.json``: ``gpus`` (memory, peak fp32 FLOP/s, bandwidth per GPU key) and ``jobs``
    (per job type, per GPU, the fields of ``dprobe predict --json`` the co-location model reads)."""
    return _profiles(str(Path(path) if path else PROFILES))


def job_profile(key: str, gpu: str, profiles: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job type's predicted profile alone on ``gpu`` (a ``dprobe predict --json`` subset, with its
    ``model`` and ``batch``); KeyError naming the job or GPU it lacks."""
    profiles = profiles or load_profiles()
    by_key = {j["key"]: j for j in profiles["jobs"]}
    if key not in by_key:
        raise KeyError(f"no profile of job type {key!r} (tools/gavel_models.py --write)")
    job = by_key[key]
    if gpu not in job["gpus"]:
        raise KeyError(f"no profile of {key!r} on {gpu!r} (it has {', '.join(job['gpus'])})")
    return {"model": job["model"], "batch": job["batch"], **job["gpus"][gpu]}


def leave_model_type_out(pairs: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Folds that hold out one model type each: (type, training rows, held-out rows), every pair that
    involves the type (as either job) held out, the rest for training."""
    types = sorted(set(pairs["model_a"]) | set(pairs["model_b"]))
    folds = []
    for t in types:
        held = ((pairs["model_a"] == t) | (pairs["model_b"] == t)).to_numpy()
        folds.append((t, np.flatnonzero(~held), np.flatnonzero(held)))
    return folds
