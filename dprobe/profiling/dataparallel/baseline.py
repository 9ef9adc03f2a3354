"""The visible-median baseline of the data-parallel sync: what the measured models (the visible ones)
waited on their gradient all-reduce at the same placement, per gradient byte, times the job's gradient
bytes.

For each measured model, the median over its rows at a (cluster, placement) of ``sync / grad_bytes`` (the
measured sync time; ``step - single_step``, at least 0, where only the step was measured); the baseline
is the median of those over the models (each model weighing the same). A placement no model measured takes
the models' medians over rows with the same GPUs and nodes, then the same nodes side (one node or
several) scaled by the ring's ``2 (N - 1) / N``. A step is ``single_step`` plus that sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # frames are only read: predict's path needs no pandas
    import pandas as pd


def _per_byte(steps: pd.DataFrame) -> pd.Series:
    waited = steps.sync_time.where(steps.sync_time.notna(), (steps.step_time - steps.single_step).clip(lower=0.0))
    return waited / steps.grad_bytes


def _ring(gpus: np.ndarray | pd.Series) -> np.ndarray:
    n = np.asarray(gpus, dtype=np.float64)
    return 2.0 * (n - 1.0) / np.maximum(n, 1.0)


def fit_baseline(steps: pd.DataFrame) -> dict[str, Any]:
    """The baseline's tables from measured rows (:func:`~.data.load_all`): seconds per gradient byte by
    (cluster, placement), by (cluster, gpus, nodes), and per ring byte by (cluster, several nodes)."""
    frame = steps.assign(per_byte=_per_byte(steps).to_numpy(),
                         per_ring_byte=(_per_byte(steps) / _ring(steps.gpus)).to_numpy(),
                         spans=(steps.nodes > 1).to_numpy())

    def table(keys: list[str], value: str) -> dict[str, float]:
        per_model = frame.groupby([*keys, "group"])[value].median()
        across = per_model.groupby(level=list(range(len(keys)))).median()
        return {"|".join(map(str, k if isinstance(k, tuple) else (k,))): float(f"{v:.6g}")
                for k, v in across.items()}

    return {"placement": table(["cluster", "placement"], "per_byte"),
            "gpus_nodes": table(["cluster", "gpus", "nodes"], "per_byte"),
            "spans": table(["cluster", "spans"], "per_ring_byte"),
            "models": sorted(frame.group.unique())}


def has_cluster(tables: dict[str, Any], cluster: str) -> bool:
    """Whether the baseline has measured rows of ``cluster``."""
    return any(key.split("|")[0] == cluster for key in tables["spans"])


def baseline_sync(tables: dict[str, Any], cluster: str, placement: str, gpus: int, nodes: int,
                  grad_bytes: float) -> float | None:
    """The baseline's sync seconds of one job, or None when the cluster has no measured rows."""
    if gpus <= 1:
        return 0.0
    for key, table, scale in ((f"{cluster}|{placement}", "placement", 1.0),
                              (f"{cluster}|{gpus}|{nodes}", "gpus_nodes", 1.0),
                              (f"{cluster}|{nodes > 1}", "spans", float(_ring([gpus])[0]))):
        if key in tables[table]:
            return tables[table][key] * scale * float(grad_bytes)
    return None


def predict_baseline(tables: dict[str, Any], steps: pd.DataFrame) -> np.ndarray:
    """The baseline's sync seconds of each row of ``steps`` (NaN where its cluster has no measured rows)."""
    out = [baseline_sync(tables, r.cluster, r.placement, int(r.gpus), int(r.nodes), float(r.grad_bytes))
           for r in steps.itertuples(index=False)]
    return np.array([np.nan if v is None else v for v in out], dtype=np.float64)
