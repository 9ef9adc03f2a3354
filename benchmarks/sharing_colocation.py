"""Co-location: each job's speed beside another (relative to alone) and whether the pair fits in memory.

On datasets/gavel-colocation (Gavel's 26 job types alone and in pairs on K80, P100, V100; dprobe's
cold-start profile of each type from tools/gavel_models.py), with model types held out (a fold holds out
every pair that involves the type), every prediction by dprobe.sharing.interference.predict_colocation:

- per-job: the boosted trees of dprobe.sharing.interference_fit, refitted on each fold's training pairs;
- time-share: min(1, 1 / (u1 + u2)), u the cold-start profile's utilisation;
- contention: the older model, one speed for both jobs (1 + a u1 u2, a = 0.6, then saturation);
- constant: the training pairs' mean speed.

Then the same with each GPU held out, whether pairs fit in memory (a pair with throughput 0 together did
not fit or was not run), and a reference that is not a prediction: the in-sample MAE of one effect per job
type and one per partner type, per GPU. Targets: speed MAE <= 0.04; per-job at least 40 % below the
time-share rule; the memory verdict right on >= 95 % of pairs.

``--data DIR`` also scores the h200-profiles-like pairs with solo runs of both members (the bundled data
has none yet, and says so). Needs LightGBM for the refits (pip install -e '.[bench]').

    .venv/bin/python benchmarks/sharing_colocation.py [--gavel DIR] [--measured-alone] [--data DIR]
                                                      [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TARGET_MAE = 0.04
TARGET_BELOW_RULE = 0.40
TARGET_FIT = 0.95
RULES = ("per-job", "time-share", "contention", "constant")


def _table(cv: dict[str, Any], title: str) -> None:
    print(f"\n{title}\n")
    print("| held out | jobs | " + " | ".join(RULES) + " |")
    print("| --- | ---: |" + " ---: |" * len(RULES))
    for f in cv["folds"]:
        print(f"| {f['fold']} | {f['jobs']} | " + " | ".join(f"{f['mae'][r]:.3f}" for r in RULES) + " |")
    print(f"| **all held-out jobs** | {cv['held_out_jobs']} | "
          + " | ".join(f"**{cv['overall'][r]:.3f}**" for r in RULES) + " |")
    print("| folds: min-max (std) | | " + " | ".join(
        f"{cv['spread'][r]['min']:.3f}-{cv['spread'][r]['max']:.3f} ({cv['spread'][r]['std']:.3f})" for r in RULES)
        + " |")


def h200_pairs(directory: Path) -> dict[str, Any]:
    """The older check: h200-profiles-like co-located pairs with solo runs of both members."""
    import numpy as np
    import pandas as pd

    from dprobe.sharing.interference import evaluate_pairs

    rows = evaluate_pairs(pd.read_csv(directory / "runs.csv"))
    mae = {m: float(np.mean([abs(r[m] - r["speed"]) for r in rows])) if rows else None
           for m in ("model", "no_slowdown", "saturation")}
    return {"data": str(directory), "jobs": rows, "mae": mae}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gavel", default=None, help="a directory laid out like datasets/gavel-colocation")
    ap.add_argument("--profiles", default=None, help="job profiles (default: dprobe/sharing/gavel_profiles.json)")
    ap.add_argument("--measured-alone", action="store_true",
                    help="each job's step time from its measured throughput alone, not the cold-start prediction")
    ap.add_argument("--data", default=None, help="also score an h200-profiles-like directory's pairs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)

    from dprobe.sharing.interference_fit import (
        cross_validate,
        fit_accuracy,
        gavel_jobs,
        job_effects_mae,
        leave_gpu_out,
        summary_of,
        symmetric_floor,
    )

    jobs = gavel_jobs(args.gavel, args.profiles, measured_alone=args.measured_alone)
    measured = jobs.pairs[jobs.pairs["measured"]].reset_index(drop=True)
    by_type = summary_of(cross_validate(jobs))
    by_gpu = summary_of(cross_validate(jobs, leave_gpu_out(measured)))
    memory = fit_accuracy(jobs)
    reference = job_effects_mae(jobs.pairs)
    floor = symmetric_floor(jobs.pairs)
    overall = by_type["overall"]
    below = 1 - overall["per-job"] / overall["time-share"]
    targets = {"speed MAE <= 0.04": overall["per-job"] <= TARGET_MAE,
               "per-job >= 40 % below the time-share rule": below >= TARGET_BELOW_RULE,
               "memory verdict right on >= 95 % of pairs": memory["accuracy"] >= TARGET_FIT}
    h200 = h200_pairs(Path(args.data)) if args.data else None
    if args.json:
        json.dump({"leave_model_type_out": by_type, "leave_gpu_out": by_gpu, "memory_fit": memory,
                   "job_effects_in_sample_mae": reference, "symmetric_floor": floor, "below_time_share": below, "targets": targets,
                   "h200": h200}, sys.stdout)
        print()
    else:
        print(f"{len(measured)} jobs of measured pairs ({measured['gpu'].nunique()} GPUs, "
              f"{measured['model_a'].nunique()} model types); speed MAE of each job, "
              f"step time {'measured alone' if args.measured_alone else 'from the cold-start profile'}")
        _table(by_type, "Model types held out (each fold: every pair that involves the type):")
        _table(by_gpu, "GPUs held out:")
        print(f"\nper-job model {100 * below:.0f} % below the time-share rule (model types held out)")
        print(f"references, not predictions: any model that gives both jobs one speed is at best "
              f"{floor['mae']:.3f} (the two measured speeds of a pair differ by {floor['mean_gap']:.3f} on average); "
              f"job-type effects fitted in-sample per GPU: {reference:.3f}")
        print(f"\nmemory: {memory['pairs']} pairs, {memory['ran']} run together; verdict right on "
              f"{100 * memory['accuracy']:.1f} % (always 'fits': {100 * memory['always_fits']:.1f} %); "
              f"wrong: {memory['missed']['fit_said_no']} said 'no' that ran, "
              f"{memory['missed']['no_fit_said_fits']} said to fit that did not run")
        print("  per model type: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in memory["per_type"].items()))
        for name, ok in targets.items():
            print(f"{'PASS' if ok else 'MISS'}  {name}")
        if h200 is not None:
            if h200["jobs"]:
                m = h200["mae"]
                print(f"\n{h200['data']}: {len(h200['jobs'])} co-located jobs; MAE contention model "
                      f"{m['model']:.3f}, no slowdown {m['no_slowdown']:.3f}, saturation {m['saturation']:.3f}")
            else:
                print(f"\n{h200['data']}: no pair has solo runs of both members (measure tools/plans/pairs1.json)")
    return 1 if args.check and not all(targets.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
