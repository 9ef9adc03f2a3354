"""Window normalisation shared by training and inference.

A window of one metric is expressed relative to its last observed value and
scaled by its mean absolute level (floored per task, so an idle window does
not blow up a later spike): ``x = (v - last) / scale``. Forecasts are made in
the same units and mapped back with ``last + scale * x``. A forecast of 0 is
the last-value forecast.
"""

from __future__ import annotations

import warnings

import numpy as np

N_COVARIATES = 4  # covariates are zero-padded (or cut) to this many channels
N_STATS = 12  # summary statistics of the window, see window_stats
# the point forecasts chosen between per task and lead on validation: the network's p50 held within the
# simple forecasts (all of them, or only the recent ones: see within_candidates), or a simple forecast
# itself (the columns of candidate_points)
SIMPLE_POINTS = ("last_value", "median_5", "median_30", "mean_30", "ewma")
RECENT_POINTS = ("last_value", "median_5", "ewma")
MODEL_POINTS = ("model", "model_recent")
POINT_CANDIDATES = MODEL_POINTS + SIMPLE_POINTS
# what the window's last steps did; the point forecast is chosen, and the quantiles calibrated, per regime:
# the last step changed the value, an earlier one of the last RECENT_STEPS did, or none did
REGIMES = ("moved", "recent", "held")
RECENT_STEPS = 6  # about the shortest lead of the bundled tasks (5 and 6 steps)


def last_observed(values: np.ndarray) -> np.ndarray:
    """Last non-NaN value of each row (0 where a row has none)."""
    observed = ~np.isnan(values)
    idx = values.shape[1] - 1 - np.argmax(observed[:, ::-1], axis=1)
    last = values[np.arange(len(values)), idx]
    return np.where(observed.any(axis=1), last, 0.0)


def window_scale(values: np.ndarray, floor: float) -> np.ndarray:
    """Mean absolute value of each row, at least ``floor``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-gap rows: NaN, floored below
        level = np.nanmean(np.abs(values), axis=1)
    return np.maximum(np.nan_to_num(level, nan=0.0), floor)


def nanmedian_rows(a: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN for an all-NaN row); faster than ``np.nanmedian`` on small rows."""
    srt = np.sort(a, axis=1)  # NaN sort last
    n = (~np.isnan(a)).sum(axis=1)
    lo = np.take_along_axis(srt, np.maximum((n - 1) // 2, 0)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(srt, np.maximum(n // 2, 0)[:, None], axis=1)[:, 0]
    return np.where(n > 0, 0.5 * (lo + hi), np.nan)


def _recent_forecasts(x: np.ndarray) -> list[np.ndarray]:
    """Median of the last 5 and 30 steps, mean of the last 30, EWMA(0.2) of a window ``(B, L)`` (NaN at gaps)."""
    recent = x[:, -30:]
    decay = 0.8 ** np.arange(x.shape[1])[::-1]  # EWMA(0.2) weights, newest = 1
    w = ~np.isnan(x) * decay
    ewma = np.nansum(np.nan_to_num(x) * w, axis=1) / np.maximum(w.sum(axis=1), 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-gap windows give NaN
        return [nanmedian_rows(x[:, -5:]), nanmedian_rows(recent), np.nanmean(recent, axis=1), ewma]


def window_stats(x: np.ndarray, last: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Summary statistics of a normalised window ``(B, L)`` (NaN at gaps) -> ``(B, N_STATS)``.

    The simple forecasts a user would try (medians and means of the recent
    past, an exponentially weighted mean, extremes) in window units, so the
    network's heads can start from the best of them and learn the rest.
    Clipped to +-50 window units: they are network inputs.
    """
    recent = x[:, -30:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-gap windows give NaN, set to 0 below
        stats = np.stack([
            *_recent_forecasts(x),
            np.nanmean(x, axis=1),
            np.nanmin(recent, axis=1),
            np.nanmax(recent, axis=1),
            np.nanstd(recent, axis=1),
            np.mean(~np.isnan(recent), axis=1),
            np.log10(np.maximum(scale, 1e-12)) / 10.0,
            last / scale,
            nanmedian_rows(x),
        ], axis=1)
    return np.clip(np.nan_to_num(stats, nan=0.0), -50, 50).astype(np.float32)


def candidate_points(values: np.ndarray, last: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(B, L)`` raw window -> ``(B, C)``: the simple point forecasts of :data:`SIMPLE_POINTS`, in
    window units and *unclipped* (a median is a median, however far from the last value).

    Gaps are forward-filled first, as the baselines of :mod:`dprobe.forecaster.baselines` do, so that
    a chosen ``median_30`` is exactly the 30-step moving median the evaluation compares against.
    """
    from dprobe.forecaster.baselines import ffill

    x = (ffill(values) - last[:, None]) / scale[:, None]
    simple = dict(zip(["median_5", "median_30", "mean_30", "ewma"], _recent_forecasts(x), strict=True))
    cols = [np.zeros(len(x)) if name == "last_value" else simple[name] for name in SIMPLE_POINTS]
    return np.nan_to_num(np.stack(cols, axis=1), nan=0.0)


def within_candidates(p50: np.ndarray, cands: np.ndarray, recent: bool = False) -> np.ndarray:
    """The model's ``p50`` ``(B, H)`` held within the range of the simple forecasts ``(B, C)`` of the
    same window (:func:`candidate_points`; the last value is 0 in window units); with ``recent``,
    of the recent ones only (:data:`RECENT_POINTS`: last value, 5-step median, EWMA).

    In a flat window every simple forecast is the last value, and so is the model's point; elsewhere
    the network picks a level between them but does not invent one beyond them. On the bundled
    series this lowers the network's p50 error at every lead, on validation and on test.
    """
    if recent:
        cands = cands[:, [SIMPLE_POINTS.index(name) for name in RECENT_POINTS]]
    lo = np.minimum(cands.min(axis=1), 0.0)[:, None]
    hi = np.maximum(cands.max(axis=1), 0.0)[:, None]
    return np.clip(p50, lo, hi)


def window_regime(values: np.ndarray) -> np.ndarray:
    """``(B, L)`` raw window (NaN at gaps) -> ``(B,)`` index into :data:`REGIMES`, gaps forward-filled as
    the baselines see them: 0 (``moved``) where the last step changed the value, 1 (``recent``) where an
    earlier one of the last :data:`RECENT_STEPS` did, 2 (``held``) where none did."""
    from dprobe.forecaster.baselines import ffill

    values = np.asarray(values, dtype=np.float64)
    tail = ffill(values[:, -min(values.shape[1], 64):])  # a gap longer than this is a gap: held
    changed = np.diff(tail, axis=1)[:, -RECENT_STEPS:]
    changed = ~np.isnan(changed) & (changed != 0)  # (B, <= RECENT_STEPS), the last step last
    if not changed.shape[1]:
        return np.full(len(values), REGIMES.index("held"), dtype=np.int64)
    return np.where(changed[:, -1], 0, np.where(changed.any(axis=1), 1, 2)).astype(np.int64)


def served_point(p50: np.ndarray, cands: np.ndarray, sources: list, regime: np.ndarray | None = None
                 ) -> np.ndarray:
    """The point forecast served per lead: the model's ``p50`` ``(B, H)`` held within the simple
    forecasts (:func:`within_candidates`; within the recent ones where ``sources`` says
    ``model_recent``) or, where ``sources`` names a simple forecast, that column of ``cands``
    ``(B, C)`` (:func:`candidate_points`). A lead's source may be a list, one per regime of
    :data:`REGIMES`; ``regime`` ``(B,)`` (:func:`window_regime`) then picks it per window."""
    p50 = np.asarray(p50, dtype=np.float64)
    if regime is None and not all(isinstance(c, str) for c in sources):
        raise ValueError("point sources per regime need the windows' regimes")
    point = within_candidates(p50, cands)
    for j, choice in enumerate(sources):
        names = [choice] if isinstance(choice, str) else list(choice)
        for r, source in enumerate(names):
            rows = slice(None) if len(names) == 1 else (regime == r)
            if source == "model_recent":
                point[rows, j] = within_candidates(p50[rows, j : j + 1], cands[rows], recent=True)[:, 0]
            elif source != "model":
                point[rows, j] = cands[rows, SIMPLE_POINTS.index(source)]
    return point


def make_features(values: np.ndarray, covariates: np.ndarray | None, floor: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(B, L)`` values (+ ``(B, L, C)`` covariates) -> features ``(B, L, 2 + N_COVARIATES)``, stats, last, scale.

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
    return feats, window_stats(x, last, scale), last, scale


def window_change(x: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Mean absolute step-to-step change of each normalised window ``(B, L)`` over its observed
    neighbours (``observed`` ``(B, L)``, 0 / 1): how busy the window is, in window units (0 if flat)."""
    both = (observed[:, 1:] > 0) & (observed[:, :-1] > 0)
    steps = np.abs(np.diff(x, axis=1)) * both
    return steps.sum(axis=1) / np.maximum(both.sum(axis=1), 1)


def change_factor(change: np.ndarray, typical: float, calm_weight: float) -> np.ndarray:
    """Loss weight of windows by their :func:`window_change`: ``typical / change``, so a window twice as
    busy as the typical one counts half, capped at ``calm_weight`` for calm and flat windows."""
    return typical / np.maximum(change, typical / calm_weight)


def normalise_targets(targets: np.ndarray, last: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(B, H)`` future values in window units (NaN kept: masked out of the loss)."""
    return (targets - last[:, None]) / scale[:, None]
