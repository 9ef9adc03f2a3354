"""Fit the bucket model (:mod:`.buckets`) per measured cluster, score it leave-one-model-out beside the
visible-median baseline (:mod:`.baseline`) and decide where it ships as the default.

Per cluster (a software and hardware stack), only what the data cannot give is fitted: the bandwidth the
intra-node and inter-node links reach and the latency of a ring hop (least squares on the log ratio of
predicted to measured step time, and of sync time where measured, each model weighing the same, soft L1).

The default (:func:`choose_methods`): on each cluster and side (one node, several nodes), the bucket model
runs where it beat the visible-median baseline on *every* left-out model with rows there, in step MAPE and
(where measured) sync MAPE; else the earlier exponential model (:mod:`.model`) where it did; elsewhere the
baseline runs. A cluster never measured has no baseline: the
bucket model runs on its links' nominal bandwidths times the efficiency the measured clusters reach.

``python -m dprobe.profiling.dataparallel.bucket_fit [--write]`` refits on the bundled data and writes
``_buckets_fitted.py`` (what ``dprobe predict --gpus`` reads; the data sets are never read at run time).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dprobe.profiling.dataparallel.baseline import fit_baseline, predict_baseline
from dprobe.profiling.dataparallel.buckets import BACKWARD_SHARE, LinkParams, exposed_seconds
from dprobe.profiling.dataparallel.fit import write_module
from dprobe.profiling.dataparallel.interconnect import MEASURED, measured_links

FITTED_MODULE = Path(__file__).with_name("_buckets_fitted.py")
EPS_SYNC = 1e-3  # s: sync times this small count as equal in the loss
BOUNDS = {"intra_bandwidth": (1e7, 1e13), "inter_bandwidth": (1e7, 1e13), "latency": (1e-6, 2e-4),
          "overlap": (1e-2, BACKWARD_SHARE)}
START = {"intra_bandwidth": 2e9, "inter_bandwidth": 1e9, "latency": 2e-5, "overlap": 0.2}
METHODS = ("buckets", "baseline")
SIDES = ("one node", "several nodes")


def side(nodes: int | np.ndarray) -> Any:
    """``"one node"`` or ``"several nodes"`` (elementwise for an array)."""
    if isinstance(nodes, int | np.integer):
        return SIDES[int(nodes > 1)]
    return np.where(np.asarray(nodes) > 1, SIDES[1], SIDES[0])


def predict_links(links: LinkParams, steps: pd.DataFrame) -> np.ndarray:
    """Exposed sync seconds of rows of :func:`~.data.load_all` on one cluster's links."""
    return exposed_seconds(links, steps.single_step.to_numpy(), steps.grad_bytes.to_numpy(), steps.gpus.to_numpy(),
                           steps.nodes.to_numpy(), steps.window.to_numpy())


def fit_cluster(steps: pd.DataFrame) -> LinkParams:
    """The links of one cluster's rows (see the module's docstring)."""
    names = list(BOUNDS)
    weight = 1.0 / np.sqrt(steps.groupby("group").group.transform("size").to_numpy())
    step, sync, single = (steps[c].to_numpy(dtype=np.float64) for c in ("step_time", "sync_time", "single_step"))
    has = ~np.isnan(sync)

    def links(theta: np.ndarray) -> LinkParams:
        return LinkParams(**{n: math.exp(v) for n, v in zip(names, theta, strict=True)})

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = predict_links(links(theta), steps)
        return np.concatenate([weight * np.log((single + pred) / step),
                               weight[has] * np.log((pred[has] + EPS_SYNC) / (sync[has] + EPS_SYNC))])

    lo, hi = (np.log([BOUNDS[n][i] for n in names]) for i in (0, 1))
    result = least_squares(residuals, np.log([START[n] for n in names]), bounds=(lo, hi), loss="soft_l1",
                           f_scale=0.3, diff_step=1e-3)
    return links(result.x)


def fit_links(steps: pd.DataFrame) -> dict[str, LinkParams]:
    """Each measured cluster's fitted links."""
    return {str(c): fit_cluster(part) for c, part in steps.groupby("cluster")}


def unseen_links(links: dict[str, LinkParams]) -> dict[str, float]:
    """What a cluster never measured gets: the median efficiency (reached over nominal) of the measured
    clusters' links on each side, and their median hop latency and overlap (clusters of ``--data`` alone,
    whose nominal links are not known: the median bandwidths they reach)."""
    known = [c for c in links if c in MEASURED]
    if not known:  # clusters of --data only: their nominal links are not known; the median of what they reach
        reached = list(links.values())
        return {"intra_bandwidth": float(np.median([p.intra_bandwidth for p in reached])),
                "inter_bandwidth": float(np.median([p.inter_bandwidth for p in reached])),
                "latency": float(np.median([p.latency for p in reached])),
                "overlap": float(np.median([p.overlap for p in reached]))}
    intra = [links[c].intra_bandwidth / measured_links(c)[0].bandwidth for c in known]
    inter = [links[c].inter_bandwidth / measured_links(c)[1].bandwidth for c in known]
    return {"intra_efficiency": float(np.median(intra)), "inter_efficiency": float(np.median(inter)),
            "latency": float(np.median([links[c].latency for c in known])),
            "overlap": float(np.median([links[c].overlap for c in known]))}


def predict_method(method: str, links: dict[str, LinkParams], tables: dict[str, Any],
                   steps: pd.DataFrame) -> np.ndarray:
    """Sync seconds of each row by ``method`` (``buckets`` or ``baseline``) fitted on other rows."""
    if method == "baseline":
        return predict_baseline(tables, steps)
    out = np.full(len(steps), np.nan)
    for cluster, idx in steps.groupby("cluster").indices.items():
        out[idx] = predict_links(links[cluster], steps.iloc[idx])
    return out


def mape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute percentage error (NaN on no rows)."""
    ok = ~np.isnan(actual) & ~np.isnan(pred)
    return float(np.mean(np.abs(pred[ok] / actual[ok] - 1.0))) if ok.any() else float("nan")


CANDIDATES = ("buckets", "exponential")  # tried in this order against the baseline
NAMES = {"buckets": "the bucket model", "exponential": "the exponential model"}


def _losses(part: pd.DataFrame, method: str) -> list[str]:
    """Where ``method`` did not beat the baseline on the rows of one left-out model (step, sync MAPE)."""
    lost = []
    for kind, actual, add in (("step", part.step_time, part.single_step), ("sync", part.sync_time, 0.0)):
        new = mape((part[f"pred_sync_{method}"] + add).to_numpy(), actual.to_numpy())
        old = mape((part.pred_sync_baseline + add).to_numpy(), actual.to_numpy())
        if not math.isnan(new) and not new < old:
            lost.append(f"{part.group.iloc[0]} {kind} {100 * new:.1f} % vs {100 * old:.1f} %")
    return lost


def choose_methods(scored: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per ``cluster|side``: ``{"method", "why", "models"}``; ``scored`` has ``pred_sync_baseline`` and
    ``pred_sync_CANDIDATE`` of each row predicted with its model left out (candidates without a column are
    skipped). The first of :data:`CANDIDATES` that beat the baseline on every left-out model there runs."""
    out: dict[str, dict[str, Any]] = {}
    sides = side(scored.nodes.to_numpy())
    candidates = [c for c in CANDIDATES if f"pred_sync_{c}" in scored.columns]
    for cluster in sorted(scored.cluster.unique()):
        for where in SIDES:
            on = ((scored.cluster == cluster).to_numpy()) & (sides == where)
            if not on.any():
                continue
            groups = sorted(scored.group[on].unique())
            notes, method = [], "baseline"
            for cand in candidates:
                lost = [x for g in groups for x in _losses(scored[on & (scored.group == g).to_numpy()], cand)]
                if not lost:
                    method = cand
                    notes.append(f"{NAMES[cand]} beat the visible-median baseline on every left-out model here")
                    break
                notes.append(f"{NAMES[cand]} did not beat the visible-median baseline on every left-out model here "
                             f"({'; '.join(lost[:3])}{'; ...' if len(lost) > 3 else ''})")
            out[f"{cluster}|{where}"] = {"method": method, "why": "; ".join(notes), "models": len(groups)}
    return out


def leave_one_model_out(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``pred_sync_buckets`` and ``pred_sync_baseline``: each model's rows predicted by both
    methods fitted on the other models only. ``attrs["fits"]``: each left-out model's (links, tables)."""
    out = steps.reset_index(drop=True).copy()
    for m in METHODS:
        out[f"pred_sync_{m}"] = np.nan
    fits = {}
    for group in sorted(out.group.unique()):
        held = (out.group == group).to_numpy()
        links, tables = fit_links(out[~held]), fit_baseline(out[~held])
        fits[group] = (links, tables)
        for m in METHODS:
            out.loc[held, f"pred_sync_{m}"] = predict_method(m, links, tables, out[held])
    out.attrs["fits"] = fits
    return out


def p90_factors(scored: pd.DataFrame, method: str) -> dict[str, float]:
    """The p90 factors of ``method`` from left-out-model residuals (:func:`.fit.p90_factors`)."""
    from dprobe.profiling.dataparallel.fit import p90_factors as factors

    frame = scored.assign(pred_sync=scored[f"pred_sync_{method}"],
                          pred_step=scored.single_step + scored[f"pred_sync_{method}"])
    return factors(frame.dropna(subset=["pred_sync"]))


def fitted(steps: pd.DataFrame | None = None, exponential: np.ndarray | None = None) -> dict[str, Any]:
    """What ships: every cluster's links fitted on every model, the baseline's tables, the default per
    cluster and side, the p90 factors of each method, and what an unseen cluster gets. ``exponential``: the
    exponential model's left-out sync of each row (default: :func:`.fit.leave_one_model_out`, minutes)."""
    from dprobe.profiling.dataparallel.data import load_all
    from dprobe.profiling.dataparallel.fit import leave_one_model_out as exponential_out

    steps = (load_all() if steps is None else steps).reset_index(drop=True)
    scored = leave_one_model_out(steps)
    scored["pred_sync_exponential"] = exponential_out(steps).pred_sync.to_numpy() if exponential is None else exponential
    links = fit_links(steps)
    sig = lambda v: float(f"{v:.6g}")  # noqa: E731
    p90 = {}
    for m in METHODS:
        f = p90_factors(scored, m)
        p90[m] = {"step": round(f["step"], 4), "sync": round(f["sync"], 4),
                  "step_level": f["step_level"], "sync_level": f["sync_level"]}
    return {"links": {c: {k: sig(v) for k, v in p.as_dict().items()} for c, p in links.items()},
            "unseen": {k: sig(v) for k, v in unseen_links(links).items()},
            "baseline": fit_baseline(steps), "methods": choose_methods(scored), "p90": p90,
            "models": sorted(steps.group.unique()), "rows": len(steps)}


def write_fitted(values: dict[str, Any], path: Path = FITTED_MODULE) -> None:
    """Write ``values`` as the module ``dprobe predict`` reads."""
    write_module(path, "The bucket model's links, the visible-median baseline's tables and the default per cluster,\n"
                 "fitted on datasets/pollux-placements and the data-parallel rows of datasets/gavel-colocation;\n"
                 "written by ``python -m dprobe.profiling.dataparallel.bucket_fit --write`` (do not edit).",
                 "BUCKETS_FITTED", values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dprobe.profiling.dataparallel.bucket_fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"replace {FITTED_MODULE.name} with the refit")
    args = ap.parse_args(argv)
    t0 = time.time()
    values = fitted()
    print(json.dumps({k: v for k, v in values.items() if k != "baseline"}, indent=2))
    print(f"fitted in {time.time() - t0:.0f} s")
    if args.write:
        write_fitted(values)
        print(f"wrote {FITTED_MODULE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def held_out_values(scored: pd.DataFrame, group: str) -> dict[str, Any]:
    """What ``dprobe predict`` would ship had ``group`` never been measured: the links and baseline fitted
    without it, and the default per cluster and side chosen on the other models' left-out scores (whose fits
    saw ``group``: a second level of nesting is left out)."""
    links, tables = scored.attrs["fits"][group]
    others = scored[scored.group != group]
    p90 = {m: {"step": 1.0, "sync": 1.0} for m in METHODS}  # p50 only: coverage is scored apart (nested)
    return {"links": {c: p.as_dict() for c, p in links.items()}, "unseen": unseen_links(links),
            "baseline": tables, "methods": choose_methods(others), "p90": p90}


def predict_default(steps: pd.DataFrame, values: dict[str, Any],
                    exponential: Any = None) -> tuple[np.ndarray, list[str]]:
    """Sync seconds (p50) and the sync model that ran of each row, through
    :func:`~.predict.predict_data_parallel` with its default ``--sync-model`` (``auto``), on the row's
    measured cluster with its one-GPU step (``--step-time``) and traced window, as ``dprobe predict`` runs;
    ``exponential``: the exponential model's :class:`~.model.Fitted` (default the shipped one)."""
    from dprobe.profiling.dataparallel.placement import parse_placement
    from dprobe.profiling.dataparallel.predict import measured_interconnect, predict_data_parallel

    out, ran = np.empty(len(steps)), []
    links = {c: measured_interconnect(c) for c in steps.cluster.unique()}
    for i, row in enumerate(steps.itertuples(index=False)):
        where = parse_placement(row.placement)
        dp = predict_data_parallel((row.single_step, row.single_step), row.grad_bytes, where.gpus, where,
                                   max(where.per_node), "--step-time", "--params", window=row.window,
                                   interconnect=links[row.cluster], limit=False, buckets=values,
                                   fitted=exponential)
        out[i] = dp.sync_time_seconds[0]
        ran.append(dp.sync_model)
    return out, ran
