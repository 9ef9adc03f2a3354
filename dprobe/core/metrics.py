"""Forecast error metrics: MAE, MASE, pinball loss, quantile coverage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def pinball_terms(diff: Any, levels: Any) -> Any:
    """Elementwise pinball loss of errors ``diff = actual - quantile`` whose last axis runs over ``levels``.

    ``diff`` a numpy array (``levels`` any sequence), or a torch tensor (``levels`` a tensor or a number;
    the result stays on its device and in the autograd graph, and torch is not imported here)."""
    if hasattr(diff, "detach"):  # a tensor: torch.maximum
        return (levels * diff).maximum((levels - 1) * diff)
    lv = np.asarray(levels, dtype=float)
    return np.maximum(lv * diff, (lv - 1) * diff)


def pinball(actual: np.ndarray, quantiles: np.ndarray, levels: Sequence[float]) -> float:
    """Mean pinball (quantile) loss over all forecasts and levels; ``quantiles`` is ``(N, Q)``."""
    return float(np.mean(pinball_terms(actual[:, None] - quantiles, levels)))


def coverage(actual: np.ndarray, upper: np.ndarray) -> float:
    """Fraction of actuals at or below a quantile forecast (a p90 forecast should cover 90%)."""
    return float(np.mean(actual <= upper))
