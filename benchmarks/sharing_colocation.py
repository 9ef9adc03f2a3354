"""The co-location slowdown model against measured pairs: speed under co-location relative to alone.

Reads any directory laid out like datasets/h200-profiles (its runs.csv): every co-located job whose pair
has a solo run of both members (same configuration; the same collection preferred). Prints the measured
speed beside the model's prediction (from the two solo utilisations alone), no slowdown (1) and the
saturation bound min(1, 1 / (u1 + u2)), and the MAE of each. Target: MAE <= 0.04 (no slowdown 0.097,
saturation 0.081 on the data the target was set on).

    .venv/bin/python benchmarks/sharing_colocation.py [--data DIR] [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="directory laid out like datasets/h200-profiles (default: the bundled one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when the target is missed or nothing is scored")
    args = ap.parse_args(argv)

    import numpy as np
    import pandas as pd

    from dprobe.data.registry import bundled_dir
    from dprobe.sharing.interference import evaluate_pairs

    directory = Path(args.data) if args.data else bundled_dir("h200-profiles")
    rows = evaluate_pairs(pd.read_csv(directory / "runs.csv"))
    mae = {m: float(np.mean([abs(r[m] - r["speed"]) for r in rows])) if rows else None
           for m in ("model", "no_slowdown", "saturation")}
    ok = mae["model"] is not None and mae["model"] <= 0.04
    if args.json:
        json.dump({"data": str(directory), "jobs": rows, "mae": mae, "target_met": ok}, sys.stdout)
        print()
    else:
        print(f"{directory}: {len(rows)} co-located jobs with solo runs of both members\n")
        print("| pair | job | solo run (same collection) | utilisation alone | measured speed | model | no slowdown | saturation |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['pair']} | {r['job']} | {r['solo_run']} ({'yes' if r['same_collection'] else 'no'}) | "
                  f"{100 * r['utilization_alone']:.0f} % | {r['speed']:.3f} | {r['model']:.3f} | 1.000 | "
                  f"{r['saturation']:.3f} |")
        if rows:
            print(f"\nMAE: model {mae['model']:.3f}, no slowdown {mae['no_slowdown']:.3f}, "
                  f"saturation {mae['saturation']:.3f}")
            print(f"{'PASS' if ok else 'MISS'}  speed MAE <= 0.04")
        else:
            print("no pair has solo runs of both members: nothing to score (measure tools/plans/pairs1.json)")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
