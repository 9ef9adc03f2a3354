"""Time ``dprobe simulate --fixed`` on a whole job log, one scheduling x quota policy pair at a time.

Target: the whole Philly log under one policy pair in at most 60 s on one core with the
baseline forecaster, at most 3 minutes with dprobe's (``--checkpoint dprobe``). Each pair runs in its own
``dprobe simulate`` call in this process; the CPU seconds it took (loading the log included) are what
one core spends.

    .venv/bin/python benchmarks/simulate_fixed.py [--data DIR] [--gpus N] [--scheduling LIST]
        [--policy forecast] [--checkpoint dprobe] [--check]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time

from dprobe.cli import main as dprobe_main


def time_pair(scheduling: str, policy: str, extra: list[str]) -> dict:
    """One ``dprobe simulate --fixed`` run: CPU and wall seconds, and its mean queueing delay."""
    out = io.StringIO()
    cpu, wall = time.process_time(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = dprobe_main(["simulate", "--fixed", "--quiet", "--json", "--scheduling", scheduling,
                            "--policies", policy, *extra])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if code:
        raise SystemExit(f"dprobe simulate exited {code}")
    run = json.loads(out.getvalue())["runs"][0]
    return {"scheduling": scheduling, "policy": policy, "cpu_seconds": cpu, "wall_seconds": wall,
            "mean_wait_seconds": run["mean_wait_seconds"], "jobs": run["jobs"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="job log directory (default: the bundled philly-jobs)")
    p.add_argument("--gpus", type=int, metavar="N",
                   help="the cluster's GPUs (default: the log's peak demand)")
    p.add_argument("--scheduling", default="fifo,sjf,qssf,tiresias,easy",
                   help="scheduling policies, each timed alone (default: %(default)s)")
    p.add_argument("--policy", default="forecast", help="quota policy (default: %(default)s, the slowest)")
    p.add_argument("--checkpoint", metavar="CKPT",
                   help="the forecast policy's checkpoint ('dprobe': the shipped one)")
    p.add_argument("--check", action="store_true", help="exit 1 when a pair is over the target")
    args = p.parse_args()
    extra = [*(["--data", args.data] if args.data else []),
             *(["--gpus", str(args.gpus)] if args.gpus else []),
             *(["--checkpoint", args.checkpoint] if args.checkpoint else [])]
    target = 180.0 if args.checkpoint else 60.0
    over = False
    for scheduling in args.scheduling.split(","):
        r = time_pair(scheduling, args.policy, extra)
        verdict = "PASS" if r["cpu_seconds"] <= target else "OVER"
        over |= verdict == "OVER"
        print(f"{scheduling}/{args.policy}: {r['cpu_seconds']:.1f} s CPU ({r['wall_seconds']:.1f} s wall), "
              f"{r['jobs']} jobs, mean wait {r['mean_wait_seconds']:.0f} s; "
              f"target <= {target:.0f} s: {verdict}")
    return 1 if over and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
