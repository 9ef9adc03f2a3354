"""Per-kernel latency on a GPU never seen, from its spec sheet (leave-one-GPU-family-out on NeuSight's
calls: P100, P4, T4, V100, A100).

Prints, per left-out GPU: the model's median and mean absolute error (the fitted GPUs' launch overhead,
and the left-out GPU's own measured overhead), the rules beside it (the roofline alone; the roofline plus
the launch overhead) and the p90's coverage. Calls :func:`dprobe.profiling.kernels.model.crossval`, which
predicts through :func:`~dprobe.profiling.kernels.model.predict_kernel_latency` as dprobe does.

    python benchmarks/kernel_efficiency.py [--data datasets/neusight-kernels] [--json]

About 3 minutes on 2 cores.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT / "datasets" / "neusight-kernels"))
    parser.add_argument("--json", action="store_true", help="the folds as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    calls = load_neusight(args.data)
    folds = crossval(calls, load_device_specs(args.data))
    if args.json:
        print(json.dumps([asdict(f) for f in folds], indent=1))
        return 0
    print(f"{len(calls):,} calls, {calls['gpu'].nunique()} GPUs, leave-one-GPU-family-out "
          f"({time.perf_counter() - start:.0f} s)\n")
    print(f"{'left out':24} {'calls':>7} {'model med':>9} {'mean':>6} {'own ovh':>7} {'roofline':>8} "
          f"{'roof+ovh':>8} {'p90 cov':>7}")
    for f in folds:
        print(f"{f.family:24} {f.calls:7,} {f.median_error:9.1%} {f.mean_error:6.1%} "
              f"{f.median_error_measured_overhead:7.1%} {f.roofline_median_error:8.1%} "
              f"{f.roofline_overhead_median_error:8.1%} {f.p90_coverage:7.1%}")
    med = [f.median_error for f in folds]
    print(f"\nmodel median error over folds: mean {np.mean(med):.1%}, range {min(med):.1%}-{max(med):.1%}; "
          f"roofline + overhead: mean {np.mean([f.roofline_overhead_median_error for f in folds]):.1%}")
    print("per op kind (model, median error):")
    for f in folds:
        print(f"  {f.family:22} " + " ".join(f"{op} {e:.0%}" for op, e in f.per_op.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
