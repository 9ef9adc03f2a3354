"""``dprobe simulate fixed`` on a whole job log: time per policy pair, and the table at a sweep of sizes.

Timing (the default): the whole Philly log under one scheduling x quota policy pair in at most 60 s on one
core with the baseline forecaster, at most 3 minutes with dprobe's (``--checkpoint dprobe``). Each pair runs
in its own ``dprobe simulate`` call in this process; the CPU seconds it took (loading the log included) are
what one core spends.

Sweep (``--sweep 75,90,95,99``): one ``dprobe simulate fixed --gpus-percentile P`` call per percentile of
the log's concurrent demand (all five scheduling policies x static, reactive, forecast), printing per size
the cut in mean queueing delay of forecast-driven quotas against static quotas and against lending, whether
the targets are met, and beside them the *pooled* cluster: the same GPUs with no VCs at all (every job in one
queue), the reference a quota policy moves towards; and the slowest pair's seconds.

    .venv/bin/python benchmarks/simulate_fixed.py [--data DIR] [--gpus N] [--scheduling LIST]
        [--policy forecast] [--checkpoint dprobe] [--check]
    nice .venv/bin/python benchmarks/simulate_fixed.py --sweep 75,90,95,99 [--data DIR]
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
    """One ``dprobe simulate fixed`` run: CPU and wall seconds, and its mean queueing delay."""
    out = io.StringIO()
    cpu, wall = time.process_time(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = dprobe_main(["simulate", "fixed", "--quiet", "--json", "--scheduling", scheduling,
                            "--policies", policy, *extra])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if code:
        raise SystemExit(f"dprobe simulate exited {code}")
    run = json.loads(out.getvalue())["runs"][0]
    return {"scheduling": scheduling, "policy": policy, "cpu_seconds": cpu, "wall_seconds": wall,
            "mean_wait_seconds": run["mean_wait_seconds"], "jobs": run["jobs"]}


def pooled_waits(data: str | None, gpus: int, schedulings: list[str]) -> dict[str, float]:
    """Mean queueing delay per scheduling policy on the same GPUs with no VCs (one queue, no quotas)."""
    import numpy as np

    from dprobe.sim.fixed.cluster import FixedConfig, simulate_fixed
    from dprobe.sim.fixed.quota_split import StaticShares
    from dprobe.sim.fixed.scheduling import Scheduling
    from dprobe.sim.jobs import JobTable, load_selected

    _, _, jobs = load_selected(data, derive=True)
    one = JobTable(jobs.job_ids, np.zeros_like(jobs.vc), jobs.submit, jobs.duration, jobs.gpus, ["all"])
    return {s: float(np.nanmean(simulate_fixed(one, StaticShares(np.array([gpus])),
                                               FixedConfig(gpus=gpus, scheduling=Scheduling(s))).waits()))
            for s in schedulings}


def sweep(percentiles: list[float], data: str | None, schedulings: str, extra: list[str]) -> None:
    """The table at each size: cuts against static and reactive per scheduling policy, the pooled reference."""
    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.0f}"

    print("| size | GPUs | forecast vs static, mean wait cut % (" + " / ".join(schedulings.split(",")) +
          ") | forecast vs reactive | ≥ 50 % vs static | beats reactive | mean wait s: reactive / forecast / "
          "pooled (fifo; tiresias) | slowest pair s |")
    print("|---|---:|---|---|---|---|---|---:|")
    for p in percentiles:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = dprobe_main(["simulate", "fixed", "--quiet", "--json", "--gpus-percentile", f"{p:g}",
                                "--scheduling", schedulings, *extra])
        if code:
            raise SystemExit(f"dprobe simulate exited {code}")
        report = json.loads(out.getvalue())
        gpus = report["settings"]["gpus"]
        rows = report["reductions"]
        static = " / ".join(pct(r["forecast_vs_static"]["mean"]) for r in rows)
        reactive = " / ".join(pct(r["forecast_vs_reactive"]["mean"]) for r in rows)
        t = report["targets"]
        runs = {(r["scheduling"], r["quota"]): r for r in report["runs"]}
        pooled = pooled_waits(extra[extra.index("--data") + 1] if "--data" in extra else None, gpus,
                              [s for s in ("fifo", "tiresias") if s in schedulings.split(",")])
        waits = "; ".join(f"{runs[s, 'reactive']['mean_wait_seconds']:.0f} / "
                          f"{runs[s, 'forecast']['mean_wait_seconds']:.0f} / {pooled[s]:.0f}"
                          for s in pooled if (s, "reactive") in runs)
        slowest = max(r["wall_seconds"] for r in report["runs"])
        print(f"| p{p:g}{' (default)' if p == 90 else ''} | {gpus:,} | {static} | {reactive} | "
              f"{'met' if t['forecast_halves_static_wait']['met'] else 'missed'} | "
              f"{'met' if t['forecast_beats_reactive']['met'] else 'missed'} | {waits} | {slowest:.1f} |",
              flush=True)


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
    p.add_argument("--sweep", metavar="LIST",
                   help="percentiles of the concurrent demand to size the cluster at (e.g. 75,90,95,99): print "
                        "the table at each instead of timing")
    args = p.parse_args()
    extra = [*(["--data", args.data] if args.data else []),
             *(["--gpus", str(args.gpus)] if args.gpus else []),
             *(["--checkpoint", args.checkpoint] if args.checkpoint else [])]
    if args.sweep:
        if args.gpus:
            p.error("--sweep sizes the cluster itself: drop --gpus")
        sweep([float(x) for x in args.sweep.split(",")], args.data, args.scheduling, extra)
        return 0
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
