"""Leave-one-model-out benchmark of the data-parallel step-time model on pollux-placements.

    .venv/bin/python benchmarks/dataparallel.py [--data datasets/pollux-placements] [--param-count MODEL=N]
                                                [--models A,B,C] [--uniform-window] [--fit-latencies]
                                                [--json] [--check]

Each model's multi-GPU rows are predicted by parameters fitted on the other models, from what a user
gives: the model's one-GPU step time at the same per-GPU batch (``--step-time``, its own one-GPU rows)
and its gradient bytes (4 x its parameter count), with its backward window (``models.csv``, what
``dprobe predict`` computes from the model's traced graph). Beside it, in the same run: linear scaling (no
communication cost), a pure ring all-reduce at the cluster's nominal bandwidths (no fitted parameter,
nothing hidden by backward), and the same model form fitted on the held-out model's own rows (what the
form could reach, an oracle). ``scalability.csv`` (6-16 nodes, up to 64 GPUs, GPUs spread evenly) checks
the fit beyond the 4 nodes it saw. Ablations of what ships: ``--uniform-window`` (every model's backward
window 0.5, as without a graph), ``--fit-latencies`` (the ring latencies fitted too); ``--models`` scores
a subset of the models (each held out from the others of the subset).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd

from dprobe.profiling.dataparallel.data import load_steps
from dprobe.profiling.dataparallel.fit import HELD, fit_params, leave_one_model_out, p90_factors, predict_sync
from dprobe.profiling.dataparallel.model import ClusterParams
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW

TARGET_STEP, TARGET_SYNC = 0.10, 0.20
# the measured cluster (AWS g4dn.12xlarge: 4 T4 on PCIe Gen3 x16, 50 Gb/s Ethernet), nominal figures
NOMINAL_RING = ClusterParams(intra_bandwidth=15.75e9, intra_latency=0.0, inter_bandwidth=50e9 / 8, inter_latency=0.0,
                             per_gpu_on_node=0.0, two_node_penalty=0.0, overlap=0.0, tail=1.0, straggler=0.0)


def scores(frame: pd.DataFrame, sync: np.ndarray) -> dict[str, float]:
    """Step-time MAPE, sync-time MAPE (all multi-GPU rows, rows across nodes) and sync WAPE."""
    sync = np.asarray(sync, dtype=np.float64)
    step = frame.single_step.to_numpy() + sync
    actual, measured = frame.step_time.to_numpy(), frame.sync_time.to_numpy()
    multi = frame.nodes.to_numpy() > 1
    return {"step_mape": float(np.mean(np.abs(step / actual - 1))),
            "sync_mape": float(np.mean(np.abs(sync / measured - 1))),
            "sync_mape_nodes": float(np.mean(np.abs(sync[multi] / measured[multi] - 1))),
            "sync_wape": float(np.sum(np.abs(sync - measured)) / np.sum(measured))}


def evaluate(steps: pd.DataFrame, scored: pd.DataFrame, extrapolate: pd.DataFrame | None,
             hold: tuple[str, ...] = HELD) -> dict:
    """Scores per held-out model and method, and their mean over models (``hold``: the parameters the fit
    holds, :func:`~dprobe.profiling.dataparallel.fit.fit_params`)."""
    rows = []
    for model in sorted(steps.model.unique()):
        on = (steps.model == model).to_numpy()
        part = steps[on]
        methods = {"dprobe": scored.pred_sync.to_numpy()[on],
                   "linear scaling": np.zeros(on.sum()),
                   "nominal ring": predict_sync(NOMINAL_RING, part),
                   "oracle (own fit)": predict_sync(fit_params(part, hold), part)}
        if extrapolate is not None and model in set(extrapolate.model):
            far = extrapolate[extrapolate.model == model]
            methods_far = {"dprobe": predict_sync(fit_params(steps[~on], hold), far), "linear scaling": np.zeros(len(far)),
                           "nominal ring": predict_sync(NOMINAL_RING, far)}
        else:
            far, methods_far = None, {}
        for name, sync in methods.items():
            rows.append({"model": model, "method": name, "rows": int(on.sum()), **scores(part, sync)})
        for name, sync in methods_far.items():
            rows.append({"model": model, "method": name + " @6-16 nodes", "rows": len(far), **scores(far, sync)})
    table = pd.DataFrame(rows)
    mean = table.groupby("method", sort=False)[["step_mape", "sync_mape", "sync_mape_nodes", "sync_wape"]].mean()
    factors = p90_factors(scored)
    # each model's p90 with the factor of the other models' held-out residuals (nested: never its own)
    hits = {"step": [], "sync": []}
    for model in sorted(scored.model.unique()):
        on = scored.model == model
        f = p90_factors(scored[~on])
        hits["step"].append(float(np.mean(scored.step_time[on] <= scored.pred_step[on] * f["step"])))
        hits["sync"].append(float(np.mean(scored.sync_time[on] <= scored.pred_sync[on] * f["sync"])))
    cover = {k: float(np.mean(v)) for k, v in hits.items()}
    return {"per_model": table.to_dict("records"), "mean": mean.reset_index().to_dict("records"),
            "p90_factors": factors, "p90_coverage_nested": cover,
            "p90_coverage_nested_per_model": {k: [round(x, 3) for x in v] for k, v in hits.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="a directory laid out like datasets/pollux-placements")
    ap.add_argument("--param-count", action="append", default=[], metavar="MODEL=N",
                    help="parameters of a model that models.csv lacks (repeatable)")
    ap.add_argument("--models", default=None, metavar="A,B,C",
                    help="score only these models (folders of --data), each held out from the others given")
    ap.add_argument("--uniform-window", action="store_true",
                    help="ablation: every model's backward window 0.5 (gradients spread evenly over backward)")
    ap.add_argument("--fit-latencies", action="store_true", help="ablation: fit the ring latencies too")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    extra = {}
    for item in args.param_count:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            ap.error(f"--param-count wants MODEL=N with N >= 1, not {item!r}")
        extra[name] = int(count)
    t0 = time.time()
    steps = load_steps(args.data, extra)
    try:
        far = load_steps(args.data, extra, scalability=True)
    except ValueError:
        far = None
    if args.models is not None:
        wanted = [m for m in args.models.split(",") if m]
        unknown = sorted(set(wanted) - set(steps.model))
        if len(set(wanted)) < 2 or unknown:
            ap.error(f"--models wants at least two of {', '.join(sorted(steps.model.unique()))}"
                     + (f" (no {', '.join(unknown)})" if unknown else ""))
        steps = steps[steps.model.isin(wanted)].reset_index(drop=True)
        far = far[far.model.isin(wanted)].reset_index(drop=True) if far is not None else None
    if args.uniform_window:
        steps = steps.assign(window=UNIFORM_WINDOW)
        far = far.assign(window=UNIFORM_WINDOW) if far is not None else None
    hold = () if args.fit_latencies else HELD
    scored = leave_one_model_out(steps, hold)
    result = evaluate(steps, scored, far, hold)
    result["seconds"] = round(time.time() - t0, 1)
    mean = {r["method"]: r for r in result["mean"]}
    ours = mean["dprobe"]
    missed = [name for name, value, target in (("step", ours["step_mape"], TARGET_STEP),
                                               ("sync", ours["sync_mape"], TARGET_SYNC)) if value > target]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"leave-one-model-out on {args.data or 'datasets/pollux-placements'}: {len(steps)} multi-GPU rows of "
              f"{steps.model.nunique()} models ({result['seconds']:.0f} s)")
        windows = steps.groupby("model").window.first()
        print("backward windows: " + ", ".join(f"{m} {w:.3f}" for m, w in windows.items()))
        print(f"{'model':12s} {'method':28s} {'rows':>5s} {'step MAPE':>9s} {'sync MAPE':>9s} "
              f"{'across nodes':>12s} {'sync WAPE':>9s}")
        for r in result["per_model"] + [{**r, "model": "mean", "rows": ""} for r in result["mean"]]:
            print(f"{r['model']:12s} {r['method']:28s} {r['rows']!s:>5s} {100 * r['step_mape']:8.1f}% "
                  f"{100 * r['sync_mape']:8.1f}% {100 * r['sync_mape_nodes']:11.1f}% {100 * r['sync_wape']:8.1f}%")
        f, c = result["p90_factors"], result["p90_coverage_nested"]
        per = result["p90_coverage_nested_per_model"]
        print(f"p90 = p50 x {f['step']:.3f} (step), x {f['sync']:.3f} (sync); each model's p90 from the other "
              f"models' held-out residuals covers {100 * c['step']:.0f} % / {100 * c['sync']:.0f} % of its rows "
              f"(mean of models; step {', '.join(f'{100 * x:.0f}' for x in per['step'])} %)")
        for name, value, target in (("step time MAPE", ours["step_mape"], TARGET_STEP),
                                    ("sync time MAPE", ours["sync_mape"], TARGET_SYNC)):
            print(f"{'PASS' if value <= target else 'MISS'} {name} {100 * value:.1f} % (target <= {100 * target:.0f} %)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
