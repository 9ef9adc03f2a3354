"""``dprobe simulate fixed``: a cluster of fixed size, quota moved between VCs, five scheduling policies."""

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

HELP = ("the same job logs on a cluster of fixed size: quota moved between VCs under five scheduling policies "
        "(fifo, sjf, qssf, tiresias, easy)")
DESCRIPTION = """Replay a cluster job log on a cluster of fixed size: its GPUs are split into VC quotas that a
policy may move between VCs, and a scheduling policy serves each VC's queue.

The cluster has --gpus GPUs (default: the --gpus-percentile, 90, of the log's concurrent demand: the GPUs
its jobs would hold if each started at submission, sampled every --interval from the first submission to
the last, rounded up to whole nodes; so GPUs are short about a tenth of the time) on nodes of
--gpus-per-node; a job's GPUs go on as few nodes as possible (it waits while they are scattered). The
GPUs are split into VC quotas that sum to the total, and every --scheduling policy runs under every quota
policy of --policies:
  static    quotas proportional to each VC's GPU-time in the first --static-warmup of the log; no lending
  reactive  the static quotas; GPUs a VC leaves idle (neither held nor asked for by its queue) for
            --lend-delay seconds are lent to other VCs, and reclaimed when their VC needs them: by waiting
            for the borrowing jobs to finish, or with --preempt by preempting the most recently started,
            each paying --restart-cost seconds when it restarts
  forecast  every --interval, the scaler's per-VC target on the --quantile of the demand forecast
            --horizon-seconds ahead (default one interval), normalised to the total; idle GPUs lent as reactive
scheduling within a VC (--scheduling):
  fifo      first submitted first; nothing passes the head
  sjf       shortest logged duration first (an oracle); nothing passes the head
  qssf      least estimated GPU-time first (Helios): duration from the same user's finished jobs, else the
            VC's (the bundled logs have no user column: the VC's); nothing passes the head
  tiresias  discretised 2D-LAS: queues by GPU-seconds received (--las-thresholds, default 18000: two
            queues), FIFO within a queue, higher queues preempt lower ones; a queued job of a lower queue
            that has waited --starve-limit times as long as it has run goes back to the highest queue
  easy      EASY backfilling: FIFO, later jobs start if estimated (as qssf) not to delay the head
--data may also be a helios-earth-vc directory: a job log is then derived from its per-minute VC counts
(arrivals and departures from the changes of the job counts, oldest jobs leaving first; docs/simulate.md).
A job asking for more GPUs than the cluster, or than its VC can ever hold (static: its quota), is
excluded and counted. Reported per pair: queueing delay (mean, p95, p99), JCT, GPU utilisation,
preemptions, GPUs of quota moved, GPU-hours lent; and the cuts against static and against reactive.

example:
  dprobe simulate fixed --start-day 30 --days 14
  dprobe simulate fixed --scheduling fifo,tiresias --preempt --json
  dprobe simulate fixed --data datasets/helios-earth-vc --plot fixed.png

`dprobe simulate --fixed ...` is the old spelling of this sub-command, and still works."""

# the options of the fixed-size cluster (flag: type, metavar, help); DESCRIPTION says more
CLUSTER_OPTIONS = {
    "--gpus": (int, "N", "the cluster's GPUs, a multiple of --gpus-per-node (default: --gpus-percentile)"),
    "--gpus-percentile": (float, "P", "without --gpus, size the cluster at this percentile of the log's "
                          "concurrent demand, rounded up to whole nodes (default: 90; 100: the peak)"),
    "--gpus-per-node": (int, "G", "GPUs per node; a job goes on as few nodes as possible (default: 8)"),
    "--scheduling": (str, "LIST", "of fifo,sjf,qssf,tiresias,easy, comma-separated (default: all five)"),
    "--las-thresholds": (str, "LIST", "tiresias: GPU-seconds that move a job down a queue (default: 18000)"),
    "--starve-limit": (float, "K", "tiresias: a queued job of a lower queue that has waited K times as long as it "
                       "has run is promoted to the highest queue (default: 2; 0: never)"),
}
LENDING_OPTIONS = {
    "--lend-delay": (float, "S", "seconds a VC's GPUs stay idle before they are lent (default: 300)"),
    "--restart-cost": (float, "S", "seconds a preempted job spends again on restart (default: 60)"),
}
PREEMPT_HELP = "reclaim lent GPUs by preempting the borrowing jobs (default: wait for them to finish)"


def register(simulators: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``fixed`` to ``dprobe simulate``'s sub-commands; returns its parser."""
    p = simulators.add_parser("fixed", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_log_arguments(p, "job log directory laid out like datasets/philly-jobs or datasets/itp-elasticflow, "
                          "or a helios-earth-vc directory, a log derived from its counts (default: the bundled "
                          "philly-jobs)")
    add_scaling_arguments(
        p, provision_delay=False, horizon_help="forecast horizon in seconds (default: one interval)",
        max_gpus_help="most quota per VC, the scaler's max_replicas (default per VC: the most GPUs its jobs "
        "would hold at once if each started at submission, at most --gpus)")
    p.add_argument_group("static policy").add_argument(
        "--static-warmup", type=float, default=0.5, metavar="F",
        help="share of the log, from its start, whose GPU-time sets the quotas (default: %(default)g)")
    cluster = p.add_argument_group("fixed-size cluster")
    for flag, (kind, metavar, text) in CLUSTER_OPTIONS.items():
        cluster.add_argument(flag, type=kind, metavar=metavar, help=text)
    lending = p.add_argument_group("lending (reactive, forecast)")
    for flag, (kind, metavar, text) in LENDING_OPTIONS.items():
        lending.add_argument(flag, type=kind, metavar=metavar, help=text)
    lending.add_argument("--preempt", action="store_true", help=PREEMPT_HELP)
    add_output_arguments(p, "draw the wait-time CDF per scheduling policy and every VC's quota over time")
    p.set_defaults(func=run)
    return p


def _schedulings(args: argparse.Namespace) -> list:
    from dprobe.sim.fixed.scheduling import (
        DEFAULT_LAS_THRESHOLDS,
        DEFAULT_STARVE_LIMIT,
        SCHEDULING_NAMES,
        Scheduling,
    )

    names = [s.strip() for s in (args.scheduling or ",".join(SCHEDULING_NAMES)).split(",") if s.strip()]
    unknown = [s for s in names if s not in SCHEDULING_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown scheduling policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(SCHEDULING_NAMES)}")
    thresholds = DEFAULT_LAS_THRESHOLDS
    if args.las_thresholds:
        try:
            thresholds = tuple(float(x) for x in args.las_thresholds.split(","))
        except ValueError:
            raise ValueError("--las-thresholds must be comma-separated GPU-seconds, "
                             f"got {args.las_thresholds!r}") from None
    starve = DEFAULT_STARVE_LIMIT if args.starve_limit is None else args.starve_limit
    return [Scheduling(n, thresholds, starve) for n in dict.fromkeys(names)]


DEFAULT_GPUS_PERCENTILE = 90.0


def _peak(jobs) -> int:
    """The most GPUs the log's jobs would hold at once if each started at submission."""
    import numpy as np

    from dprobe.sim.jobs import JobTable, peak_demand

    one = JobTable(jobs.job_ids, np.zeros_like(jobs.vc), jobs.submit, jobs.duration, jobs.gpus, ["all"])
    return int(peak_demand(one)[0]) if len(jobs) else 0


def concurrent_demand(jobs, step: float):
    """The GPUs all the log's jobs would hold if each started at submission (no queueing), sampled every
    ``step`` seconds from the first submission to the last."""
    import numpy as np

    from dprobe.sim.jobs import JobTable, sample_step_function, unconstrained_demand

    if not len(jobs):
        return np.zeros(0)
    one = JobTable(jobs.job_ids, np.zeros_like(jobs.vc), jobs.submit, jobs.duration, jobs.gpus, ["all"])
    times, values = unconstrained_demand(one, 1)
    grid = np.arange(float(jobs.submit[0]), float(jobs.submit[-1]) + step, step)
    return sample_step_function(times[0], values[0], grid).astype(np.float64)


def default_gpus(jobs, percentile: float, step: float, per_node: int) -> int:
    """The cluster size of the rule: the ``percentile`` of :func:`concurrent_demand` (100: the peak), rounded
    up to whole nodes, at least one node."""
    import numpy as np

    level = _peak(jobs) if percentile == 100 else float(np.percentile(concurrent_demand(jobs, step), percentile))
    return max(1, math.ceil(level / per_node)) * per_node


def run(args: argparse.Namespace) -> int:
    """``dprobe simulate fixed``: the options checked, then :func:`run_fixed`."""
    names = check_scaling(args)
    check_static_warmup(args)
    settings = scaler_settings(args)
    return run_fixed(args, names, settings, policy_settings(settings.base()))


def run_fixed(args: argparse.Namespace, names: list[str], settings, policy_doc: dict) -> int:
    """``dprobe simulate fixed`` for the quota policies ``names``, with the scaler ``settings`` (a
    :class:`~dprobe.sim.policies.ScalerSettings`, described by ``policy_doc``), all checked by the caller."""
    import numpy as np

    from dprobe.core.plots import check_plot_path
    from dprobe.forecaster.loading import checkpoint_path
    from dprobe.sim.fixed.cluster import FixedConfig, simulate_fixed
    from dprobe.sim.fixed.quota_split import (
        FixedQuotaPolicy,
        ForecastShares,
        Lending,
        StaticShares,
        static_shares,
    )
    from dprobe.sim.fixed.report import fixed_markdown, plot_fixed, reductions, run_report, targets
    from dprobe.sim.jobs import DAY, load_selected, peak_demand
    from dprobe.sim.policies import ForecastQuota, forecast_setup
    from dprobe.sim.replay import check_span
    from dprobe.sim.report import print_report

    scheds = _schedulings(args)
    per_node = 8 if args.gpus_per_node is None else args.gpus_per_node
    lend_delay = 300.0 if args.lend_delay is None else args.lend_delay
    restart = 60.0 if args.restart_cost is None else args.restart_cost
    FixedConfig(gpus=args.gpus or per_node, gpus_per_node=per_node, interval=args.interval,
                lend_delay=lend_delay, restart_cost=restart)  # checks the options before the log is read
    if args.gpus is not None and args.gpus_percentile is not None:
        raise ValueError("give --gpus or --gpus-percentile, not both")
    percentile = DEFAULT_GPUS_PERCENTILE if args.gpus_percentile is None else args.gpus_percentile
    if not 0 < percentile <= 100:
        raise ValueError(f"--gpus-percentile must be in (0, 100], got {percentile:g}")
    if args.plot:
        check_plot_path(args.plot)
    horizon = args.horizon or args.interval
    setup = (forecast_setup(checkpoint_path(args.checkpoint), args.interval, horizon, args.quantile)
             if "forecast" in names else None)
    dataset, directory, jobs = load_selected(args.data, args.vc, args.days, args.start_day, derive=True)
    check_span(jobs, min(args.interval, setup.history_step if setup else math.inf))
    peak = _peak(jobs)
    gpus = args.gpus or default_gpus(jobs, percentile, args.interval, per_node)
    shares = static_shares(jobs, gpus, args.static_warmup)
    most = np.full(len(jobs.vc_names), args.max_gpus) if args.max_gpus else peak_demand(jobs)
    max_gpus = np.minimum(most, gpus)
    progress = not args.quiet and sys.stderr.isatty()
    results = []
    for sched in scheds:
        config = FixedConfig(gpus=gpus, gpus_per_node=per_node, scheduling=sched, interval=args.interval,
                             lend_delay=lend_delay, preempt=args.preempt, restart_cost=restart)
        for name in names:
            policy: FixedQuotaPolicy
            if name == "static":
                policy = StaticShares(shares)
            elif name == "reactive":
                policy = Lending(shares)
            elif setup is None:  # made above whenever "forecast" is among the policies
                raise ValueError(f"policy {name!r} needs a forecaster")
            else:  # a fresh recommender per run: it keeps state
                inner = ForecastQuota(max_gpus, settings, setup.forecaster, setup.history_step, setup.lead_steps,
                                      args.quantile, setup.context_steps, setup.covariates)
                policy = ForecastShares(shares, inner)
            results.append(simulate_fixed(jobs, policy, config, progress=progress))
    rows = reductions(results)
    report = {
        "dataset": dataset, "data": str(directory), "mode": "fixed", "jobs": len(jobs), "vcs": jobs.vc_names,
        "log_days": float(jobs.submit[-1] - jobs.submit[0]) / DAY,
        "forecaster": setup.name if setup else None,
        "settings": {
            "gpus": gpus,
            "gpus_from": "--gpus" if args.gpus else f"p{percentile:g} of the concurrent demand, whole nodes",
            "peak_demand_gpus": peak,
            "gpus_per_node": per_node, "nodes": gpus // per_node,
            "scheduling": [s.name for s in scheds], "las_thresholds": list(scheds[0].las_thresholds),
            "starve_limit": scheds[0].starve_limit,
            "interval_seconds": args.interval, "horizon_seconds": horizon, "quantile": args.quantile,
            "lend_delay_seconds": lend_delay, "preempt": args.preempt, "restart_cost_seconds": restart,
            "static_warmup": args.static_warmup,
            "users": "none in the log: qssf and easy estimate durations from the VC's finished jobs",
            "scaler_config": args.scaler_config, "policy": policy_doc,
            "max_gpus": dict(zip(jobs.vc_names, max_gpus.tolist(), strict=True)),
            "static_gpus": dict(zip(jobs.vc_names, shares.tolist(), strict=True)),
        },
        "runs": [run_report(r, per_vc=args.per_vc) for r in results],
        "reductions": rows,
        "targets": targets(rows),
    }
    print_report(report, args.json, fixed_markdown)
    if args.plot:
        print(f"plot written to {plot_fixed(results, args.plot)}", file=sys.stderr)
    return 0
