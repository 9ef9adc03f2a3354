"""``dprobe simulate``: replay a cluster job log under each quota policy and compare queueing and GPU use."""

from __future__ import annotations

import argparse
import math
import sys

from dprobe.sim.fixed_cli import FIXED_HELP, add_fixed_arguments, check_mode, run_fixed
from dprobe.sim.sharing_cli import SHARING_HELP, add_sharing_arguments, run_sharing

DESCRIPTION = """Replay a cluster job log (Philly or ITP layout) through per-VC GPU quotas that a policy
resets every --interval seconds, and report what each policy does to queueing and GPU use.

Jobs arrive at their submit time asking for their GPUs for their duration; a job starts when its VC's
free quota covers it (queue: backfill by default, or strict FIFO). Quota increases come into service
after --provision-delay seconds; decreases take effect at once but never preempt running jobs.
A job bigger than the policy's most for its VC is rejected.

policies:
  static    a fixed quota per VC: the --static-percentile of the VC's demand (every job started at
            submission) over the first --static-warmup of the log, at least the largest job seen there
            (chosen with hindsight), or --static-gpus for every VC
  reactive  the scaler's policy (dprobe.scaling.policy) fed the load now: GPUs held + GPUs queued
  forecast  the same policy fed the --quantile of the demand forecast --horizon ahead (the checkpoint's
            gpu_demand model with --checkpoint, else the last-value baseline with conformal quantiles)

example:
  dprobe simulate --start-day 30 --days 14 --per-vc
  dprobe simulate --data datasets/itp-elasticflow --json
  dprobe simulate --checkpoint dprobe           # the forecast policy on the forecaster shipped with dprobe"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="replay cluster job logs under GPU quota policies",
                              description=f"{DESCRIPTION}\n\n{FIXED_HELP}\n\n{SHARING_HELP}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    data = p.add_argument_group("jobs")
    data.add_argument("--data", metavar="DIR",
                      help="job log directory laid out like datasets/philly-jobs or datasets/itp-elasticflow "
                      "(default: the bundled philly-jobs)")
    data.add_argument("--vc", action="append", metavar="NAME",
                      help="simulate only this virtual cluster (ITP: cluster file name); repeatable; default all")
    data.add_argument("--days", type=float, metavar="N", help="only jobs submitted in the first N days (from "
                      "--start-day); the cluster starts empty")
    data.add_argument("--start-day", type=float, default=0.0, metavar="D",
                      help="skip the jobs submitted in the first D days of the log (default: %(default)g)")
    data.add_argument("--queue", choices=("backfill", "fifo"),
                      help="backfill: a later job that fits starts while the head waits (Kueue BestEffortFIFO); "
                      "fifo: nothing passes the head (default: backfill)")
    sim = p.add_argument_group("scaling")
    sim.add_argument("--policies", default="static,reactive,forecast",
                     help="comma-separated policies to compare (default: %(default)s)")
    sim.add_argument("--interval", type=float, default=600.0, metavar="S",
                     help="seconds between quota decisions (default: %(default)g)")
    sim.add_argument("--provision-delay", type=float, metavar="S",
                     help="seconds before a quota increase is usable (default: 300)")
    sim.add_argument("--horizon", type=float, metavar="S",
                     help="forecast lead in seconds (default: the provisioning delay rounded up to whole "
                     "intervals, at least one interval; with --fixed, one interval)")
    sim.add_argument("--quantile", type=float, default=0.9,
                     help="forecast quantile the forecast policy provisions for: 0.5, 0.9 or 0.99 "
                     "(default: %(default)g)")
    sim.add_argument("--scaler-config", metavar="FILE",
                     help="the scaler's YAML config (dprobe scaler --config): its virtual-cluster policy "
                     "(margin, tolerances, rate policies, stabilisation windows, min_gpus, max_gpus) "
                     "instead of the options below; demand stays counted in GPUs (target 1)")
    sim.add_argument("--margin", type=float,
                     help="safety margin on the demand, the scaler's margin (default: 0.1)")
    sim.add_argument("--tolerance", type=float,
                     help="no change while demand / quota is within this of 1, the scaler's tolerance "
                     "(default: 0.1)")
    sim.add_argument("--scale-up-tolerance", type=float, metavar="T",
                     help="tolerance above 1 only: raise the quota once demand exceeds it by more than this "
                     "(the scaler's scale_up_tolerance; default: --tolerance)")
    sim.add_argument("--scale-down-tolerance", type=float, metavar="T",
                     help="tolerance below 1 only (the scaler's scale_down_tolerance; default: --tolerance)")
    sim.add_argument("--scale-up-gpus", type=int, metavar="N",
                     help="a decision may add N GPUs to a VC's quota or double it, whichever is more: the "
                     "scaler's scale_up_policies [{type: percent, value: 100}, {type: pods, value: N}] "
                     "(default: 4, the HPA's)")
    sim.add_argument("--min-gpus", type=int, metavar="N",
                     help="least quota per VC, the scaler's min_gpus (default: 0)")
    sim.add_argument("--max-gpus", type=int, metavar="N",
                     help="most quota per VC, the scaler's max_replicas (default per VC: the most GPUs its "
                     "jobs would hold at once if each started at submission; with --fixed, at most --gpus)")
    sim.add_argument("--checkpoint", metavar="CKPT",
                     help="a trained dprobe checkpoint with a gpu_demand task for the forecast policy; "
                          "'dprobe': the forecaster shipped with dprobe")
    sim.add_argument("--static-gpus", type=int, metavar="N", help="static policy: this quota for every VC")
    sim.add_argument("--static-percentile", type=float, metavar="P",
                     help="static policy: percentile of the warm-up demand (default: 95)")
    sim.add_argument("--static-warmup", type=float, default=0.5, metavar="F",
                     help="static policy: share of the log, from its start, the percentile is taken over "
                     "(with --fixed: whose GPU-time sets the quotas; default: %(default)g)")
    add_fixed_arguments(p)
    add_sharing_arguments(p)  # --sharing: dprobe.sim.sharing_cli
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    out.add_argument("--per-vc", action="store_true", help="also report every VC")
    out.add_argument("--plot", metavar="FILE.png",
                     help="draw demand against quota for the busiest VC per policy and the wait-time CDF "
                     "(with --fixed: the wait-time CDF per scheduling policy and every VC's quota over time)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


# the options that set the scaler's policy (their defaults: ScalerSettings')
POLICY_FLAGS = ("margin", "tolerance", "scale_up_tolerance", "scale_down_tolerance", "scale_up_gpus", "min_gpus")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _policy_settings(policy: object) -> dict:
    """The simulated policy as JSON (its max_replicas aside: per VC, reported as max_gpus)."""
    import dataclasses

    doc = dataclasses.asdict(policy)  # type: ignore[call-overload]
    doc.pop("max_replicas")
    return doc


def _check(args: argparse.Namespace) -> list[str]:
    """The policies asked for; a ValueError for any option out of range."""
    from dprobe.sim.policies import POLICY_NAMES, ScalerSettings

    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [s for s in policies if s not in POLICY_NAMES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(POLICY_NAMES)}")
    if args.horizon is not None and not (math.isfinite(args.horizon) and args.horizon > 0):
        raise ValueError(f"--horizon must be a positive number of seconds, got {args.horizon:g}")
    given = [f for f in POLICY_FLAGS if getattr(args, f) is not None]
    if args.scaler_config and given:
        raise ValueError(f"--scaler-config sets the scaler's policy; set {', '.join(_flag(f) for f in given)} "
                         "in that file instead")
    for flag in POLICY_FLAGS:
        if getattr(args, flag) is None and not args.scaler_config:
            setattr(args, flag, getattr(ScalerSettings, flag))
    for flag in ("margin", "tolerance", "scale_up_tolerance", "scale_down_tolerance"):
        value = getattr(args, flag)
        if value is not None and not value >= 0:
            raise ValueError(f"{_flag(flag)} must be >= 0, got {value:g}")
    if args.scale_up_gpus is not None and args.scale_up_gpus < 1:
        raise ValueError(f"--scale-up-gpus must be >= 1, got {args.scale_up_gpus}")
    least = args.min_gpus or 0
    if least < 0 or (args.max_gpus is not None and args.max_gpus < max(1, least)):
        raise ValueError(f"need 0 <= --min-gpus <= --max-gpus and --max-gpus >= 1, got {least}, {args.max_gpus}")
    if args.static_gpus is not None and args.static_gpus < 0:
        raise ValueError(f"--static-gpus must be >= 0, got {args.static_gpus}")
    if args.static_percentile is not None and not 0 <= args.static_percentile <= 100:
        raise ValueError(f"--static-percentile must be between 0 and 100, got {args.static_percentile:g}")
    if not 0 < args.static_warmup <= 1:
        raise ValueError(f"--static-warmup must be in (0, 1], got {args.static_warmup:g}")
    return policies


def _scaler_settings(args: argparse.Namespace):
    """The scaler settings of the options checked by ``_check``, or of ``--scaler-config``."""
    from dprobe.sim.policies import ScalerSettings

    if args.scaler_config:
        from dprobe.services.scaler.config import load_config

        return ScalerSettings(configured=load_config({"config": args.scaler_config}, env={}).gpu_policy())
    return ScalerSettings(margin=args.margin, tolerance=args.tolerance, min_gpus=args.min_gpus,
                          scale_up_tolerance=args.scale_up_tolerance,
                          scale_down_tolerance=args.scale_down_tolerance, scale_up_gpus=args.scale_up_gpus)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from dprobe.core.plots import check_plot_path
    from dprobe.forecaster.loading import checkpoint_path
    from dprobe.sim.cluster import SimConfig, check_span, simulate
    from dprobe.sim.jobs import DAY, load_selected, peak_demand
    from dprobe.sim.policies import (
        ForecastQuota,
        ReactiveQuota,
        StaticQuota,
        forecast_setup,
        static_quotas,
    )
    from dprobe.sim.report import markdown_table, plot_results, policy_report, print_report

    if args.sharing:  # pods packed onto shared GPUs: dprobe.sim.sharing_cli
        return run_sharing(args)
    names = _check(args)
    check_mode(args)
    if args.fixed:
        settings = _scaler_settings(args)
        return run_fixed(args, names, settings, _policy_settings(settings.base()))
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
    settings = _scaler_settings(args)  # a bad --scaler-config is refused before the log is read
    dataset, directory, jobs = load_selected(args.data, args.vc, args.days, args.start_day)
    check_span(jobs, min(args.interval, setup.history_step if setup else math.inf))

    n_vcs = len(jobs.vc_names)
    max_gpus = np.full(n_vcs, args.max_gpus) if args.max_gpus else peak_demand(jobs)
    static = (np.full(n_vcs, args.static_gpus) if args.static_gpus is not None
              else static_quotas(jobs, args.static_percentile, args.static_warmup, args.interval))
    progress = not args.quiet and sys.stderr.isatty()
    results = []
    for name in names:
        if name == "static":
            policy = StaticQuota(static)
        elif name == "reactive":
            policy = ReactiveQuota(max_gpus, settings)
        else:
            policy = ForecastQuota(max_gpus, settings, setup.forecaster, setup.history_step, setup.lead,
                                   args.quantile, setup.context_steps, setup.covariates)
        results.append(simulate(jobs, policy, config, progress=progress))

    report = {
        "dataset": dataset, "data": str(directory), "jobs": len(jobs), "vcs": jobs.vc_names,
        "log_days": float(jobs.submit[-1] - jobs.submit[0]) / DAY,
        "forecaster": setup.name if setup else None,
        "settings": {
            "interval_seconds": args.interval, "provision_delay_seconds": args.provision_delay,
            "horizon_seconds": horizon, "quantile": args.quantile, "queue": args.queue,
            "scaler_config": args.scaler_config, "policy": _policy_settings(settings.base()),
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
