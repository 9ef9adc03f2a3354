"""Baseline forecasters: last value, seasonal naive, moving average / median, EWMA and ETS.

Every baseline is defined by its *forecast path*: the point forecast it would
have made at every position of a history, for every lead time. Quantiles come
from the same baseline's own realised errors at earlier positions (empirical,
split-conformal style), so every baseline is compared with the model on equal
terms. ``predict`` returns the path's last position.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dprobe.core.names import BASELINES as NAMED_BASELINES
from dprobe.forecaster.base import QUANTILES, Forecast, ForecastInput

RESIDUAL_WINDOW = 1000  # realised errors kept for the quantiles (trailing)
MIN_RESIDUALS = 10  # fewer than this: quantiles fall back to the point forecast


def ffill(values: np.ndarray) -> np.ndarray:
    """Forward-fill NaN gaps along the last axis; leading NaN stay NaN."""
    values = np.asarray(values, dtype=np.float64)
    mask = np.isnan(values)
    idx = np.where(~mask, np.arange(values.shape[-1]), 0)
    np.maximum.accumulate(idx, axis=-1, out=idx)
    out = np.take_along_axis(values, idx, axis=-1)
    return out


def _stack(paths: list[np.ndarray]) -> np.ndarray:
    return np.stack(paths, axis=-1)  # (B, T, H)


def last_value_path(y: np.ndarray, leads: Sequence[int]) -> np.ndarray:
    y = ffill(y)
    return _stack([y for _ in leads])


def seasonal_naive_path(y: np.ndarray, leads: Sequence[int], season_length: int) -> np.ndarray:
    """Forecast for t+h is the value one season before t+h: y[t + h - m * ceil(h / m)]."""
    y = ffill(y)
    out = []
    for h in leads:
        back = season_length * int(np.ceil(h / season_length)) - h  # how far before t
        shifted = np.full_like(y, np.nan)
        shifted[..., back:] = y[..., : y.shape[-1] - back] if back else y
        out.append(shifted)
    return _stack(out)


def _rolling(y: np.ndarray, window: int, how: str) -> np.ndarray:
    frame = pd.DataFrame(ffill(y).T)
    roll = frame.rolling(window, min_periods=1)
    res = roll.median() if how == "median" else roll.mean()
    return res.to_numpy().T


def moving_average_path(y: np.ndarray, leads: Sequence[int], window: int) -> np.ndarray:
    m = _rolling(y, window, "mean")
    return _stack([m for _ in leads])


def moving_median_path(y: np.ndarray, leads: Sequence[int], window: int) -> np.ndarray:
    m = _rolling(y, window, "median")
    return _stack([m for _ in leads])


def ewma_path(y: np.ndarray, leads: Sequence[int], alpha: float) -> np.ndarray:
    m = pd.DataFrame(ffill(y).T).ewm(alpha=alpha, ignore_na=True).mean().to_numpy().T
    return _stack([m for _ in leads])


def ets_path(y: np.ndarray, leads: Sequence[int], fit_length: int | None = None) -> np.ndarray:
    """Non-seasonal ETS (statsforecast's AutoETS, model ``ZZN``) fitted once per series.

    Parameters are estimated on the first ``fit_length`` points (default: all),
    then the state-space filter runs over the whole history with those
    parameters, and the h-step forecast from every position comes from the
    state there.
    """
    from statsforecast.ets import ets_f, forward_ets

    y = ffill(y)
    out = np.full((*y.shape, len(leads)), np.nan)
    for b in range(y.shape[0]):
        series = y[b]
        start = int(np.argmax(~np.isnan(series))) if np.isnan(series).any() else 0
        series = series[start:]
        n_fit = len(series) if fit_length is None else max(0, min(len(series), fit_length - start))
        if n_fit < 10 or np.nanstd(series[:n_fit]) == 0:
            out[b, start:] = series[:, None]  # too short or constant: ETS is the last value
            continue
        try:
            model = ets_f(series[:n_fit].astype(np.float64), m=1, model="ZZN")
            full = forward_ets(model, series.astype(np.float64))
        except Exception:  # ETS failed to fit this series: degrade to the last value
            out[b, start:] = series[:, None]
            continue
        out[b, start:] = ets_point_forecasts(full, leads)
    return out


def ets_point_forecasts(model: dict, leads: Sequence[int]) -> np.ndarray:
    """h-step point forecasts of a non-seasonal ETS model from every filtered state: ``(T, H)``.

    Level l and trend b after each observation; additive trend: l + s_h b,
    multiplicative: l * b^s_h, with s_h = phi + (phi + ... + phi^(h-1)) as in
    statsforecast's (and R forecast's) ETS (s_h = h undamped).
    """
    states = np.asarray(model["states"])[1:]  # state after observing y[t]
    trend, damped = model["components"][1], model["components"][3]
    phi = 1.0 if damped == "N" else float(model["par"][3])
    level = states[:, 0:1]
    if trend == "N":
        return np.repeat(level, len(leads), axis=1)
    steps = np.array([phi + np.sum(phi ** np.arange(1, h)) for h in leads])[None, :]
    slope = states[:, 1:2]
    return level + steps * slope if trend == "A" else level * slope**steps


PathFn = Callable[..., np.ndarray]


def conformal_quantiles(
    y: np.ndarray,
    path: np.ndarray,
    leads: Sequence[int],
    levels: Sequence[float] = QUANTILES,
    window: int = RESIDUAL_WINDOW,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """Quantile forecasts from realised errors: ``(B, T, H, Q)`` (or ``(B, len(positions), H, Q)``).

    At position t, the offsets for lead h are the empirical quantiles of the
    errors ``y[s + h] - path[s, h]`` for the last ``window`` positions s with
    ``s + h <= t`` (errors already known at t). Point + offsets gives the
    quantiles; they are sorted so they never cross.
    """
    y = np.asarray(y, dtype=np.float64)
    b, t_len, n_h = path.shape
    positions = np.arange(t_len) if positions is None else np.asarray(positions)
    out = np.empty((b, len(positions), n_h, len(levels)))
    for j, h in enumerate(leads):
        known = np.full((b, t_len), np.nan)  # known[t]: the error of the forecast made at t - h
        if h < t_len:
            known[:, h:] = y[:, h:] - path[:, : t_len - h, j]
        frame = pd.DataFrame(known.T)
        roll = frame.rolling(window, min_periods=MIN_RESIDUALS)
        for k, q in enumerate(levels):
            off = roll.quantile(q).to_numpy().T[:, positions]
            off = np.where(np.isnan(off), 0.0, off)
            out[:, :, j, k] = path[:, positions, j] + off
    return np.sort(out, axis=-1)


def last_position_quantiles(y: np.ndarray, path: np.ndarray, leads: Sequence[int],
                            levels: Sequence[float] = QUANTILES, window: int = RESIDUAL_WINDOW) -> np.ndarray:
    """:func:`conformal_quantiles` at the last position only (what an online forecaster needs): ``(B, H, Q)``."""
    b, t_len, n_h = path.shape
    out = np.empty((b, n_h, len(levels)))
    for j, h in enumerate(leads):
        lo = max(0, t_len - h - window)
        err = y[:, lo + h :] - path[:, lo : t_len - h, j]  # errors of forecasts already verified
        n = (~np.isnan(err)).sum(axis=1)
        if not err.shape[1]:
            off = np.full((b, len(levels)), np.nan)
        elif not np.isnan(err).any():  # no gaps: the same quantiles, ten times faster than nanquantile
            off = np.quantile(err, levels, axis=1).T
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # rows without errors: NaN, zeroed below
                off = np.nanquantile(err, levels, axis=1).T
        off[n < MIN_RESIDUALS] = 0.0
        out[:, j] = path[:, -1, j][:, None] + np.nan_to_num(off, nan=0.0)
    return np.sort(out, axis=-1)


@dataclass
class PathBaseline:
    """A baseline given by a path function; ``predict`` gives its forecast at the last position."""

    name: str
    path_fn: PathFn
    kwargs: dict
    residual_window: int = RESIDUAL_WINDOW

    def path(self, y: np.ndarray, leads: Sequence[int]) -> np.ndarray:
        """Point forecasts at every position: ``(B, T, H)``."""
        return self.path_fn(np.atleast_2d(y), tuple(leads), **self.kwargs)

    def predict(self, batch: ForecastInput) -> Forecast:
        y = batch.values
        path = self.path(y, batch.leads)
        q = last_position_quantiles(y, path, batch.leads, window=self.residual_window)
        return Forecast(point=path[:, -1], quantiles=q, leads=batch.leads)


def make_baseline(name: str, season_length: int = 24, window: int = 30, alpha: float = 0.3,
                  fit_length: int | None = None) -> PathBaseline:
    """Build a baseline by name (see :data:`BASELINES`)."""
    factories: dict[str, tuple[PathFn, dict]] = {
        "last_value": (last_value_path, {}),
        "seasonal_naive": (seasonal_naive_path, {"season_length": season_length}),
        "moving_average": (moving_average_path, {"window": window}),
        "moving_median": (moving_median_path, {"window": window}),
        "ewma": (ewma_path, {"alpha": alpha}),
        "ets": (ets_path, {"fit_length": fit_length}),
    }
    if name not in factories:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(factories)}")
    fn, kwargs = factories[name]
    return PathBaseline(name=name, path_fn=fn, kwargs=kwargs)


BASELINES = NAMED_BASELINES  # the names make_baseline knows (dprobe.core.names: read without pandas)
