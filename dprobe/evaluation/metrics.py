"""Forecast error metrics: MAE, MASE, pinball loss, quantile coverage."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mae(actual: np.ndarray, point: np.ndarray) -> float:
    return float(np.mean(np.abs(actual - point)))


def mase_scale(train: np.ndarray) -> float:
    """Mean absolute one-step naive error on the training part (NaN if the series never moves)."""
    train = train[~np.isnan(train)]
    if len(train) < 2:
        return float("nan")
    scale = float(np.mean(np.abs(np.diff(train))))
    return scale if scale > 0 else float("nan")


def pinball(actual: np.ndarray, quantiles: np.ndarray, levels: Sequence[float]) -> float:
    """Mean pinball (quantile) loss over all forecasts and levels; ``quantiles`` is ``(N, Q)``."""
    diff = actual[:, None] - quantiles
    lv = np.asarray(levels)[None, :]
    return float(np.mean(np.maximum(lv * diff, (lv - 1) * diff)))


def coverage(actual: np.ndarray, upper: np.ndarray) -> float:
    """Fraction of actuals at or below a quantile forecast (a p90 forecast should cover 90%)."""
    return float(np.mean(actual <= upper))
