"""Rolling-origin evaluation over the last part of each series, at fixed lead times.

For each series and each lead h, every position t of the test span (from the
:class:`~dprobe.core.split.Split`'s test start on, origins where ``t + h`` is still inside the
series and observed) is a forecast origin: the method sees ``y[..t]`` and
forecasts ``y[t + h]``. Baselines are computed as forecast paths over the
whole series (see :mod:`dprobe.forecaster.baselines`), with quantiles from
their own errors already realised at t. Forecasters such as the trained model
are called on windows ending at each origin, in batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tqdm.auto import tqdm

from dprobe.core.split import Split
from dprobe.data import SeriesDataset
from dprobe.evaluation.jobs import evaluate_jobs
from dprobe.evaluation.scoring import EvalResult, SeriesForecasts
from dprobe.forecaster.base import Forecaster, ForecastInput
from dprobe.forecaster.baselines import PathBaseline, conformal_quantiles, make_baseline

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    split: Split = Split()  # where each series' test span starts (a checkpoint's own: its ``split``)
    baselines: Sequence[str] = ("last_value", "seasonal_naive", "moving_average", "moving_median", "ewma", "ets")
    window: int = 30  # moving average / median window (steps)
    alpha: float = 0.3  # EWMA smoothing
    min_length: int = 100  # shorter series are skipped
    batch_size: int = 4096  # windows per forecaster call
    progress: bool = True


def _baseline_for(name: str, ds: SeriesDataset, cfg: EvalConfig, test_start: int) -> PathBaseline:
    return make_baseline(name, season_length=ds.season_length, window=cfg.window, alpha=cfg.alpha,
                         fit_length=test_start)


def _baseline_forecasts(b: PathBaseline, y: np.ndarray, leads: tuple[int, ...],
                        origins: np.ndarray) -> SeriesForecasts:
    path = b.path(y[None], leads)
    q = conformal_quantiles(y[None], path, leads, window=b.residual_window, positions=origins)[0]
    return SeriesForecasts(origins=origins, point=path[0, origins], quantiles=q)


def _model_forecasts(model: Forecaster, ds: SeriesDataset, target: str, series: dict[str, np.ndarray],
                     covs: dict[str, np.ndarray], origins: dict[str, np.ndarray],
                     batch_size: int, graphs: dict[str, Any] | None = None) -> dict[str, SeriesForecasts]:
    """Call ``model`` on the windows ending at each origin, one series at a time in batches.

    Windows are strided views of the series (no copy), so memory stays bounded by one batch.
    """
    context = int(getattr(model, "context_length", 256))
    out = {}
    for uid, y in series.items():
        o = origins[uid]
        windows = sliding_window_view(np.concatenate([np.full(context - 1, np.nan), y]), context)
        cov_windows = None
        if covs:
            c = covs[uid]
            padded = np.concatenate([np.full((context - 1, c.shape[1]), np.nan), c])
            cov_windows = sliding_window_view(padded, context, axis=0).transpose(0, 2, 1)  # (T, L, C)
        points, quants = [], []
        for s in range(0, len(o), batch_size):
            idx = o[s : s + batch_size]
            graph = (graphs or {}).get(uid)
            f = model.predict(ForecastInput(values=windows[idx], metric=target, leads=ds.lead_steps,
                                            step_seconds=ds.freq.total_seconds(),
                                            covariates=None if cov_windows is None else cov_windows[idx],
                                            graphs=[graph] * len(idx) if graph is not None else None))
            points.append(f.point)
            quants.append(f.quantiles)
        out[uid] = SeriesForecasts(origins=o, point=np.concatenate(points), quantiles=np.concatenate(quants))
    return out


def train_overlap(forecaster: Forecaster, split: Split) -> str | None:
    """Why scoring ``forecaster`` on ``split``'s test span would count windows it was trained or calibrated on
    (the split its checkpoint records ends later), or None (a baseline records none: it fits nothing ahead)."""
    trained: Split | None = getattr(forecaster, "split", None)
    if trained is None or not trained.reaches_into(split):
        return None
    return (f"was trained and calibrated on the first {100 * trained.test_start:g} % of each series, and the "
            f"test span starts at {100 * split.test_start:g} %")


def evaluate_dataset(ds: SeriesDataset, models: dict[str, Forecaster] | None = None,
                     cfg: EvalConfig | None = None,
                     on_method: Callable[[str, float], None] | None = None,
                     graphs: dict[str, Any] | None = None) -> EvalResult:
    """Score every baseline in ``cfg.baselines`` and every forecaster in ``models`` on ``ds``.

    ``graphs``: series id -> model graph (a directory's ``workloads.csv``), given to the models. A data set of
    whole jobs (split by family) is scored by :func:`dprobe.evaluation.jobs.evaluate_jobs` instead.
    """
    cfg = cfg or EvalConfig()
    models = models or {}
    if ds.groups is not None:  # whole jobs (h200-profiles): the test families' runs, persistence as the baseline
        return evaluate_jobs(ds, models, cfg.split, graphs, on_method)
    result = EvalResult(dataset=ds.name, rows=[])
    covs_all = ds.covariate_arrays()
    methods = [*cfg.baselines, *models]
    for target in ds.targets:
        series = {u: y for u, y in ds.arrays(target).items()
                  if np.sum(~np.isnan(y)) >= cfg.min_length and len(y) > cfg.min_length}
        if not series:
            log.warning("%s/%s: no series with at least %d points", ds.name, target, cfg.min_length)
            continue
        starts = {u: cfg.split.test_index(len(y)) for u, y in series.items()}
        origins = {u: np.arange(starts[u], len(y) - min(ds.lead_steps)) for u, y in series.items()}
        result.actuals[target] = series
        result.test_start.update({f"{target}/{u}": s for u, s in starts.items()})
        bar = tqdm(methods, desc=f"{ds.name}/{target}", disable=not cfg.progress, leave=False)
        for method in bar:
            bar.set_postfix_str(method)
            t0 = time.perf_counter()
            if method in models:
                per = _model_forecasts(models[method], ds, target, series,
                                       {u: covs_all[u] for u in series} if covs_all else {}, origins,
                                       cfg.batch_size, graphs)
            else:
                per = {u: _baseline_forecasts(_baseline_for(method, ds, cfg, starts[u]), y, ds.lead_steps,
                                              origins[u]) for u, y in series.items()}
            elapsed = time.perf_counter() - t0
            result.record(method, target, ds, per, series, starts, elapsed)
            if on_method:
                on_method(method, elapsed)
    return result
