"""Inference step time (forward pass, eval mode, fp16 autocast) of timm models on a GPU never seen and on
model families never seen, from a meta replay and the GPU's spec sheet: timm's own inference benchmark
(datasets/timm-infer-gpus: RTX 3090, RTX 4090 on two PyTorch stacks, RTX 5090).

    .venv/bin/python benchmarks/coldstart_inference.py [--data datasets/timm-infer-gpus] [--json]
        [--figure PATH] [--check] [--roofline plain|kernel-model|kernel-model-all]

Two cross-validations, each through :func:`dprobe.profiling.coldstart.inference.crossval` (the path
``predict_inference_step`` takes): each GPU left out (all its stacks), and each fifth of the timm
modules (families) left out. Each fold prints, for the raw roofline, the rule (roofline x the fitting rows'
median measured / roofline), the GPU's own factor, the nearest measured GPU's factor (its p90 from the spread
between GPUs; ``benchmarks/gpu_calibrate.py`` sets it beside the current method per GPU left out) and the
learned model: MAPE, median predicted / measured, Spearman and the
p90's coverage (the roofline's p90 is itself), with the mean and the spread over folds and the target
beside them. ``--roofline``: the replay roofline the features are computed on (default the shipped
model's, ``kernel-model``; ``plain`` for the rule without the kernel model; ``benchmarks/kernel_roofline.py``
sets them side by side). Needs the replays
(``python -m dprobe.profiling.coldstart.timm_infer DIR``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dprobe.profiling.coldstart.features import ROOFLINES
from dprobe.profiling.coldstart.inference import (
    SHIPPED_ROOFLINE,
    TARGETS,
    choose,
    crossval,
    load_rows,
    summarise,
)

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("roofline", "rule", "gpu_factor", "nearest", "model")  # model: the learned correction
MAPE_TARGET, RHO_TARGET, COVER = 12.0, 0.95, (0.80, 0.95)


def fold_line(name: str, rows: int, by_kind: dict[str, dict[str, float]]) -> str:
    cells = [f"{name:<14} {rows:>5}"]
    for kind in KINDS:
        s = by_kind[kind]
        cells.append(f"{s['mape']:6.1f} % x{s['median_ratio']:.2f} {s['spearman']:.3f} {100 * s['p90_coverage']:5.1f} %")
    return " | ".join(cells)


def spread_line(label: str, summary: dict, stat: str) -> str:
    cells = [f"{label:<14} {'':>5}"]
    for kind in KINDS:
        s = summary[kind]
        if stat == "mean":
            cells.append(f"{s['mape']['mean']:6.1f} % x{s['median_ratio']['mean']:.2f} {s['spearman']['mean']:.3f} "
                         f"{100 * s['p90_coverage']['mean']:5.1f} %")
        else:
            cells.append(f"{s['mape']['min']:4.1f}-{s['mape']['max']:<4.1f} {s['spearman']['min']:.3f}-"
                         f"{s['spearman']['max']:.3f} {100 * s['p90_coverage']['min']:3.0f}-"
                         f"{100 * s['p90_coverage']['max']:<3.0f}%")
    return " | ".join(cells)


def verdict(results: list, kind: str) -> tuple[bool, str]:
    """Whether ``kind`` meets the leave-one-GPU-out targets on every fold."""
    misses = []
    for r in results:
        s = getattr(r, kind)
        if s.mape > MAPE_TARGET:
            misses.append(f"{r.fold} MAPE {s.mape:.1f} %")
        if s.spearman < RHO_TARGET:
            misses.append(f"{r.fold} Spearman {s.spearman:.3f}")
        if not COVER[0] <= s.p90_coverage <= COVER[1]:
            misses.append(f"{r.fold} p90 covers {100 * s.p90_coverage:.1f} %")
    return not misses, "; ".join(misses)


def figure(path: str, runs, ests, roofline: str = SHIPPED_ROOFLINE) -> None:
    """Measured against predicted on each GPU left out (log-log), the rule and the model side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dprobe.profiling.coldstart.inference import held_out_predictions

    pred = held_out_predictions(runs, ests, "gpu", roofline)
    folds = list(dict.fromkeys(pred["fold"]))
    fig, axes = plt.subplots(1, len(folds), figsize=(4.2 * len(folds), 4.2), squeeze=False)
    for ax, name in zip(axes[0], folds, strict=True):
        t = pred[pred["fold"] == name]
        y = t["measured"].to_numpy()
        for kind, colour in (("rule", "tab:grey"), ("model", "tab:blue")):
            p50 = t[f"{kind}_p50"].to_numpy()
            mape = 100 * np.mean(np.abs(p50 - y) / y)
            ax.scatter(y, p50, s=4, alpha=0.5, color=colour, label=f"{kind} ({mape:.1f} %)")
        lo, hi = y.min() / 1.5, y.max() * 1.5
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=f"{name} left out",
               xlabel="measured step (s)", ylabel="predicted p50 (s)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"figure -> {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "datasets" / "timm-infer-gpus"))
    p.add_argument("--json", action="store_true", help="print the folds and summaries as JSON")
    p.add_argument("--figure", default=None, help="write measured vs predicted on each GPU left out (PNG)")
    p.add_argument("--check", action="store_true", help="exit 1 when the shipped method misses a GPU target")
    p.add_argument("--roofline", choices=ROOFLINES, default=SHIPPED_ROOFLINE,
                   help="the replay roofline of the features (dprobe.profiling.coldstart.features.op_seconds; "
                   f"default {SHIPPED_ROOFLINE}, the shipped model's)")
    args = p.parse_args(argv)

    t0 = time.time()
    runs, ests = load_rows(args.data)
    print(f"{len(runs)} rows ({runs['model'].nunique()} models, {runs['family'].nunique()} families, "
          f"{runs['gpu'].nunique()} GPUs) with a replay, loaded in {time.time() - t0:.0f} s")
    report, met, folds = {}, {}, {}
    for by in ("gpu", "family"):
        t1 = time.time()
        results = folds[by] = crossval(runs, ests, by, args.roofline)
        summary = summarise(results)
        report[by] = {"folds": [asdict(r) for r in results], "summary": summary}
        verdicts = {kind: verdict(results, kind) for kind in ("rule", "nearest", "model")} if by == "gpu" else {}
        met.update({kind: ok for kind, (ok, _) in verdicts.items()})
        if args.json:
            continue
        print(f"\nleave-{'one-GPU' if by == 'gpu' else 'family'}-out ({time.time() - t1:.0f} s); target: "
              f"{TARGETS[by]}")
        print(f"{'':<14} {'':>5} | " + " | ".join(f"{k:^28}" for k in KINDS))
        print(f"{'fold':<14} {'rows':>5} | " + " | ".join(
            f"{'MAPE':>8} {'p50/m':>5} {'rho':>5} {'p90cov':>7}" for _ in KINDS))
        for r in results:
            print(fold_line(r.fold, r.rows, {k: asdict(getattr(r, k)) for k in KINDS}))
        print(spread_line("mean", summary, "mean"))
        print(spread_line("min-max", summary, "spread"))
        for kind, (ok, why) in verdicts.items():
            print(f"{'PASS' if ok else 'MISS'} {kind}: MAPE <= {MAPE_TARGET:.0f} %, rho >= {RHO_TARGET}, p90 "
                  f"covering {100 * COVER[0]:.0f}-{100 * COVER[1]:.0f} % on every GPU left out"
                  + (f" ({why})" if why else ""))
    method, seen_method = choose(folds)
    shipped = {"learned": "model", "rule": "rule", "nearest-factor": "nearest"}[method]
    line = (f"ship: on a GPU never seen {method} (the learned correction "
            f"{'beat' if method == 'learned' else 'did not beat'} the rule on every GPU left out; the nearest "
            f"measured GPU's factor {'beat' if method == 'nearest-factor' else 'did not beat'} that on every GPU "
            "left out); on a GPU with "
            f"rows {seen_method} (the learned correction {'beat' if seen_method == 'learned' else 'did not beat'} "
            f"the GPU's own factor on every fifth of the families left out); {time.time() - t0:.0f} s in all")
    if args.json:
        print(json.dumps({**report, "shipped": {"method": method, "seen_method": seen_method}}, indent=1))
    else:
        print("\n" + line)
    if args.figure:
        figure(args.figure, runs, ests, args.roofline)
    return 1 if args.check and not met.get(shipped, True) else 0


if __name__ == "__main__":
    sys.exit(main())
