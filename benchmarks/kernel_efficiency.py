"""Per-kernel latency on a GPU never seen, from its spec sheet (leave-one-GPU-family-out on NeuSight's
calls: P100, P4, T4, V100, A100), by the shaped model and by the shape-free one (what a replayed kernel
has: class, FLOPs, bytes; no GEMM shapes).

Prints, per model and left-out GPU: the model's median and mean absolute error (the fitted GPUs' launch
overhead, and the left-out GPU's own measured overhead), the rules beside it (the roofline alone; the
roofline plus the launch overhead) and the p90's coverage; then both models' median errors side by side.
Calls :func:`dprobe.profiling.kernels.model.crossval` (``shapes=True`` / ``False``), which predicts
through :func:`~dprobe.profiling.kernels.model.predict_kernel_latency` as dprobe does.

    python benchmarks/kernel_efficiency.py [--data datasets/neusight-kernels] [--variant both] [--json]

About 3 minutes a model on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dprobe.profiling.kernels.data import load_device_specs, load_neusight  # noqa: E402
from dprobe.profiling.kernels.model import crossval  # noqa: E402

VARIANTS = {"shaped": True, "shape-free": False}


def print_folds(name: str, folds: list) -> None:
    print(f"\n{name} model")
    print(f"{'left out':24} {'calls':>7} {'model med':>9} {'mean':>6} {'own ovh':>7} {'roofline':>8} "
          f"{'roof+ovh':>8} {'p90 cov':>7}")
    for f in folds:
        print(f"{f.family:24} {f.calls:7,} {f.median_error:9.1%} {f.mean_error:6.1%} "
              f"{f.median_error_measured_overhead:7.1%} {f.roofline_median_error:8.1%} "
              f"{f.roofline_overhead_median_error:8.1%} {f.p90_coverage:7.1%}")
    med = [f.median_error for f in folds]
    print(f"model median error over folds: mean {np.mean(med):.1%}, range {min(med):.1%}-{max(med):.1%}; "
          f"roofline + overhead: mean {np.mean([f.roofline_overhead_median_error for f in folds]):.1%}")
    print("per op kind (model, median error):")
    for f in folds:
        print(f"  {f.family:22} " + " ".join(f"{op} {e:.0%}" for op, e in f.per_op.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT / "datasets" / "neusight-kernels"))
    parser.add_argument("--variant", choices=("both", *VARIANTS), default="both",
                        help="the shaped model, the shape-free one, or both side by side (default both)")
    parser.add_argument("--json", action="store_true", help="the folds as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    calls = load_neusight(args.data)
    specs = load_device_specs(args.data)
    names = list(VARIANTS) if args.variant == "both" else [args.variant]
    folds = {name: crossval(calls, specs, shapes=VARIANTS[name]) for name in names}
    if args.json:
        print(json.dumps({name: [asdict(f) for f in fs] for name, fs in folds.items()}, indent=1))
        return 0
    print(f"{len(calls):,} calls, {calls['gpu'].nunique()} GPUs, leave-one-GPU-family-out "
          f"({time.perf_counter() - start:.0f} s)")
    for name, fs in folds.items():
        print_folds(name, fs)
    if len(folds) > 1:
        print("\nmedian error, GPU left out: " + " | ".join(names) + " | roofline + overhead")
        first = folds[names[0]]
        for i, f in enumerate(first):
            print(f"  {f.family:22} " + " | ".join(f"{folds[n][i].median_error:6.1%}" for n in names)
                  + f" | {f.roofline_overhead_median_error:6.1%}")
        print(f"  {'mean':22} " + " | ".join(f"{np.mean([f.median_error for f in folds[n]]):6.1%}" for n in names)
              + f" | {np.mean([f.roofline_overhead_median_error for f in first]):6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
