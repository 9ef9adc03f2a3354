"""``dprobe simulate --sharing``: the GenAI pods packed onto shared GPUs by policy, scored against what they
did afterwards (:mod:`dprobe.sim.sharing`)."""

from __future__ import annotations

import argparse
import math
import sys

SHARING_POLICIES = ("one-per-gpu", "peak", "peak-headroom", "last-value", "dprobe", "oracle")
DEFAULT_SHARING_POLICIES = ",".join(SHARING_POLICIES)
GB = 1e9

SHARING_HELP = """--sharing: pods of a serving trace (alibaba-genai-2026 layout: per-pod GPU memory and duty cycle,
--data DIR, default the bundled one) are repacked onto shared GPUs of --gpu-memory GB every --repack-steps
steps from the demand each policy sees then, and every step is scored with what the pods measured:
GPU-hours, pod-minutes on a GPU whose memory overflowed, GPU-minutes with summed duty cycle over 100 %,
moves per hour. Only each pod's last 30 % (its test span, never trained on) is scored. The trace's
memory values are scaled for anonymity: GPU sizes are compared against the scaled values.

sharing policies (--sharing-policies):
  one-per-gpu    no sharing: every pod keeps a GPU of its own (the reference)
  peak           each pod's peak memory over the last --history-hours (and the --duty-quantile of its
                 duty cycle)
  peak-headroom  the same plus --headroom on memory
  dprobe         the forecaster (--checkpoint, default the shipped one) over the next interval: the
                 --memory-quantile of memory as the pod's size, and room on its GPU for a burst to the
                 larger of the --burst-quantile forecast and its peak over --history-hours (each GPU
                 keeps room for its tenants' largest burst and --burst-overlap of the others', or
                 with --burst-combine rss the root of the sum of their squares);
                 --duty-quantile of duty
  last-value     the same rules on the last-value baseline's conformal quantiles
  oracle         each pod's measured peak memory and --duty-quantile of duty cycle over the coming
                 interval (hindsight)

example:
  dprobe simulate --sharing --gpu-memory 80 --plot sharing.png
  dprobe simulate --sharing --gpu-memory 48 --json"""


def add_sharing_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPU sharing (--sharing)")
    g.add_argument("--sharing", action="store_true",
                   help="pack serving pods onto shared GPUs by policy instead of replaying a job log")
    g.add_argument("--gpu-memory", type=float, default=80.0, metavar="GB",
                   help="memory of each GPU in GB (1e9 bytes), e.g. 48, 80, 141 (default: %(default)g)")
    g.add_argument("--repack-steps", type=int, default=30, metavar="N",
                   help="steps of the trace between repackings (default: %(default)d, 28.5 min at 57 s)")
    g.add_argument("--sharing-policies", default=DEFAULT_SHARING_POLICIES,
                   help="comma-separated sharing policies to compare (default: %(default)s)")
    g.add_argument("--packing", choices=("first-fit", "best-fit", "frag-aware", "fgd"), default="best-fit",
                   help="how the planner places pods, largest first (default: %(default)s)")
    g.add_argument("--history-hours", type=float, default=2.0, metavar="H",
                   help="look-back of the peak policies and of dprobe's burst room (default: %(default)g)")
    g.add_argument("--headroom", type=float, default=0.1, metavar="F",
                   help="peak-headroom: share added to the peak (default: %(default)g)")
    g.add_argument("--memory-quantile", type=float, default=0.5,
                   help="dprobe / last-value: forecast quantile of memory packed as the pod's size, 0.5, 0.9 "
                   "or 0.99 (default: %(default)g)")
    g.add_argument("--burst-quantile", type=float, default=0.99,
                   help="dprobe / last-value: forecast quantile a GPU keeps room for (default: %(default)g)")
    g.add_argument("--duty-quantile", type=float, default=0.9,
                   help="quantile of duty cycle summed under 100 %% per GPU (default: %(default)g)")
    g.add_argument("--burst-overlap", type=float, default=0.0, metavar="F",
                   help="dprobe / last-value: besides its tenants' largest burst, a GPU keeps room for this "
                   "share of the others' (0: one burst at a time, 1: all at once; default: %(default)g, "
                   "chosen on the validation span)")
    g.add_argument("--burst-combine", choices=("max", "rss"), default="max",
                   help="dprobe / last-value: how a GPU sums its tenants' bursts: max (the largest, plus "
                   "--burst-overlap of the others') or rss (root of the sum of squares, a quantile of a sum of "
                   "independent bursts; default: %(default)s, chosen on the validation span)")
    g.add_argument("--memory-margin", type=float, default=0.0, metavar="F",
                   help="dprobe / last-value: share added to the memory forecasts (default: %(default)g)")
    g.add_argument("--fresh-repack", action="store_true",
                   help="pack from scratch at every repack; by default pods stay on their GPUs where they "
                   "still fit unless packing afresh needs fewer GPUs (fewer moves)")
    g.add_argument("--span", choices=("test", "validation"), default="test",
                   help="score each pod's test span (default) or its validation span, to choose settings on")


def _check(args: argparse.Namespace) -> list[str]:
    names = [s.strip() for s in args.sharing_policies.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHARING_POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown sharing policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(SHARING_POLICIES)}")
    if not (math.isfinite(args.gpu_memory) and args.gpu_memory > 0):
        raise ValueError(f"--gpu-memory must be a positive number of GB, got {args.gpu_memory:g}")
    if args.repack_steps < 1:
        raise ValueError(f"--repack-steps must be >= 1, got {args.repack_steps}")
    if not args.history_hours > 0:
        raise ValueError(f"--history-hours must be > 0, got {args.history_hours:g}")
    for flag in ("headroom", "memory_margin"):
        if not getattr(args, flag) >= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag):g}")
    if not 0 <= args.burst_overlap <= 1:
        raise ValueError(f"--burst-overlap must be between 0 and 1, got {args.burst_overlap:g}")
    for flag in ("memory_quantile", "burst_quantile", "duty_quantile"):
        if not 0 < getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be between 0 and 1, got {getattr(args, flag):g}")
    return names


def build_policies(names: list[str], args: argparse.Namespace, series, filled) -> tuple[list, str | None]:
    """The policies asked for, and the name of the forecaster the forecast policies use."""
    from dprobe.forecaster.baselines import make_baseline
    from dprobe.forecaster.loading import checkpoint_path, open_forecaster
    from dprobe.sim.sharing import ForecastDemand, OnePerGpu, Oracle, PeakOfHistory

    window = max(1, int(round(args.history_hours * 3600 / series.step_seconds)))
    label = f"{args.history_hours:g}h"
    policies, forecaster_name = [], None
    for name in names:
        if name == "one-per-gpu":
            policies.append(OnePerGpu())
        elif name == "peak":
            policies.append(PeakOfHistory(window, 0.0, args.duty_quantile, label))
        elif name == "peak-headroom":
            policies.append(PeakOfHistory(window, args.headroom, args.duty_quantile, label))
        elif name == "oracle":
            policies.append(Oracle(*filled, args.duty_quantile))
        else:
            rules = dict(memory_quantile=args.memory_quantile, duty_quantile=args.duty_quantile,
                         margin=args.memory_margin, burst_quantile=args.burst_quantile, burst_history=window)
            if name == "dprobe":
                loaded = open_forecaster(checkpoint_path(args.checkpoint or "dprobe"),
                                         metrics=("gpu_memory_bytes", "gpu_duty_cycle_pct"))
                model = loaded.forecaster
                _, spec, _ = model.task_for("gpu_memory_bytes", series.step_seconds)
                covariates = tuple(c for c in spec.covariates if c in series.covariate_names)
                max_lead = int(max(spec.leads) * spec.step_seconds / series.step_seconds)
                forecaster_name = f"{loaded.kind} ({loaded.checkpoint})"
                policies.append(ForecastDemand("dprobe", model, int(math.ceil(model.window_seconds(
                    "gpu_memory_bytes") / series.step_seconds)), covariates=covariates, max_lead=max_lead, **rules))
            else:
                base = make_baseline("last_value")
                base.residual_window = max(10, 4 * window)
                policies.append(ForecastDemand("last-value", base, base.residual_window + args.repack_steps,
                                               **rules))
    return policies, forecaster_name


def run_sharing(args: argparse.Namespace) -> int:
    from dprobe.data.alibaba import NAME, load_alibaba
    from dprobe.data.registry import bundled_dir
    from dprobe.evaluation.report import check_plot_path
    from dprobe.sharing.planner import PlanSettings
    from dprobe.sim.report import print_report
    from dprobe.sim.sharing import pod_series, simulate_sharing
    from dprobe.sim.sharing_report import markdown_table, plot_sharing

    names = _check(args)
    if getattr(args, "fixed", False):
        raise ValueError("--sharing and --fixed are two different simulations: choose one")
    if args.plot:
        check_plot_path(args.plot)
    directory = args.data or bundled_dir(NAME, "pass --data DIR")
    series = pod_series(load_alibaba(directory), span=args.span)
    filled = (series.filled(series.memory), series.filled(series.duty))
    policies, forecaster_name = build_policies(names, args, series, filled)
    capacity = args.gpu_memory * GB
    settings = PlanSettings(policy=args.packing, burst_overlap=args.burst_overlap, burst_combine=args.burst_combine)
    results, reference = [], None
    progress = not args.quiet and sys.stderr.isatty()
    for policy in policies:
        if progress:
            print(f"simulating {policy.name} ...", file=sys.stderr)
        results.append(simulate_sharing(series, policy, capacity, args.repack_steps, settings, filled,
                                        sticky=not args.fresh_repack))
        if policy.name == "one-per-gpu":
            reference = results[-1].report()["gpu_hours"]
    report = {
        "dataset": NAME, "data": str(directory), "span": args.span, "pods": len(series.ids),
        "scored_pods": int((series.scored_to > series.scored_from).sum()),
        "scored_hours": (series.eval_end - series.eval_start) * series.step_seconds / 3600,
        "forecaster": forecaster_name,
        "settings": {"gpu_memory_gb": args.gpu_memory, "repack_steps": args.repack_steps,
                     "step_seconds": series.step_seconds, "packing": args.packing,
                     "history_hours": args.history_hours, "headroom": args.headroom,
                     "memory_quantile": args.memory_quantile, "burst_quantile": args.burst_quantile,
                     "duty_quantile": args.duty_quantile, "memory_margin": args.memory_margin,
                     "burst_overlap": args.burst_overlap, "burst_combine": args.burst_combine,
                     "fresh_repack": args.fresh_repack},
        "note": "the trace's memory is scaled for anonymity: GPU sizes are compared with the scaled values",
        "policies": [r.report(reference) for r in results],
    }
    print_report(report, args.json, markdown_table)
    if args.plot:
        path = plot_sharing(results, args.plot, args.gpu_memory)
        print(f"plot written to {path}", file=sys.stderr)
    return 0
