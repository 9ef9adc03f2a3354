"""Write dprobe/sharing/lab_profiles.json: ``dprobe predict``'s profile of each co-located run of an
h200-profiles-like data set (the jobs of the pairs measured in another lab than Gavel's), which the
co-location model's lab-left-out validation reads (dprobe.sharing.interference_fit.lab_pairs).

Each run is predicted alone by the same function ``dprobe predict`` calls (predict_job), on the GPU the data
set was measured on, with its model, batch, precision, optimizer, image and sequence length.

    .venv/bin/python tools/pair_profiles.py [--data datasets/h200-profiles] [--gpu h200] [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    from dprobe.profiling.coldstart.predict import predict_job
    from dprobe.sharing.interference_fit import LAB_PROFILES, run_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "datasets" / "h200-profiles"), help="an h200-profiles-like directory")
    ap.add_argument("--gpu", default="h200", help="the GPU its runs were measured on (dprobe predict --gpu)")
    ap.add_argument("--write", action="store_true", help=f"write {LAB_PROFILES.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    runs = pd.read_csv(Path(args.data) / "runs.csv")
    profiles = {}
    for _, job in runs[runs["kind"] == "colocated"].iterrows():
        name, kw = run_model(job)
        profiles[job["run_id"]] = predict_job(name, gpu=args.gpu, **kw).as_dict()
        print(f"{job['run_id']}: {name} batch {kw['batch']}: utilisation "
              f"{profiles[job['run_id']]['gpu_utilization']['p50']:.3f}", file=sys.stderr)
    doc = {"about": f"dprobe predict's profile of each co-located run of {Path(args.data).name} "
                    "(tools/pair_profiles.py --write)", "gpu": args.gpu, "profiles": profiles}
    if args.write:
        LAB_PROFILES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {LAB_PROFILES}", file=sys.stderr)
    else:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
