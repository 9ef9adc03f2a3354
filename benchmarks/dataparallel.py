"""Leave-one-model-out benchmark of the data-parallel step-time model on pollux-placements and Gavel's
data-parallel rows.

    .venv/bin/python benchmarks/dataparallel.py [--data datasets/pollux-placements] [--no-gavel]
                                                [--param-count MODEL=N] [--models A,B,C] [--window-blend X]
                                                [--unseen-clusters] [--json] [--check]

Each model's multi-GPU rows (a pollux-placements model together with Gavel's job type of the same
architecture) are predicted by parameters fitted on the other models, through the function ``dprobe predict
--gpus`` calls, from what a user gives: the model's one-GPU step time at the same per-GPU batch
(``--step-time``), its gradient bytes (4 x its parameter count) and its traced backward window, on the
row's measured cluster. Beside it, in the same run, the two simple rules: linear scaling (no communication
cost) and a ring all-reduce at the links' nominal bandwidths (nothing hidden by backward, no fitted number).
Gavel measured no sync time: its rows count in step time only. ``scalability.csv`` (6-16 nodes, up to 64
GPUs) checks the fit beyond the 4 nodes it saw. ``--unseen-clusters`` also holds out each cluster in turn
(its links at nominal bandwidth times the others' efficiency, :func:`~dprobe.profiling.dataparallel.model.
unseen_cluster`). ``--window-blend`` scores another trust in the traced window (0: every model 0.5, 1: the
traced window; shipped 0.5); ``--models`` a subset of the models (each held out from the others given).
The ``sync models`` table scores, each model left out, the bucket model (DDP's 25 MB buckets overlapped with
the backward left, :mod:`dprobe.profiling.dataparallel.buckets`), the visible-median baseline, the
exponential model (``dprobe`` above) and the default ``dprobe predict --gpus`` runs (``--sync-model auto``),
with each one's p90 coverage per model, and where each would ship.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd

from dprobe.profiling.dataparallel import bucket_fit
from dprobe.profiling.dataparallel.data import load_all, load_steps
from dprobe.profiling.dataparallel.fit import (
    LEVELS,
    coverage,
    fit_params,
    leave_one_model_out,
    p90_factors,
    predict_sync,
)
from dprobe.profiling.dataparallel.interconnect import Interconnect, measured_links
from dprobe.profiling.dataparallel.model import WINDOW_BLEND, ClusterParams, sync_seconds, unseen_cluster
from dprobe.profiling.dataparallel.predict import cluster_params

TARGET_STEP, TARGET_SYNC = 0.12, 0.30


def nominal_ring(cluster: str) -> ClusterParams:
    """A ring all-reduce at the cluster's nominal link bandwidths, nothing hidden, no straggler."""
    try:
        intra, inter = measured_links(cluster)
        bandwidths = (intra.bandwidth, inter.bandwidth)
    except KeyError:  # a cluster of --data: the Pollux testbed's links
        intra, inter = measured_links("pollux-t4")
        bandwidths = (intra.bandwidth, inter.bandwidth)
    return ClusterParams(intra_bandwidth=bandwidths[0], inter_bandwidth=bandwidths[1], per_gpu_on_node=0.0,
                         two_node_penalty=0.0, overlap=0.0, tail=1.0, straggler=0.0, straggler_intra=0.0)


def rule_sync(frame: pd.DataFrame, rule: str) -> np.ndarray:
    """Sync seconds of a simple rule: ``linear`` (none) or ``ring`` (:func:`nominal_ring`)."""
    if rule == "linear":
        return np.zeros(len(frame))
    out = np.empty(len(frame))
    for cluster, idx in frame.groupby("cluster").indices.items():
        part = frame.iloc[idx]
        out[idx] = sync_seconds(nominal_ring(cluster), part.single_step, part.grad_bytes, part.gpus, part.nodes,
                                part.busiest, 0.0)
    return out


def scores(frame: pd.DataFrame, sync: np.ndarray) -> dict[str, float]:
    """Step-time MAPE (every row), and on rows that measured sync time: sync MAPE (all, across nodes), sync
    WAPE, the median ratio of predicted to measured step."""
    sync = np.asarray(sync, dtype=np.float64)
    step = frame.single_step.to_numpy() + sync
    actual, measured = frame.step_time.to_numpy(), frame.sync_time.to_numpy()
    has = ~np.isnan(measured)
    multi = has & (frame.nodes.to_numpy() > 1)
    nan = float("nan")
    return {"step_mape": float(np.mean(np.abs(step / actual - 1))),
            "step_ratio": float(np.exp(np.median(np.log(step / actual)))),
            "sync_mape": float(np.mean(np.abs(sync[has] / measured[has] - 1))) if has.any() else nan,
            "sync_mape_nodes": float(np.mean(np.abs(sync[multi] / measured[multi] - 1))) if multi.any() else nan,
            "sync_wape": float(np.sum(np.abs(sync[has] - measured[has])) / np.sum(measured[has])) if has.any() else nan}


def evaluate(steps: pd.DataFrame, scored: pd.DataFrame, far: pd.DataFrame | None) -> dict:
    """Scores per held-out model and method, their mean over models, by source, and the p90's coverage."""
    rows = []
    fits = scored.attrs["fits"]
    for group in sorted(steps.group.unique()):
        on = (steps.group == group).to_numpy()
        part = steps[on]
        methods = {"dprobe": scored.pred_sync.to_numpy()[on], "linear scaling": rule_sync(part, "linear"),
                   "nominal ring": rule_sync(part, "ring")}
        for name, sync in methods.items():
            rows.append({"model": group, "method": name, "rows": int(on.sum()),
                         "sources": "+".join(sorted({"gavel" if c.startswith("gavel") else "pollux"
                                                     for c in part.cluster})), **scores(part, sync)})
            for source, mine in (("pollux", ~part.cluster.str.startswith("gavel")),
                                 ("gavel", part.cluster.str.startswith("gavel"))):
                if mine.any():
                    rows.append({"model": group, "method": f"{name} [{source}]", "rows": int(mine.sum()),
                                 "sources": source, **scores(part[mine], sync[mine.to_numpy()])})
        if far is not None and group in set(far.group):
            part_far = far[far.group == group]
            for name, sync in (("dprobe @6-16 nodes", predict_sync(fits[group], part_far)),
                               ("linear scaling @6-16 nodes", rule_sync(part_far, "linear")),
                               ("nominal ring @6-16 nodes", rule_sync(part_far, "ring"))):
                rows.append({"model": group, "method": name, "rows": len(part_far), "sources": "pollux",
                             **scores(part_far, sync)})
    table = pd.DataFrame(rows)
    cols = ["step_mape", "step_ratio", "sync_mape", "sync_mape_nodes", "sync_wape"]
    mean = table.groupby("method", sort=False)[cols].mean()
    factors = p90_factors(scored)
    cover = {kind: coverage(scored, factors[f"{kind}_level"])[kind] for kind in ("step", "sync")}
    return {"per_model": table.to_dict("records"), "mean": mean.reset_index().to_dict("records"),
            "p90_factors": factors,
            "p90_coverage_nested": {k: float(np.mean(list(v.values()))) for k, v in cover.items()},
            "p90_coverage_nested_per_model": {k: {m: round(x, 3) for m, x in v.items()} for k, v in cover.items()}}


SYNC_METHODS = {"dprobe default": "default", "bucket model": "buckets", "visible-median baseline": "baseline",
                "current (exponential)": "exponential"}


def sync_models(steps: pd.DataFrame, scored: pd.DataFrame) -> dict:
    """The bucket model, the visible-median baseline, the current (exponential) model and the shipped default
    (``--sync-model auto`` through :func:`~dprobe.profiling.dataparallel.predict.predict_data_parallel`, its
    choice per cluster and side made on the other models' left-out scores), each model left out: per model
    step MAPE, sync MAPE (all rows, across nodes), and each method's p90 coverage (factor from the other
    models' left-out residuals only)."""
    held = bucket_fit.leave_one_model_out(steps)
    held["pred_sync_exponential"] = scored.pred_sync.to_numpy()
    held["pred_sync_default"], held["ran"] = np.nan, ""
    for group in sorted(held.group.unique()):
        on = (held.group == group).to_numpy()
        sync, ran = bucket_fit.predict_default(held[on], bucket_fit.held_out_values(held, group),
                                               scored.attrs["fits"][group])
        held.loc[on, "pred_sync_default"], held.loc[on, "ran"] = sync, ran
    rows, coverage_of = [], {}
    for label, key in SYNC_METHODS.items():
        frame = held.assign(pred_sync=held[f"pred_sync_{key}"],
                            pred_step=held.single_step + held[f"pred_sync_{key}"])
        factors = p90_factors(frame)
        coverage_of[label] = {kind: coverage(frame, factors[f"{kind}_level"])[kind] for kind in ("step", "sync")}
        coverage_of[label]["factors"] = {k: round(v, 4) for k, v in factors.items()}
        for group in sorted(held.group.unique()):
            part = frame[frame.group == group]
            ran = part.ran.value_counts()
            rows.append({"model": group, "method": label, "rows": len(part), **scores(part, part.pred_sync.to_numpy()),
                         "p90_step_coverage": coverage_of[label]["step"].get(group, float("nan")),
                         "p90_sync_coverage": coverage_of[label]["sync"].get(group, float("nan")),
                         "ran": ", ".join(f"{k} {v}" for k, v in ran.items()) if key == "default" else key})
    gate = bucket_fit.choose_methods(held)
    return {"per_model": rows, "p90": {k: v["factors"] for k, v in coverage_of.items()}, "shipped_choice": gate}


def print_sync_models(result: dict) -> None:
    """The sync-model table: each left-out model, each method."""
    pct = lambda v: "     -" if v != v else f"{100 * v:5.1f}%"  # noqa: E731
    print("\nsync models, each model left out (step / sync MAPE; sync across nodes; p90 coverage of step / sync):")
    print(f"{'model':12s} {'method':24s} {'rows':>5s} {'step':>6s} {'sync':>7s} {'nodes':>7s} {'p90 step':>8s} "
          f"{'p90 sync':>8s}  ran")
    for r in result["per_model"]:
        print(f"{r['model']:12s} {r['method']:24s} {r['rows']:5d} {pct(r['step_mape'])} {pct(r['sync_mape']):>7s} "
              f"{pct(r['sync_mape_nodes']):>7s} {pct(r['p90_step_coverage']):>8s} {pct(r['p90_sync_coverage']):>8s}  "
              f"{r['ran']}")
    for key, choice in result["shipped_choice"].items():
        print(f"default on {key}: {choice['method']} ({choice['why']})")


def unseen_clusters(steps: pd.DataFrame, window_blend: float) -> list[dict]:
    """Each measured cluster held out: fitted on the others, predicted from its links' nominal bandwidths."""
    out = []
    for cluster in sorted(steps.cluster.unique()):
        held = (steps.cluster == cluster).to_numpy()
        try:
            intra, inter = measured_links(cluster)
        except KeyError:
            continue
        fit = fit_params(steps[~held], window_blend)
        params = cluster_params(Interconnect(intra, inter, "held out", None), fit, unseen_cluster(fit))
        part = steps[held]
        sync = sync_seconds(params, part.single_step, part.grad_bytes, part.gpus, part.nodes, part.busiest,
                            fit.window(part.window.to_numpy()))
        for name, s in (("dprobe (unseen cluster)", sync), ("linear scaling", rule_sync(part, "linear")),
                        ("nominal ring", rule_sync(part, "ring"))):
            out.append({"cluster": cluster, "method": name, "rows": int(held.sum()), **scores(part, s)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="a directory laid out like datasets/pollux-placements")
    ap.add_argument("--no-gavel", action="store_true", help="leave out Gavel's data-parallel rows")
    ap.add_argument("--param-count", action="append", default=[], metavar="MODEL=N",
                    help="parameters of a model that models.csv lacks (repeatable)")
    ap.add_argument("--models", default=None, metavar="A,B,C",
                    help="score only these models (pollux-placements folders or Gavel's: transformer, lm), each "
                    "held out from the others given")
    ap.add_argument("--window-blend", type=float, default=WINDOW_BLEND, metavar="X",
                    help=f"trust in the traced backward window: X x traced + (1 - X) x 0.5 (default {WINDOW_BLEND})")
    ap.add_argument("--unseen-clusters", action="store_true", help="also hold out each measured cluster in turn")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    extra = {}
    for item in args.param_count:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            ap.error(f"--param-count wants MODEL=N with N >= 1, not {item!r}")
        extra[name] = int(count)
    if not 0 <= args.window_blend <= 1:
        ap.error(f"--window-blend must be in [0, 1], not {args.window_blend}")
    t0 = time.time()
    steps = load_all(args.data, extra, False if args.no_gavel else None)
    try:
        far = load_steps(args.data, extra, scalability=True)
    except ValueError:
        far = None
    if args.models is not None:
        wanted = [m for m in args.models.split(",") if m]
        unknown = sorted(set(wanted) - set(steps.group))
        if len(set(wanted)) < 2 or unknown:
            ap.error(f"--models wants at least two of {', '.join(sorted(steps.group.unique()))}"
                     + (f" (no {', '.join(unknown)})" if unknown else ""))
        steps = steps[steps.group.isin(wanted)].reset_index(drop=True)
        far = far[far.group.isin(wanted)].reset_index(drop=True) if far is not None else None
    scored = leave_one_model_out(steps, args.window_blend)
    result = evaluate(steps, scored, far)
    result["sync_models"] = sync_models(steps, scored)
    if args.unseen_clusters:
        result["unseen_clusters"] = unseen_clusters(steps, args.window_blend)
    result["window_blend"] = args.window_blend
    result["seconds"] = round(time.time() - t0, 1)
    mean = {r["method"]: r for r in result["mean"]}
    ours = mean["dprobe"]
    missed = [name for name, value, target in (("step", ours["step_mape"], TARGET_STEP),
                                               ("sync", ours["sync_mape"], TARGET_SYNC)) if value > target]
    if args.json:
        print(json.dumps(result))
        return 1 if args.check and missed else 0
    print(f"leave-one-model-out on {args.data or 'datasets/pollux-placements'}"
          f"{'' if args.no_gavel else ' + gavel-colocation'}: {len(steps)} multi-GPU rows of {steps.group.nunique()} "
          f"models on {steps.cluster.nunique()} clusters ({result['seconds']:.0f} s; window blend {args.window_blend})")
    windows = steps.groupby("group").window.first()
    print("traced backward windows: " + ", ".join(f"{m} {w:.3f}" for m, w in windows.items()))
    head = (f"{'model':12s} {'method':32s} {'rows':>5s} {'step MAPE':>9s} {'ratio':>6s} {'sync MAPE':>9s} "
            f"{'across nodes':>12s} {'sync WAPE':>9s}")
    print(head)
    pct = lambda v: "        -" if v != v else f"{100 * v:8.1f}%"  # noqa: E731
    for r in result["per_model"] + [{**r, "model": "mean", "rows": ""} for r in result["mean"]]:
        print(f"{r['model']:12s} {r['method']:32s} {r['rows']!s:>5s} {pct(r['step_mape'])} {r['step_ratio']:6.2f} "
              f"{pct(r['sync_mape'])} {pct(r['sync_mape_nodes']):>12s} {pct(r['sync_wape'])}")
    f = result["p90_factors"]
    for kind in ("step", "sync"):
        per = result["p90_coverage_nested_per_model"][kind]
        print(f"p90 {kind} = p50 x {f[kind]:.3f} (quantile {f[f'{kind}_level']} of {LEVELS}): each model's p90 from "
              f"the other models' held-out residuals covers {100 * result['p90_coverage_nested'][kind]:.0f} % of its "
              f"rows on average ({', '.join(f'{m} {100 * v:.0f}' for m, v in per.items())} %)")
    print_sync_models(result["sync_models"])
    if args.unseen_clusters:
        print(f"{'cluster':12s} {'method':32s} {'rows':>5s} {'step MAPE':>9s} {'ratio':>6s} {'sync MAPE':>9s}")
        for r in result["unseen_clusters"]:
            print(f"{r['cluster']:12s} {r['method']:32s} {r['rows']:5d} {pct(r['step_mape'])} {r['step_ratio']:6.2f} "
                  f"{pct(r['sync_mape'])}")
    for name, value, target in (("step time MAPE", ours["step_mape"], TARGET_STEP),
                                ("sync time MAPE", ours["sync_mape"], TARGET_SYNC)):
        rules = {k: mean[k][name.split()[0] + "_mape"] for k in ("linear scaling", "nominal ring")}
        verdict = "PASS" if value <= target else "MISS"
        print(f"{verdict} {name} {100 * value:.1f} % (target <= {100 * target:.0f} %; linear scaling "
              f"{100 * rules['linear scaling']:.1f} %, nominal ring {100 * rules['nominal ring']:.1f} %)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
