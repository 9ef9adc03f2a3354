"""Wall time of loading each bundled series data set and of evaluating every baseline on it.

Target: load + evaluate under 2 minutes per data set on 2 CPU cores.

    .venv/bin/python benchmarks/evaluate_baselines.py [--datasets NAME ...] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dprobe.core.workers import available_cores
from dprobe.data import load_series_dataset
from dprobe.evaluation import EvalConfig, evaluate_dataset
from dprobe.forecaster import BASELINES

ROOT = Path(__file__).resolve().parents[1]
SERIES_DATASETS = ("alibaba-genai-2026", "helios-earth-vc")
BUDGET_S = 120.0


def bench(directory: Path, baselines: list[str]) -> dict:
    """Load ``directory`` and evaluate ``baselines`` on it; the timings in seconds."""
    t0 = time.perf_counter()
    ds = load_series_dataset(directory)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = evaluate_dataset(ds, cfg=EvalConfig(baselines=baselines, progress=False))
    eval_s = time.perf_counter() - t1
    return {
        "dataset": ds.name,
        "series": len(ds.series_ids),
        "points": len(ds.frame),
        "load_s": load_s,
        "evaluate_s": eval_s,
        "methods_s": dict(result.seconds),
        "scoring_s": eval_s - sum(result.seconds.values()),
        "total_s": load_s + eval_s,
        "rows": len(result.rows),
    }


def report(r: dict, budget_s: float) -> str:
    lines = [f"## {r['dataset']}: {r['series']} series, {r['points']:,} points",
             f"  load                {r['load_s']:8.2f} s"]
    lines += [f"  {m:<19} {s:8.2f} s" for m, s in r["methods_s"].items()]
    lines += [f"  scoring / overhead  {r['scoring_s']:8.2f} s",
              f"  evaluate (all)      {r['evaluate_s']:8.2f} s",
              f"  total               {r['total_s']:8.2f} s"]
    verdict = "PASS" if r["total_s"] <= budget_s else "OVER"
    lines.append(f"  {verdict}: {r['total_s']:.1f} s against a target of {budget_s:.0f} s on 2 cores "
                 f"(this machine: {available_cores()} cores)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time loading and evaluating all baselines on each bundled series data set "
        f"(target: under {BUDGET_S:.0f} s each on 2 cores).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--datasets", nargs="+", default=list(SERIES_DATASETS), metavar="NAME_OR_DIR",
                        help="bundled data set names (under datasets/) or directories laid out like them")
    parser.add_argument("--baselines", default=",".join(BASELINES), help="comma-separated baselines to time")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds allowed per data set")
    parser.add_argument("--json", action="store_true", help="also print the timings as one JSON object")
    parser.add_argument("--check", action="store_true", help="exit 1 when a data set is over budget")
    args = parser.parse_args(argv)

    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    results = []
    for name in args.datasets:
        directory = Path(name) if Path(name).is_dir() else ROOT / "datasets" / name
        r = bench(directory, baselines)
        results.append(r)
        print(report(r, args.budget), flush=True)
    if args.json:
        print(json.dumps({"budget_s": args.budget, "cores": available_cores(), "results": results}))
    over = [r["dataset"] for r in results if r["total_s"] > args.budget]
    print(f"\n{'OVER budget: ' + ', '.join(over) if over else 'PASS: every data set within budget'}")
    return 1 if over and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
