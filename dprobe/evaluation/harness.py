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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tqdm.auto import tqdm

from dprobe.core import metrics
from dprobe.core.split import Split
from dprobe.data import SeriesDataset
from dprobe.forecaster.base import QUANTILES, Forecaster, ForecastInput
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


@dataclass
class SeriesForecasts:
    """What one method forecast for one series and metric at every test origin."""

    origins: np.ndarray  # (N,) positions t
    point: np.ndarray  # (N, H)
    quantiles: np.ndarray | None  # (N, H, Q)


@dataclass
class EvalResult:
    dataset: str
    rows: list[dict]
    seconds: dict[str, float] = field(default_factory=dict)
    # kept for plotting: method -> metric -> series id -> forecasts
    forecasts: dict[str, dict[str, dict[str, SeriesForecasts]]] = field(default_factory=dict)
    actuals: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    test_start: dict[str, int] = field(default_factory=dict)

    def record(self, method: str, target: str, ds: SeriesDataset, per_series: dict[str, SeriesForecasts],
               series: dict[str, np.ndarray], test_start: dict[str, int], seconds: float) -> None:
        """Keep ``method``'s forecasts of ``target``, its time, and the rows :func:`score` makes of them."""
        self.seconds[method] = self.seconds.get(method, 0.0) + seconds
        self.forecasts.setdefault(method, {})[target] = per_series
        self.rows.extend(score(method, target, ds, per_series, series, test_start))

    def to_json(self) -> dict:
        """Strict-JSON ready: NaN or infinite figures (e.g. MASE of series that never move) become None."""
        def clean(v: object) -> object:
            return None if isinstance(v, float) and not np.isfinite(v) else v

        from dprobe.evaluation.report import against_baselines  # the report module imports this one

        rows = [{k: clean(v) for k, v in r.items()} for r in self.rows]
        summary = [{k: clean(v) for k, v in r.items()} for r in against_baselines(rows)]
        return {"dataset": self.dataset, "rows": rows, "against_baselines": summary, "seconds": self.seconds}


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


def score(method: str, target: str, ds: SeriesDataset, per_series: dict[str, SeriesForecasts],
          series: dict[str, np.ndarray], test_start: dict[str, int]) -> list[dict]:
    """The report's rows (one per lead) for ``method``'s forecasts of ``target`` at each series' origins:
    MAE, MASE (scaled on the series before ``test_start``), pinball loss and coverage, over the origins
    whose target is observed. What :func:`evaluate_dataset` reports for every method it runs, and how a
    forecaster that is not a window model (``benchmarks/forecast_headroom.py``) is scored the same way."""
    rows = []
    for j, h in enumerate(ds.lead_steps):
        act, pt, qs, mases = [], [], [], []
        for uid, f in per_series.items():
            y = series[uid]
            t = f.origins
            keep = t + h < len(y)
            t = t[keep]
            a = y[t + h]
            ok = ~np.isnan(a) & ~np.isnan(f.point[keep, j])
            if not ok.any():
                continue
            act.append(a[ok])
            pt.append(f.point[keep, j][ok])
            if f.quantiles is not None:
                qs.append(f.quantiles[keep, j][ok])
            scale = metrics.mase_scale(y[: test_start[uid]])
            if not np.isnan(scale):
                mases.append(metrics.mae(a[ok], f.point[keep, j][ok]) / scale)
        if not act:
            continue
        a, p = np.concatenate(act), np.concatenate(pt)
        row = {"method": method, "target": target, "lead_steps": h,
               "lead_seconds": h * ds.freq.total_seconds(),
               "mae": metrics.mae(a, p), "mase": float(np.mean(mases)) if mases else None,
               "pinball": None, "coverage_p90": None, "coverage_p99": None, "n_forecasts": len(a),
               "n_series": len(act)}
        if qs:
            q = np.concatenate(qs)
            row["pinball"] = metrics.pinball(a, q, QUANTILES)
            row["coverage_p90"] = metrics.coverage(a, q[:, QUANTILES.index(0.9)])
            row["coverage_p99"] = metrics.coverage(a, q[:, QUANTILES.index(0.99)])
        rows.append(row)
    return rows


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
        from dprobe.evaluation.jobs import evaluate_jobs

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
