"""One GPU's samples over time (utilisation and memory), as a job's first seconds are given to dprobe.

Two CSV layouts are read:

- dprobe's own, as in ``datasets/h200-profiles/samples.csv``: columns ``t`` (seconds),
  ``gpu_util_pct``, ``mem_used_bytes``, ``mem_total_bytes`` (others are ignored);
- what ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total --format=csv
  -lms 100`` prints (with or without ``nounits``; MiB and %). Add ``index`` or ``uuid`` to the query
  when the machine has several GPUs, and keep one with ``--id``.

Time is taken relative to the first row (``t_rel``), so start sampling when the job starts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.data.common import DatasetError

COLUMNS = ["t", "gpu_util_pct", "mem_used_bytes", "mem_total_bytes"]
MIB = 2**20
# nvidia-smi's header names (units stripped) -> ours; memory in MiB
NVIDIA_SMI = {"timestamp": "t", "utilization.gpu": "gpu_util_pct", "memory.used": "mem_used_bytes",
              "memory.total": "mem_total_bytes"}
GPU_ID_COLUMNS = ("index", "uuid", "pci.bus_id", "gpu_uuid", "gpu")


def read_gpu_samples(path: str | Path) -> pd.DataFrame:
    """``t_rel`` (seconds since the first row), ``gpu_util_pct``, ``mem_used_bytes``, ``mem_total_bytes``,
    sorted by time; a :class:`DatasetError` naming the problem for a file that is not one GPU's samples."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    try:
        raw = pd.read_csv(path, skipinitialspace=True, dtype=str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not a CSV file ({exc})") from exc
    raw.columns = [str(c).strip() for c in raw.columns]
    plain = {c.split(" [")[0]: c for c in raw.columns}  # "memory.used [MiB]" -> "memory.used"
    smi = set(NVIDIA_SMI) <= set(plain)
    if not smi and not set(COLUMNS) <= set(raw.columns):
        raise DatasetError(f"{path}: needs the columns {', '.join(COLUMNS)} (dprobe's samples.csv) or an "
                           "nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total "
                           f"--format=csv log; it has {', '.join(raw.columns) or 'none'}")
    ids = [plain[c] for c in GPU_ID_COLUMNS if c in plain]
    if ids and raw[ids[0]].nunique() > 1:
        raise DatasetError(f"{path}: samples of {raw[ids[0]].nunique()} GPUs ({ids[0]}); give one GPU's "
                           "(e.g. nvidia-smi --id=0)")
    if smi:
        frame = pd.DataFrame({ours: raw[plain[theirs]] for theirs, ours in NVIDIA_SMI.items()})
        t = pd.to_datetime(frame["t"].str.strip(), errors="coerce", format="mixed")
        frame["t"] = (t - t.min()).dt.total_seconds()
        for col in ("gpu_util_pct", "mem_used_bytes", "mem_total_bytes"):
            frame[col] = pd.to_numeric(frame[col].str.replace(r"\s*(%|MiB)\s*$", "", regex=True), errors="coerce")
        frame[["mem_used_bytes", "mem_total_bytes"]] *= MIB
    else:
        frame = raw[COLUMNS].apply(pd.to_numeric, errors="coerce")
    bad = ~np.isfinite(frame.to_numpy(dtype=float)).all(axis=1)  # NaN where a cell was missing or not a number
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetError(f"{path}: row {row + 2} has a missing or non-numeric value "
                           f"({', '.join(f'{k}={raw.iloc[row][k]!r}' for k in raw.columns[:6])})")
    if len(frame) == 0:
        raise DatasetError(f"{path}: no samples")
    if (frame["gpu_util_pct"] < 0).any() or (frame["gpu_util_pct"] > 100).any():
        raise DatasetError(f"{path}: GPU utilisation outside 0-100 %")
    if (frame["mem_used_bytes"] <= 0).any() or (frame["mem_total_bytes"] <= 0).any():
        raise DatasetError(f"{path}: memory used and total must be positive")
    frame = frame.sort_values("t", kind="stable").reset_index(drop=True)
    frame["t_rel"] = frame["t"] - frame["t"].iloc[0]
    return frame[["t_rel", "gpu_util_pct", "mem_used_bytes", "mem_total_bytes"]]
