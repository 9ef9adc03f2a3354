"""What the bundled traces allow: a strong learner of another family beside dprobe and the baselines.

dprobe's forecaster is scored against simple baselines. Where it does not beat them by much, is that
the model or the data? This script fits gradient-boosted quantile regression (LightGBM) globally on
each data set's series, with the forecaster's time split (forecasts that end before 60 % of a series
train, 60-70 % calibrates the p90 / p99, the last 30 % is scored exactly as ``dprobe evaluate`` scores
every method), in three variants:

- ``lightgbm``: the recent window's features (distance of the last value from recent medians, means
  and extremes, recent changes, spread, time since the last change, the value a season ago and a
  season before the target), the covariates the data set has (request rates; job counts and quota),
  and the time of day. A forecast, like dprobe's.
- ``lightgbm_future_covariates``: the same, also told the exogenous covariates' future values (the
  request rates at the target time and their mean up to it; a VC's quota). Not a forecast: an oracle
  for "the covariates lead the target", an upper bound on what forecasting them would add.
- ``lightgbm_fit_on_test``: fitted on every span, the scored one included, without calibration. Not
  a forecast either: a ceiling of what this family of models and features can fit at all.

It prints, per target and lead, each method's MAE and pinball loss over the best baseline's (last
value, seasonal naive, moving average / median, EWMA, ETS, as in ``dprobe evaluate``) beside the
forecaster issue's targets: pinball <= 0.80 everywhere, MAE <= 1.00 everywhere and <= 0.90 on duty
cycle at 15 and 30 steps.

    pip install -e '.[bench]'          # LightGBM, for this script only
    python benchmarks/forecast_headroom.py [--datasets NAME_OR_DIR ...] [--checkpoint CKPT] [--json]

About 5 minutes on 2 CPU cores for both bundled data sets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dprobe.core.conformal import conformal_shift  # noqa: E402
from dprobe.core.split import Split  # noqa: E402
from dprobe.data import SeriesDataset  # noqa: E402
from dprobe.evaluation.harness import EvalConfig, evaluate_dataset, train_overlap  # noqa: E402
from dprobe.evaluation.scoring import SeriesForecasts, against_baselines, score  # noqa: E402
from dprobe.forecaster.base import QUANTILES  # noqa: E402
from dprobe.forecaster.baselines import ffill  # noqa: E402

# Covariates whose future is not the target's own (the request rates a service receives; a VC's quota,
# set per day): the ones an oracle may be told ahead. Running and pending jobs are part of GPU demand.
EXOGENOUS = ("qps", "qps_api", "quota_gpus")
CONTEXT = 128  # steps of history the features read, as dprobe's forecaster
SPLIT = Split()  # the forecaster's split, whose test span dprobe evaluate scores
VARIANTS = ("lightgbm", "lightgbm_future_covariates", "lightgbm_fit_on_test")
# What the forecaster issue asks of dprobe against the best baseline of each row.
PINBALL_TARGET, MAE_TARGET, DUTY_MAE_TARGET = 0.80, 1.00, 0.90


def signed_log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def trailing_features(y: np.ndarray, cov: np.ndarray | None, cov_names: list[str], season: int,
                      floor: float) -> tuple[pd.DataFrame, dict[str, np.ndarray], np.ndarray]:
    """Features at every position ``t`` of one series from ``y[..t]`` and ``cov[..t]`` alone, in units of
    the window's scale and relative to the last observed value. Returns (features, anchors, scale): the
    anchors are the simple forecasts a model's output is added to (last value, 30-step median)."""
    s = pd.Series(ffill(y))
    last = s.to_numpy()
    scale = np.maximum(s.abs().rolling(CONTEXT, min_periods=1).mean().to_numpy(), floor)
    f: dict[str, np.ndarray] = {"log_scale": np.log(scale)}
    for w in (5, 30, CONTEXT):
        r = s.rolling(w, min_periods=1)
        f[f"median{w}"] = (r.median().to_numpy() - last) / scale
        f[f"mean{w}"] = (r.mean().to_numpy() - last) / scale
        f[f"std{w}"] = r.std().to_numpy() / scale
    for w in (30, CONTEXT):
        r = s.rolling(w, min_periods=1)
        f[f"max{w}"] = (r.max().to_numpy() - last) / scale
        f[f"min{w}"] = (r.min().to_numpy() - last) / scale
    for k in (1, 3, 6, 12, 24):
        f[f"change{k}"] = (last - s.shift(k).to_numpy()) / scale
    pos = np.arange(len(y), dtype=np.float64)
    changed = np.r_[True, np.diff(last) != 0]
    since = pos - pd.Series(np.where(changed, pos, np.nan)).ffill().to_numpy()
    f["steps_since_change"] = np.minimum(since, CONTEXT)
    f["season_ago"] = (s.shift(season).to_numpy() - last) / scale
    for j, name in enumerate(cov_names):
        x = pd.Series(signed_log(ffill(cov[:, j])))
        f[name] = x.to_numpy()
        f[f"{name}_mean5"] = x.rolling(5, min_periods=1).mean().to_numpy()
        f[f"{name}_mean30"] = x.rolling(30, min_periods=1).mean().to_numpy()
        f[f"{name}_trend"] = f[f"{name}_mean5"] - f[f"{name}_mean30"]
    anchors = {"last_value": last, "moving_median": s.rolling(30, min_periods=1).median().to_numpy()}
    return pd.DataFrame(f), anchors, scale


def lead_features(base: pd.DataFrame, y: np.ndarray, cov: np.ndarray | None, cov_names: list[str],
                  last: np.ndarray, scale: np.ndarray, season: int, lead: int, future: bool) -> pd.DataFrame:
    """``base`` plus what depends on the lead: the value a season before the target (when that is in the
    past) and, with ``future``, the exogenous covariates' values up to the target time (the oracle)."""
    out = base.copy()
    if lead <= season:
        out["season_before_target"] = (pd.Series(ffill(y)).shift(season - lead).to_numpy() - last) / scale
    if future:
        for j, name in enumerate(cov_names):
            if name not in EXOGENOUS:
                continue
            x = pd.Series(signed_log(ffill(cov[:, j])))
            out[f"{name}_at_target"] = x.shift(-lead).to_numpy()
            out[f"{name}_mean_to_target"] = x.rolling(lead, min_periods=1).mean().shift(-lead).to_numpy()
            out[f"{name}_ahead"] = out[f"{name}_mean_to_target"] - base[f"{name}_mean30"]
    return out


def time_of_day(ds: SeriesDataset) -> dict[str, np.ndarray]:
    return {uid: ((g["ds"].dt.hour * 60 + g["ds"].dt.minute) / 1440.0).to_numpy()
            for uid, g in ds.frame.groupby("unique_id", sort=True)}


def fit_quantiles(x: pd.DataFrame, z: np.ndarray, weight: np.ndarray, rounds: int, threads: int) -> list:
    """One LightGBM quantile regression per level of :data:`QUANTILES` of ``z`` (in window scales), each row
    weighted by its scale: the loss is then the one scored, in the target's own units."""
    import lightgbm as lgb

    params = dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=200, bagging_fraction=0.8, bagging_freq=1,
                  feature_fraction=0.8, seed=0, deterministic=True, force_row_wise=True, verbose=-1,
                  num_threads=threads)
    return [lgb.train({**params, "objective": "quantile", "alpha": q}, lgb.Dataset(x, z, weight=weight / weight.mean()),
                      num_boost_round=rounds)
            for q in QUANTILES]


def series_features(ds: SeriesDataset, series: dict[str, np.ndarray]) -> dict[str, tuple]:
    """Per series of one target: (trailing features with the time of day, anchors, scale, covariates), the
    same for every variant."""
    covs_all = ds.covariate_arrays()
    tod = time_of_day(ds)
    floor = 0.01 * float(np.nanmean([np.nanmean(np.abs(y)) for y in series.values()]))
    frames = {}
    for uid, y in series.items():
        cov = covs_all.get(uid)
        base, anchors, scale = trailing_features(y, cov, ds.covariates, ds.season_length, floor)
        base["time_of_day"] = tod[uid]
        frames[uid] = (base, anchors, scale, cov)
    return frames


def reference_forecasts(ds: SeriesDataset, series: dict[str, np.ndarray], test_start: dict[str, int], variant: str,
                        rounds: int, threads: int, max_rows: int, bar=None,
                        frames: dict[str, tuple] | None = None) -> dict[str, SeriesForecasts]:
    """``variant``'s forecasts of a target's ``series`` at the harness's origins (``test_start`` on);
    ``frames``: :func:`series_features` of ``series``, when already computed for another variant."""
    frames = frames if frames is not None else series_features(ds, series)
    future = variant == "lightgbm_future_covariates"
    leads = ds.lead_steps
    per_lead = []
    for h in leads:
        feats = {uid: lead_features(b, series[uid], cov, ds.covariates, a["last_value"], sc, ds.season_length, h,
                                    future) for uid, (b, a, sc, cov) in frames.items()}
        spans: dict[str, dict[str, np.ndarray]] = {}
        for uid, y in series.items():
            n, last = len(y), frames[uid][1]["last_value"]
            t = np.arange(n - h)
            ok = ~np.isnan(y[t + h]) & ~np.isnan(last[t])
            if variant == "lightgbm_fit_on_test":
                spans[uid] = {"train": t[ok]}
            else:
                train, valid = SPLIT.fit_origins(t[ok], n, h)
                spans[uid] = {"train": train, "valid": valid}
        # the anchor with the lower MAE on the calibration span (the training span without one), as
        # dprobe's point forecast is chosen on its validation span
        choose_on = "valid" if "valid" in next(iter(spans.values())) else "train"
        errors = {name: sum(float(np.abs(series[u][sp[choose_on] + h] - frames[u][1][name][sp[choose_on]]).sum())
                            for u, sp in spans.items())
                  for name in frames[next(iter(series))][1]}
        anchor = min(errors, key=errors.get)
        parts = {"train": [], "valid": []}
        for uid, sp in spans.items():
            y, (_, anchors, sc, _) = series[uid], frames[uid]
            for part, idx in sp.items():
                parts[part].append((feats[uid].iloc[idx], (y[idx + h] - anchors[anchor][idx]) / sc[idx], sc[idx]))
        x = pd.concat([p[0] for p in parts["train"]], ignore_index=True)
        z = np.concatenate([p[1] for p in parts["train"]])
        w = np.concatenate([p[2] for p in parts["train"]])
        if len(z) > max_rows:  # a fixed random subset, to bound the time on long series
            pick = np.sort(np.random.default_rng(0).choice(len(z), max_rows, replace=False))
            x, z, w = x.iloc[pick], z[pick], w[pick]
        models = fit_quantiles(x, z, w, rounds, threads)
        shifts = np.zeros(len(QUANTILES))
        if parts["valid"]:
            xv = pd.concat([p[0] for p in parts["valid"]], ignore_index=True)
            zv = np.concatenate([p[1] for p in parts["valid"]])
            for k, q in enumerate(QUANTILES):
                if q > 0.5:  # the upper quantiles are shifted to cover their level of the calibration span
                    shifts[k] = conformal_shift(zv - models[k].predict(xv), q)
        per_lead.append((feats, anchor, models, shifts))
        if bar is not None:
            bar.update(1)
    out = {}
    for uid, y in series.items():
        _, anchors, sc, _ = frames[uid]
        origins = np.arange(test_start[uid], len(y) - min(leads))
        q = np.empty((len(origins), len(leads), len(QUANTILES)))
        for j, (feats, anchor, models, shifts) in enumerate(per_lead):
            x = feats[uid].iloc[origins]
            z = np.stack([m.predict(x) for m in models], axis=1) + shifts
            q[:, j] = anchors[anchor][origins, None] + sc[origins, None] * np.sort(z, axis=1)
        out[uid] = SeriesForecasts(origins=origins, point=q[:, :, 0].copy(), quantiles=q)
    return out


def ratios(rows: list[dict], methods: list[str], baselines: list[str]) -> list[dict]:
    """Per target and lead: each method's MAE and pinball over the best baseline's on that row (the short
    answer of ``dprobe evaluate``, :func:`against_baselines`, of each method against the baselines alone)."""
    per = {m: {(e["target"], e["lead_steps"]): e
               for e in against_baselines([r for r in rows if r["method"] in {*baselines, m}], m)} for m in methods}
    out = []
    for key in sorted({(r["target"], r["lead_steps"]) for r in rows}):
        mine = {m: per[m][key] for m in methods if key in per[m]}
        if not mine:
            continue
        first = next(iter(mine.values()))
        entry = {"target": key[0], "lead_steps": key[1], "best_mae": first["best_mae"],
                 "best_pinball": first["best_pinball"]}
        for m, e in mine.items():
            entry[m] = {k: e[k] for k in ("mae_ratio", "pinball_ratio", "coverage_p90", "coverage_p99")}
        out.append(entry)
    return out


def print_table(name: str, table: list[dict], methods: list[str]) -> None:
    short = {"dprobe": "dprobe", "lightgbm": "lgbm", "lightgbm_future_covariates": "lgbm+future",
             "lightgbm_fit_on_test": "lgbm fit-on-test"}
    print(f"\n{name}: MAE and pinball over the best baseline's (below 1 beats it)")
    head = " ".join(f"{short[m]:>17}" for m in methods)
    print(f"{'target':<20} {'lead':>4} {'ratio':<8} {head}   target")
    for e in table:
        duty = e["target"] == "gpu_duty_cycle_pct" and e["lead_steps"] in (15, 30)
        for kind, goal in (("mae", DUTY_MAE_TARGET if duty else MAE_TARGET), ("pinball", PINBALL_TARGET)):
            cells = " ".join(f"{e[m][kind + '_ratio']:>17.3f}" if m in e else f"{'-':>17}" for m in methods)
            label = f"{kind} ({e['best_' + kind]})"
            print(f"{e['target'] if kind == 'mae' else '':<20} {e['lead_steps'] if kind == 'mae' else '':>4} "
                  f"{label:<8} {cells}   <= {goal:.2f}")


def target_lines(table: list[dict], methods: list[str]) -> list[str]:
    """A PASS / MISS line per row and ratio for the first method (dprobe) against the issue's target, with
    the best the forecasts, the oracle and the ceiling reached there."""
    lines = []
    for e in table:
        if methods[0] not in e:
            continue
        duty = e["target"] == "gpu_duty_cycle_pct" and e["lead_steps"] in (15, 30)
        for kind, goal in (("mae", DUTY_MAE_TARGET if duty else MAE_TARGET), ("pinball", PINBALL_TARGET)):
            mine = e[methods[0]][f"{kind}_ratio"]
            reached = ", ".join(f"{m} {e[m][f'{kind}_ratio']:.3f}" for m in methods[1:] if m in e)
            lines.append(f"{'PASS' if mine <= goal else 'MISS'} {e['target']} lead {e['lead_steps']} {kind}: "
                         f"{methods[0]} {mine:.3f}, target <= {goal:.2f} ({reached})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["alibaba-genai-2026", "helios-earth-vc"],
                        help="bundled data set names or directories laid out like them (default: both bundled)")
    parser.add_argument("--checkpoint", default="dprobe",
                        help="the forecaster scored beside them: 'dprobe' (the shipped one, default), a "
                             "dprobe.pt / dprobe.onnx, or 'none'")
    parser.add_argument("--rounds", type=int, default=300, help="boosting rounds per quantile (default 300)")
    parser.add_argument("--max-rows", type=int, default=150_000,
                        help="training rows per lead at most, a fixed random subset beyond (default 150000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args()
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        parser.error("this benchmark needs LightGBM: pip install -e '.[bench]'")

    from tqdm.auto import tqdm

    from dprobe.core.workers import available_cores
    from dprobe.data.registry import bundled_dir, load_series_dataset
    from dprobe.forecaster.loading import checkpoint_path, load_forecaster

    try:  # bad input stops here, before any work, with what is wrong
        models = {} if args.checkpoint == "none" else {"dprobe": load_forecaster(checkpoint_path(args.checkpoint))}
        if models and (overlap := train_overlap(models["dprobe"], SPLIT)):  # scored on windows it has seen
            raise ValueError(f"{args.checkpoint} {overlap}")
        datasets = [load_series_dataset(Path(spec) if Path(spec).is_dir() else bundled_dir(spec))
                    for spec in args.datasets]
    except (OSError, ValueError) as exc:  # missing files, DatasetError, CheckpointError
        parser.error(str(exc))
    threads = available_cores()
    cfg = EvalConfig(split=SPLIT, progress=False)
    methods = [*models, *VARIANTS]
    report = []
    for ds in datasets:
        t0 = time.perf_counter()
        result = evaluate_dataset(ds, models=models, cfg=cfg)
        rows = list(result.rows)
        fits = len(ds.targets) * len(VARIANTS) * len(ds.lead_steps)
        with tqdm(total=fits, desc=f"{ds.name}: LightGBM fits", disable=args.json, leave=False) as bar:
            for target in ds.targets:
                series = result.actuals.get(target)
                if not series:
                    continue
                starts = {u: result.test_start[f"{target}/{u}"] for u in series}
                frames = series_features(ds, series)
                for variant in VARIANTS:
                    per = reference_forecasts(ds, series, starts, variant, args.rounds, threads, args.max_rows, bar,
                                              frames)
                    rows.extend(score(variant, target, ds, per, series, starts))
        table = ratios(rows, methods, list(cfg.baselines))
        report.append({"dataset": ds.name, "rows": rows, "ratios": table,
                       "seconds": round(time.perf_counter() - t0, 1)})
        if not args.json:
            print_table(ds.name, table, methods)
            print("\n".join(target_lines(table, methods)))
            print(f"({report[-1]['seconds']:.0f} s)")
    if args.json:
        json.dump(report, sys.stdout, indent=1, default=float)
        print()


if __name__ == "__main__":
    main()
