"""Window normalisation shared by training and inference.

A window of one metric is expressed relative to its last observed value and
scaled by its mean absolute level (floored per task, so an idle window does
not blow up a later spike): ``x = (v - last) / scale``. Forecasts are made in
the same units and mapped back with ``last + scale * x``. A forecast of 0 is
the last-value forecast.
"""

from __future__ import annotations

import numpy as np

N_COVARIATES = 4  # covariates are zero-padded (or cut) to this many channels


def last_observed(values: np.ndarray) -> np.ndarray:
    """Last non-NaN value of each row (0 where a row has none)."""
    observed = ~np.isnan(values)
    idx = values.shape[1] - 1 - np.argmax(observed[:, ::-1], axis=1)
    last = values[np.arange(len(values)), idx]
    return np.where(observed.any(axis=1), last, 0.0)


def window_scale(values: np.ndarray, floor: float) -> np.ndarray:
    """Mean absolute value of each row, at least ``floor``."""
    with np.errstate(invalid="ignore"), np.testing.suppress_warnings() as sup:
        sup.filter(RuntimeWarning)
        level = np.nanmean(np.abs(values), axis=1)
    return np.maximum(np.nan_to_num(level, nan=0.0), floor)


def make_features(values: np.ndarray, covariates: np.ndarray | None, floor: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B, L)`` values (+ ``(B, L, C)`` covariates) -> features ``(B, L, 2 + N_COVARIATES)``, last, scale.

    Channels: normalised value (0 at gaps), observed mask, then
    ``sign(c) * log1p(|c|)`` of each covariate (0 where missing).
    """
    values = np.asarray(values, dtype=np.float64)
    b, length = values.shape
    last = last_observed(values)
    scale = window_scale(values, floor)
    x = (values - last[:, None]) / scale[:, None]
    observed = ~np.isnan(x)
    feats = np.zeros((b, length, 2 + N_COVARIATES), dtype=np.float32)
    feats[..., 0] = np.clip(np.nan_to_num(x, nan=0.0), -50, 50)
    feats[..., 1] = observed
    if covariates is not None and covariates.size:
        c = np.asarray(covariates, dtype=np.float64)[..., :N_COVARIATES]
        feats[..., 2 : 2 + c.shape[-1]] = np.nan_to_num(np.sign(c) * np.log1p(np.abs(c)), nan=0.0)
    return feats, last, scale


def normalise_targets(targets: np.ndarray, last: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(B, H)`` future values in window units (NaN kept: masked out of the loss)."""
    return (targets - last[:, None]) / scale[:, None]
