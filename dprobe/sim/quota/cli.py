"""``dprobe simulate quota``: replay a cluster job log under each quota policy and compare queueing and GPU
use."""

from __future__ import annotations

import argparse
import math
import sys

from dprobe.sim.options import (
    add_job_log_arguments,
    add_output_arguments,
    add_scaling_arguments,
    check_scaling,
    check_static_warmup,
    policy_settings,
    scaler_settings,
)

HELP = ("a cluster job log (Philly, ITP) replayed through per-VC GPU quotas that a policy (static, reactive, "
        "forecast) resets every interval: queueing against GPU-hours")
DESCRIPTION = """Replay a cluster job log (Philly or ITP layout) through per-VC GPU quotas that a policy resets
every --interval seconds, and report what each policy does to queueing and GPU use.

Jobs arrive at their submit time asking for their GPUs for their duration; a job starts when its VC's
free quota covers it (queue: backfill by default, or strict FIFO). Quota increases come into service
after --provision-delay seconds; decreases take effect at once but never preempt running jobs.
A job bigger than the policy's most for its VC is rejected.

policies:
  static    a fixed quota per VC: the --static-percentile of the VC's demand (every job started at
            submission) over the first --static-warmup of the log, at least the largest job seen there
            (chosen with hindsight), or --static-gpus for every VC
  reactive  the scaler's policy (dprobe.scaling.policy) fed the load now: GPUs held + GPUs queued
  forecast  the same policy fed the --quantile of the demand forecast --horizon-seconds ahead (the
            checkpoint's gpu_demand model with --checkpoint, else the last-value baseline with conformal
            quantiles)

example:
  dprobe simulate quota --start-day 30 --days 14 --per-vc
  dprobe simulate quota --data datasets/itp-elasticflow --json
  dprobe simulate quota --checkpoint dprobe     # the forecast policy on the forecaster shipped with dprobe

`dprobe simulate [options]` without a sub-command is this simulation too."""


def register(simulators: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``quota`` to ``dprobe simulate``'s sub-commands; returns its parser."""
    p = simulators.add_parser("quota", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    data = add_job_log_arguments(p, "job log directory laid out like datasets/philly-jobs or "
                                 "datasets/itp-elasticflow (default: the bundled philly-jobs)")
    data.add_argument("--queue", choices=("backfill", "fifo"),
                      help="backfill: a later job that fits starts while the head waits (Kueue BestEffortFIFO); "
                      "fifo: nothing passes the head (default: backfill)")
    add_scaling_arguments(
        p, provision_delay=True,
        horizon_help="forecast horizon in seconds (default: the provisioning delay rounded up to whole intervals, "
        "at least one interval)",
        max_gpus_help="most quota per VC, the scaler's max_replicas (default per VC: the most GPUs its jobs "
        "would hold at once if each started at submission)")
    static = p.add_argument_group("static policy")
    static.add_argument("--static-gpus", type=int, metavar="N", help="this quota for every VC")
    static.add_argument("--static-percentile", type=float, metavar="P",
                        help="percentile of the warm-up demand (default: 95)")
    static.add_argument("--static-warmup", type=float, default=0.5, metavar="F",
                        help="share of the log, from its start, the percentile is taken over (default: %(default)g)")
    add_output_arguments(p, "draw demand against quota for the busiest VC per policy and the wait-time CDF")
    p.set_defaults(func=run)
    return p


def _check(args: argparse.Namespace) -> list[str]:
    """The policies asked for; a ValueError for any option out of range."""
    policies = check_scaling(args)
    if args.static_gpus is not None and args.static_gpus < 0:
        raise ValueError(f"--static-gpus must be >= 0, got {args.static_gpus}")
    if args.static_percentile is not None and not 0 <= args.static_percentile <= 100:
        raise ValueError(f"--static-percentile must be between 0 and 100, got {args.static_percentile:g}")
    check_static_warmup(args)
    return policies


def run(args: argparse.Namespace) -> int:
    """``dprobe simulate quota``."""
    import numpy as np

    from dprobe.core.plots import check_plot_path
    from dprobe.forecaster.loading import checkpoint_path
    from dprobe.sim.jobs import DAY, load_selected, peak_demand
    from dprobe.sim.policies import (
        ForecastQuota,
        QuotaPolicy,
        ReactiveQuota,
        StaticQuota,
        forecast_setup,
        static_quotas,
    )
    from dprobe.sim.quota.cluster import SimConfig, simulate
    from dprobe.sim.quota.report import markdown_table, plot_results, policy_report
    from dprobe.sim.replay import check_span
    from dprobe.sim.report import print_report

    names = _check(args)
    args.queue = args.queue or "backfill"
    args.provision_delay = 300.0 if args.provision_delay is None else args.provision_delay
    args.static_percentile = 95.0 if args.static_percentile is None else args.static_percentile
    if args.plot:
        check_plot_path(args.plot)
    config = SimConfig(interval=args.interval, provision_delay=args.provision_delay,
                       backfill=args.queue == "backfill")
    horizon = args.horizon or max(1, math.ceil(args.provision_delay / args.interval - 1e-9)) * args.interval
    setup = (forecast_setup(checkpoint_path(args.checkpoint), args.interval, horizon, args.quantile)
             if "forecast" in names else None)
    settings = scaler_settings(args)  # a bad --scaler-config is refused before the log is read
    dataset, directory, jobs = load_selected(args.data, args.vc, args.days, args.start_day)
    check_span(jobs, min(args.interval, setup.history_step if setup else math.inf))

    n_vcs = len(jobs.vc_names)
    max_gpus = np.full(n_vcs, args.max_gpus) if args.max_gpus else peak_demand(jobs)
    static = (np.full(n_vcs, args.static_gpus) if args.static_gpus is not None
              else static_quotas(jobs, args.static_percentile, args.static_warmup, args.interval))
    progress = not args.quiet and sys.stderr.isatty()
    results = []
    for name in names:
        policy: QuotaPolicy
        if name == "static":
            policy = StaticQuota(static)
        elif name == "reactive":
            policy = ReactiveQuota(max_gpus, settings)
        elif setup is None:  # made above whenever "forecast" is among the policies
            raise ValueError(f"policy {name!r} needs a forecaster")
        else:
            policy = ForecastQuota(max_gpus, settings, setup.forecaster, setup.history_step, setup.lead_steps,
                                   args.quantile, setup.context_steps, setup.covariates)
        results.append(simulate(jobs, policy, config, progress=progress))

    report = {
        "dataset": dataset, "data": str(directory), "jobs": len(jobs), "vcs": jobs.vc_names,
        "log_days": float(jobs.submit[-1] - jobs.submit[0]) / DAY,
        "forecaster": setup.name if setup else None,
        "settings": {
            "interval_seconds": args.interval, "provision_delay_seconds": args.provision_delay,
            "horizon_seconds": horizon, "quantile": args.quantile, "queue": args.queue,
            "scaler_config": args.scaler_config, "policy": policy_settings(settings.base()),
            "max_gpus": dict(zip(jobs.vc_names, max_gpus.tolist(), strict=True)),
            "static_gpus": dict(zip(jobs.vc_names, static.tolist(), strict=True)),
            "static_percentile": args.static_percentile, "static_warmup": args.static_warmup,
        },
        "policies": [policy_report(r, per_vc=args.per_vc) for r in results],
    }
    print_report(report, args.json, markdown_table)
    if args.plot:
        path = plot_results(results, args.plot)
        print(f"plot written to {path}", file=sys.stderr)
    return 0
