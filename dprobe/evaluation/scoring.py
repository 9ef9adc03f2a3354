"""What an evaluation scores and keeps: each method's forecasts of a series (:class:`SeriesForecasts`), the
rows :func:`score` makes of them, the whole result (:class:`EvalResult`) and the comparison of a method with
the best other (:func:`against_baselines`). Shared by the rolling-origin harness, the whole-job evaluation
(:mod:`.jobs`) and the reports (:mod:`.report`), and importing none of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dprobe.core import metrics
from dprobe.data import SeriesDataset
from dprobe.forecaster.base import QUANTILES


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

        rows = [{k: clean(v) for k, v in r.items()} for r in self.rows]
        summary = [{k: clean(v) for k, v in r.items()} for r in against_baselines(rows)]
        return {"dataset": self.dataset, "rows": rows, "against_baselines": summary, "seconds": self.seconds}


def score(method: str, target: str, ds: SeriesDataset, per_series: dict[str, SeriesForecasts],
          series: dict[str, np.ndarray], test_start: dict[str, int]) -> list[dict]:
    """The report's rows (one per lead) for ``method``'s forecasts of ``target`` at each series' origins:
    MAE, MASE (scaled on the series before ``test_start``), pinball loss and coverage, over the origins
    whose target is observed. What :func:`~.harness.evaluate_dataset` reports for every method it runs, and how a
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
               "horizon_seconds": h * ds.freq.total_seconds(),
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


def against_baselines(rows: list[dict], method: str = "dprobe") -> list[dict]:
    """Per target and lead where ``method`` was scored: its MAE and pinball loss over the best other
    method's on that row (``mae_ratio``, ``pinball_ratio``; None where there is nothing to compare),
    which methods those are (``best_mae``, ``best_pinball``), and its coverage."""
    out = []
    for key in sorted({(r["target"], r["lead_steps"]) for r in rows if r["method"] == method}):
        group = [r for r in rows if (r["target"], r["lead_steps"]) == key]
        mine = next(r for r in group if r["method"] == method)
        others = [r for r in group if r["method"] != method]
        by_mae = min((r for r in others if r["mae"] is not None), key=lambda r: r["mae"], default=None)
        by_pin = min((r for r in others if r["pinball"] is not None), key=lambda r: r["pinball"], default=None)

        def ratio(value: float | None, best: float | None) -> float | None:
            return None if value is None or not best else value / best

        out.append({"target": key[0], "lead_steps": key[1],
                    "mae_ratio": ratio(mine["mae"], by_mae["mae"] if by_mae else None),
                    "best_mae": by_mae["method"] if by_mae else None,
                    "pinball_ratio": ratio(mine["pinball"], by_pin["pinball"] if by_pin else None),
                    "best_pinball": by_pin["method"] if by_pin else None,
                    "coverage_p90": mine.get("coverage_p90"), "coverage_p99": mine.get("coverage_p99")})
    return out
