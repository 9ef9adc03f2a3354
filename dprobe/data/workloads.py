"""Which workload each series runs, where a directory says so: ``workloads.csv`` beside the series.

A series forecaster is *conditioned* on the workload it forecasts: where the model graph and job
are known, on a vector of graph-derived and static features (the training step replayed on the
graph: memory, FLOPs, roofline times, plus batch, precision, optimizer, GPU); where not, on a
learned "unknown workload" embedding. ``workloads.csv`` (optional) maps series ids to jobs:

    series,model,batch,precision,optimizer
    pod-a,torchvision:resnet50,64,bf16,adamw
    pod-b,transformers:BertConfig/BertForSequenceClassification,32,fp32,adamw

``model`` takes any name ``dprobe graph`` does; ``precision`` (fp32), ``optimizer`` (adamw),
``image``, ``seq`` and ``config_kwargs`` (JSON) are optional. Series without a row are unknown.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.data.common import DatasetError

FILE = "workloads.csv"
REQUIRED = ("series", "model", "batch")


def workload_dim() -> int:
    """Length of a workload vector (the cold-start profiler's job features)."""
    from dprobe.coldstart.features import FEATURES

    return len(FEATURES)


def read_workloads(directory: str | Path) -> pd.DataFrame | None:
    """The rows of ``directory/workloads.csv``, checked; None when there is no such file."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    table = pd.read_csv(path, dtype={"series": str})
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    batch = pd.to_numeric(table["batch"], errors="coerce")
    bad = table.index[batch.isna() | (batch < 1) | (batch != batch.round())]
    if len(bad):
        raise DatasetError(f"{path}: row {int(bad[0]) + 2}: batch must be a positive integer, "
                           f"got {table.loc[bad[0], 'batch']!r}")
    dup = table["series"][table["series"].duplicated()]
    if len(dup):
        raise DatasetError(f"{path}: series {dup.iloc[0]!r} is listed twice")
    return table


def workload_vector(row: pd.Series, cache_dir: str | Path | None = None, gpu: str = "h200") -> np.ndarray:
    """The job features of one ``workloads.csv`` row (replays the training step on the model graph)."""
    from dprobe.coldstart.features import GPUS, analytical_for, job_features

    def opt(name: str, default: object = None) -> object:
        v = row.get(name, default)
        return default if v is None or (isinstance(v, float) and np.isnan(v)) else v

    precision, optimizer = str(opt("precision", "fp32")), str(opt("optimizer", "adamw"))
    image, seq = opt("image"), opt("seq")
    kwargs = opt("config_kwargs")
    est = analytical_for(str(row["model"]), int(row["batch"]), precision, optimizer,
                         image=int(image) if image is not None else None, seq=int(seq) if seq is not None else None,
                         config_kwargs=json.loads(kwargs) if isinstance(kwargs, str) else kwargs,
                         cache_dir=cache_dir)
    return np.asarray(job_features(est, int(row["batch"]), precision, optimizer, GPUS[gpu]), dtype=np.float32)


def workload_vectors(directory: str | Path, series_ids: list[str],
                     cache_dir: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(S, D)`` workload vectors and ``(S,)`` known flags for ``series_ids`` (zeros / False: unknown)."""
    d = workload_dim()
    vectors = np.zeros((len(series_ids), d), dtype=np.float32)
    known = np.zeros(len(series_ids), dtype=bool)
    table = read_workloads(directory)
    if table is None:
        return vectors, known
    rows = {str(r["series"]): r for _, r in table.iterrows()}
    for i, sid in enumerate(series_ids):
        if sid in rows:
            try:
                vectors[i] = workload_vector(rows[sid], cache_dir)
            except Exception as exc:  # an unknown model name, bad kwargs: say which row
                raise DatasetError(f"{Path(directory) / FILE}: series {sid!r}: {exc}") from exc
            known[i] = True
    return vectors, known
