"""``dprobe simulate sharing``: the GenAI pods packed onto shared GPUs by policy, scored against what they
did afterwards (:mod:`dprobe.sim.sharing.packing`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from types import SimpleNamespace

from dprobe.core.units import format_bytes, size_arg
from dprobe.sim.options import add_output_arguments
from dprobe.sim.sharing.settings import GUARD_MODES, RULES, SHARING_POLICIES, SharingSettings

DEFAULT_SHARING_POLICIES = ",".join(SHARING_POLICIES)
# the shipped settings (also benchmarks/simulate_sharing.py's), as declared: SharingSettings() itself would check
# them with the planner, which needs numpy (not for --help)
DEFAULTS = SimpleNamespace(**{f.name: f.default for f in fields(SharingSettings)})

HELP = "serving pods packed onto shared GPUs by policy, scored against what they did afterwards"
DESCRIPTION = """Pods of a serving trace (alibaba-genai-2026 layout: per-pod GPU memory and duty cycle,
--data DIR, default the bundled one) are repacked onto shared GPUs of --gpu-memory (a size: 80GB, 141GiB)
every --repack-steps steps from the demand each policy sees then, and every step is scored with what the pods measured:
GPU-hours, pod-minutes on a GPU whose memory overflowed, GPU-minutes with summed duty cycle over 100 %,
moves per hour. Only each pod's last 30 % (its test span, never trained on) is scored. The trace's
memory values are scaled for anonymity: GPU sizes are compared against the scaled values.

sharing policies (--sharing-policies):
  one-per-gpu    no sharing: every pod keeps a GPU of its own (the reference)
  peak           each pod's peak memory over the last --history-hours (and the --duty-quantile of its
                 duty cycle)
  peak-headroom  the same plus --headroom on memory
  dprobe         peak packing with the forecaster (--checkpoint, default the shipped one) as a guard
                 (--rule guarded-peak, the default): each pod's size is its peak over --history-hours,
                 raised to the --guard-quantile forecast over the next interval (plus --guard-margin)
                 where that is higher, as far as that needs no more GPUs than peak packing
                 (--guard-mode free; always: whatever it costs). --rule forecast: the --memory-quantile
                 of memory as the pod's size, and room on its GPU for a burst to the larger of the
                 --burst-quantile forecast and its peak over --history-hours (each GPU keeps room for
                 its tenants' largest burst and --burst-overlap of the others', or with --burst-combine
                 rss the root of the sum of their squares); --duty-quantile of duty. --rule peak: peak
                 packing alone
  last-value     the same rules on the last-value baseline's conformal quantiles
  oracle         each pod's measured peak memory and --duty-quantile of duty cycle over the coming
                 interval (hindsight)

example:
  dprobe simulate sharing --gpu-memory 80GB --plot sharing.png
  dprobe simulate sharing --gpu-memory 48GB --json

`dprobe simulate --sharing ...` is the old spelling of this sub-command, and still works."""


def register(simulators: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sharing`` to ``dprobe simulate``'s sub-commands; returns its parser."""
    p = simulators.add_parser("sharing", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    pods = p.add_argument_group("pods")
    pods.add_argument("--data", metavar="DIR",
                      help="a directory laid out like datasets/alibaba-genai-2026 (default: the bundled one)")
    pods.add_argument("--span", choices=("test", "validation"), default="test",
                      help="score each pod's test span (default) or its validation span")
    pods.add_argument("--checkpoint", metavar="CKPT",
                      help="the forecaster of the dprobe policy: a trained dprobe checkpoint (default, or "
                      "'dprobe': the forecaster shipped with dprobe)")
    add_sharing_arguments(p)
    add_output_arguments(p, "draw the GPUs in use per policy over time and the pod-minutes over memory", per_vc=False)
    p.set_defaults(func=run_sharing)
    return p


def add_sharing_arguments(p: argparse.ArgumentParser) -> None:
    """The "GPU sharing" group: GPU size, the policies compared and how they pack."""
    d = DEFAULTS
    g = p.add_argument_group("GPU sharing")
    g.add_argument("--gpu-memory", type=size_arg, default=d.gpu_memory_bytes, metavar="SIZE",
                   help="memory of each GPU, a size with its unit: 48GB, 80GB, 141GB (1e9 bytes a GB), 24GiB "
                   f"(2**30 bytes), or bytes (80e9); a bare number below 10000 is refused (default: "
                   f"{format_bytes(d.gpu_memory_bytes)})")
    g.add_argument("--repack-steps", type=int, default=d.repack_steps, metavar="N",
                   help="steps of the trace between repackings (default: %(default)d, 28.5 min at 57 s)")
    g.add_argument("--sharing-policies", default=DEFAULT_SHARING_POLICIES,
                   help="comma-separated sharing policies to compare (default: %(default)s)")
    g.add_argument("--packing", choices=("first-fit", "best-fit", "frag-aware", "fgd"), default=d.packing,
                   help="how the planner places pods, largest first (default: %(default)s)")
    g.add_argument("--history-hours", type=float, default=d.history_hours, metavar="H",
                   help="look-back of the peak policies, of dprobe's peak and of its burst room "
                   "(default: %(default)g)")
    g.add_argument("--headroom", type=float, default=d.headroom, metavar="F",
                   help="peak-headroom: share added to the peak (default: %(default)g)")
    g.add_argument("--rule", choices=RULES, default=d.rule,
                   help="how dprobe / last-value size a pod: guarded-peak (peak packing, raised where the "
                   "forecast is higher), peak (peak packing alone) or forecast (a forecast quantile with burst "
                   "room); default: %(default)s, chosen by cross-validation (docs/sharing.md)")
    g.add_argument("--guard-quantile", type=float, default=d.guard_quantile,
                   help="guarded-peak: forecast quantile a pod's size is raised to (default: %(default)g)")
    g.add_argument("--guard-margin", type=float, default=d.guard_margin, metavar="F",
                   help="guarded-peak: share added to that forecast (default: %(default)g)")
    g.add_argument("--guard-mode", choices=GUARD_MODES, default=d.guard_mode,
                   help="guarded-peak: free (the guard only where it needs no more GPUs than peak packing) or "
                   "always (default: %(default)s)")
    g.add_argument("--guard-swap", action=argparse.BooleanOptionalAction, default=d.guard_swap,
                   help="guarded-peak, free: also swap pods between GPUs where the guard still finds one over its "
                   "memory (default: %(default)s)")
    g.add_argument("--memory-quantile", type=float, default=d.memory_quantile,
                   help="--rule forecast: forecast quantile of memory packed as the pod's size, 0.5, 0.9 "
                   "or 0.99 (default: %(default)g)")
    g.add_argument("--burst-quantile", type=float, default=d.burst_quantile,
                   help="--rule forecast: forecast quantile a GPU keeps room for (default: %(default)g)")
    g.add_argument("--duty-quantile", type=float, default=d.duty_quantile,
                   help="quantile of duty cycle summed under 100 %% per GPU (default: %(default)g)")
    g.add_argument("--burst-overlap", type=float, default=d.burst_overlap, metavar="F",
                   help="--rule forecast: besides its tenants' largest burst, a GPU keeps room for this "
                   "share of the others' (0: one burst at a time, 1: all at once; default: %(default)g)")
    g.add_argument("--burst-combine", choices=("max", "rss"), default=d.burst_combine,
                   help="--rule forecast: how a GPU sums its tenants' bursts: max (the largest, plus "
                   "--burst-overlap of the others') or rss (root of the sum of squares, a quantile of a sum of "
                   "independent bursts; default: %(default)s)")
    g.add_argument("--memory-margin", type=float, default=d.memory_margin, metavar="F",
                   help="--rule forecast: share added to the memory forecasts (default: %(default)g)")
    g.add_argument("--fresh-repack", action="store_true",
                   help="pack from scratch at every repack; by default pods stay on their GPUs where they "
                   "still fit unless packing afresh needs fewer GPUs (fewer moves)")


def _check(args: argparse.Namespace) -> list[str]:
    names = [s.strip() for s in args.sharing_policies.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHARING_POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown sharing policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(SHARING_POLICIES)}")
    if args.repack_steps < 1:
        raise ValueError(f"--repack-steps must be >= 1, got {args.repack_steps}")
    if not args.history_hours > 0:
        raise ValueError(f"--history-hours must be > 0, got {args.history_hours:g}")
    for flag in ("headroom", "memory_margin", "guard_margin"):
        if not getattr(args, flag) >= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag):g}")
    if not 0 <= args.burst_overlap <= 1:
        raise ValueError(f"--burst-overlap must be between 0 and 1, got {args.burst_overlap:g}")
    for flag in ("memory_quantile", "burst_quantile", "duty_quantile", "guard_quantile"):
        if not 0 < getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be between 0 and 1, got {getattr(args, flag):g}")
    return names


def sharing_settings(args: argparse.Namespace) -> SharingSettings:
    """The :class:`SharingSettings` of ``dprobe simulate sharing``'s options (their defaults: the shipped
    ones)."""
    return SharingSettings(
        gpu_memory_bytes=args.gpu_memory, repack_steps=args.repack_steps, packing=args.packing,
        history_hours=args.history_hours, headroom=args.headroom, duty_quantile=args.duty_quantile,
        rule=args.rule, guard_quantile=args.guard_quantile, guard_margin=args.guard_margin,
        guard_mode=args.guard_mode, guard_swap=args.guard_swap, memory_quantile=args.memory_quantile,
        burst_quantile=args.burst_quantile,
        burst_overlap=args.burst_overlap, burst_combine=args.burst_combine, memory_margin=args.memory_margin,
        sticky=not args.fresh_repack)


def run_sharing(args: argparse.Namespace) -> int:
    """``dprobe simulate sharing``."""
    from dprobe.core.plots import check_plot_path
    from dprobe.data.alibaba import NAME, load_alibaba
    from dprobe.data.registry import bundled_dir
    from dprobe.sim.report import print_report
    from dprobe.sim.sharing.packing import load_forecaster, pod_series, simulate_policies
    from dprobe.sim.sharing.report import markdown_table, plot_sharing

    names = _check(args)
    settings = sharing_settings(args)
    if args.plot:
        check_plot_path(args.plot)
    directory = args.data or bundled_dir(NAME, "pass --data DIR")
    series = pod_series(load_alibaba(directory), span=args.span)
    loaded = load_forecaster(args.checkpoint) if "dprobe" in names and settings.rule != "peak" else None
    progress = not args.quiet and sys.stderr.isatty()
    if progress:
        print(f"simulating {', '.join(names)} ...", file=sys.stderr)
    results = simulate_policies(series, settings, names, loaded)
    reference = next((r.report()["gpu_hours"] for r in results if r.policy == "one-per-gpu"), None)
    report = {
        "dataset": NAME, "data": str(directory), "span": args.span, "pods": len(series.ids),
        "scored_pods": int((series.scored_to > series.scored_from).sum()),
        "scored_hours": (series.eval_end - series.eval_start) * series.step_seconds / 3600,
        "forecaster": f"{loaded.kind} ({loaded.checkpoint})" if loaded else None,
        "settings": {**settings.to_dict(), "step_seconds": series.step_seconds, "fresh_repack": args.fresh_repack},
        "note": "the trace's memory is scaled for anonymity: GPU sizes are compared with the scaled values",
        "policies": [r.report(reference) for r in results],
    }
    print_report(report, args.json, markdown_table)
    if args.plot:
        path = plot_sharing(results, args.plot, args.gpu_memory)
        print(f"plot written to {path}", file=sys.stderr)
    return 0
