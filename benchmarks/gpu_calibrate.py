"""A GPU no row was measured on, predicted from its spec sheet: each bundled GPU of timm's inference benchmark
(datasets/timm-infer-gpus: RTX 3090, 4090, 5090) left out in turn and treated as spec-sheet-only, through
:func:`dprobe.profiling.coldstart.inference.crossval` (each fold's predictors fitted on the other GPUs' rows,
predicted through ``predict_frame``, the path ``dprobe predict --mode inference --gpu-spec`` takes).

    .venv/bin/python benchmarks/gpu_calibrate.py [--data datasets/timm-infer-gpus] [--json] [--check]
        [--roofline plain|kernel-model|kernel-model-all]

Per GPU left out: MAPE, median p50 / measured and p90 coverage of

- the current method on a GPU never seen (what ``dprobe predict`` runs: the shipped model's ``method``, the
  learned correction or the rule, with its own p90);
- the rule (the roofline times one factor);
- the nearest measured GPU's factor (same architecture first, then the nearest bandwidth and tensor-core
  peak), its p90 widened by the spread between GPUs: each *other* GPU predicted by its nearest among the
  rest, the 90th percentile of those errors (``nearest``: the candidate for spec-sheet GPUs);
- the same p50 with the sibling rule's widening (the GPU factor's p90 times the largest spread between the
  GPUs' factors: ``nearest, sibling p90``).

Which runs on a spec-sheet GPU is :func:`~dprobe.profiling.coldstart.inference.choose`'s verdict: the nearest
factor only if its MAPE beat the current method on every GPU left out. A calibrated GPU (``dprobe gpu
calibrate``) cannot be scored here: no bundled GPU has a calibration, and there is no GPU to make one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from dprobe.profiling.coldstart.features import ROOFLINES
from dprobe.profiling.coldstart.inference import SHIPPED_ROOFLINE, choose, crossval, load_rows

ROOT = Path(__file__).resolve().parents[1]
MAPE_TARGET, CALIBRATED_TARGET, COVER = 15.0, 10.0, (0.80, 0.95)
COLUMNS = (("current", "current method"), ("rule", "rule"), ("nearest", "nearest factor"),
           ("nearest_sibling", "nearest, sibling p90"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "datasets" / "timm-infer-gpus"))
    p.add_argument("--json", action="store_true", help="print the folds and the verdict as JSON")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the method that runs on a spec-sheet GPU misses a target on a GPU left out")
    p.add_argument("--roofline", choices=ROOFLINES, default=SHIPPED_ROOFLINE,
                   help=f"the replay roofline of the features (default {SHIPPED_ROOFLINE}, the shipped model's)")
    args = p.parse_args(argv)

    t0 = time.time()
    runs, ests = load_rows(args.data)
    by_gpu = crossval(runs, ests, "gpu", args.roofline)
    by_family = crossval(runs, ests, "family", args.roofline)  # choose() decides the seen GPUs' method on it
    method, seen_method = choose({"gpu": by_gpu, "family": by_family})
    current_kind = {"learned": "model", "rule": "rule"}[choose({"gpu": [_without_nearest(f) for f in by_gpu],
                                                                "family": by_family})[0]]
    rows = []
    for r in by_gpu:
        cells = {"current": asdict(getattr(r, current_kind)), "rule": asdict(r.rule), "nearest": asdict(r.nearest),
                 "nearest_sibling": asdict(r.nearest_sibling)}
        rows.append({"fold": r.fold, "rows": r.rows, **cells})
    spec_kind = {"nearest-factor": "nearest", "learned": "current", "rule": "current"}[method]
    misses = [f"{row['fold']}: MAPE {row[spec_kind]['mape']:.1f} %" for row in rows
              if row[spec_kind]["mape"] > MAPE_TARGET]
    misses += [f"{row['fold']}: p90 covers {100 * row[spec_kind]['p90_coverage']:.1f} %" for row in rows
               if not COVER[0] <= row[spec_kind]["p90_coverage"] <= COVER[1]]
    verdict = (f"on a spec-sheet GPU: {method} ("
               + ("the nearest measured GPU's factor beat the current method on every GPU left out)"
                  if method == "nearest-factor" else
                  f"the current method, {method}: the nearest measured GPU's factor did not beat it on every GPU "
                  "left out)"))
    if args.json:
        print(json.dumps({"folds": rows, "method": method, "seen_method": seen_method, "current": current_kind,
                          "misses": misses, "seconds": round(time.time() - t0, 1)}, indent=1))
        return 1 if args.check and misses else 0
    print(f"{len(runs)} rows, {runs['gpu'].nunique()} GPUs, each left out and predicted from its spec sheet "
          f"({args.roofline} roofline); {time.time() - t0:.0f} s")
    print(f"{'GPU left out':<14} {'rows':>5} | " + " | ".join(f"{label:^26}" for _, label in COLUMNS))
    print(f"{'':<14} {'':>5} | " + " | ".join(f"{'MAPE':>7} {'p50/m':>6} {'p90 cov':>9}" for _ in COLUMNS))
    for row in rows:
        print(f"{row['fold']:<14} {row['rows']:>5} | " + " | ".join(
            f"{row[k]['mape']:5.1f} % x{row[k]['median_ratio']:5.2f} {100 * row[k]['p90_coverage']:7.1f} %"
            for k, _ in COLUMNS))
    print(f"(current method: {current_kind if current_kind == 'rule' else 'learned'}; nearest GPU: same "
          "architecture first, then the nearest bandwidth and tensor-core peak)")
    print(verdict)
    print(f"{'PASS' if not misses else 'MISS'} spec-sheet target: MAPE <= {MAPE_TARGET:.0f} % and p90 covering "
          f"{100 * COVER[0]:.0f}-{100 * COVER[1]:.0f} % on every GPU left out" + (f" ({'; '.join(misses)})" if misses else ""))
    print(f"NOT MEASURED calibrated target (MAPE <= {CALIBRATED_TARGET:.0f} % with dprobe gpu calibrate's figures): "
          "no bundled GPU has a calibration and this machine has no GPU to make one")
    return 1 if args.check and misses else 0


def _without_nearest(fold):  # the choice as it was before the nearest factor was a candidate
    from dataclasses import replace

    return replace(fold, nearest=None)


if __name__ == "__main__":
    sys.exit(main())
