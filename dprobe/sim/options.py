"""The options the simulators share: ``dprobe simulate quota`` and ``dprobe simulate fixed`` the job log, the
quota policies and the scaler's policy they run through (their checks, the scaler settings they make), all
three the output."""

from __future__ import annotations

import argparse
import math

# the options that set the scaler's policy (their defaults: ScalerSettings')
POLICY_FLAGS = ("margin", "tolerance", "scale_up_tolerance", "scale_down_tolerance", "scale_up_gpus", "min_gpus")


def flag(name: str) -> str:
    """An option's flag from its attribute name: ``scale_up_gpus`` -> ``--scale-up-gpus``."""
    return "--" + name.replace("_", "-")


def add_job_log_arguments(p: argparse.ArgumentParser, data_help: str) -> argparse._ArgumentGroup:
    """The "jobs" group: which log, which VCs, which days."""
    data = p.add_argument_group("jobs")
    data.add_argument("--data", metavar="DIR", help=data_help)
    data.add_argument("--vc", action="append", metavar="NAME",
                      help="simulate only this virtual cluster (ITP: cluster file name); repeatable; default all")
    data.add_argument("--days", type=float, metavar="N", help="only jobs submitted in the first N days (from "
                      "--start-day); the cluster starts empty")
    data.add_argument("--start-day", type=float, default=0.0, metavar="D",
                      help="skip the jobs submitted in the first D days of the log (default: %(default)g)")
    return data


def add_scaling_arguments(p: argparse.ArgumentParser, *, provision_delay: bool, horizon_help: str,
                          max_gpus_help: str) -> argparse._ArgumentGroup:
    """The "scaling" group: the quota policies compared, how often they decide, the forecast they read and the
    scaler's policy they run through (``provision_delay``: with ``--provision-delay``)."""
    sim = p.add_argument_group("scaling")
    sim.add_argument("--policies", default="static,reactive,forecast",
                     help="comma-separated policies to compare (default: %(default)s)")
    sim.add_argument("--interval", type=float, default=600.0, metavar="S",
                     help="seconds between quota decisions (default: %(default)g)")
    if provision_delay:
        sim.add_argument("--provision-delay", type=float, metavar="S",
                         help="seconds before a quota increase is usable (default: 300)")
    sim.add_argument("--horizon-seconds", dest="horizon", type=float, metavar="S", help=horizon_help)
    sim.add_argument("--horizon", dest="horizon", type=float, help=argparse.SUPPRESS)  # its former name
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
    sim.add_argument("--max-gpus", type=int, metavar="N", help=max_gpus_help)
    sim.add_argument("--checkpoint", metavar="CKPT",
                     help="a trained dprobe checkpoint with a gpu_demand task for the forecast policy; "
                          "'dprobe': the forecaster shipped with dprobe")
    return sim


def add_output_arguments(p: argparse.ArgumentParser, plot_help: str, per_vc: bool = True) -> None:
    """The "output" group: JSON or a Markdown table, per VC rows, a plot, no progress bar."""
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    if per_vc:
        out.add_argument("--per-vc", action="store_true", help="also report every VC")
    out.add_argument("--plot", metavar="FILE.png", help=plot_help)
    out.add_argument("--quiet", action="store_true", help="no progress bar")


def policy_settings(policy: object) -> dict:
    """The simulated policy as JSON (its max_replicas aside: per VC, reported as max_gpus)."""
    import dataclasses

    doc = dataclasses.asdict(policy)  # type: ignore[call-overload]
    doc.pop("max_replicas")
    return doc


def check_scaling(args: argparse.Namespace) -> list[str]:
    """The policies asked for; a ValueError for a scaling option out of range. Fills in the scaler's defaults
    of the policy options not given (without ``--scaler-config``)."""
    from dprobe.sim.policies import POLICY_NAMES, ScalerSettings

    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [s for s in policies if s not in POLICY_NAMES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(POLICY_NAMES)}")
    if args.horizon is not None and not (math.isfinite(args.horizon) and args.horizon > 0):
        raise ValueError(f"--horizon-seconds must be a positive number of seconds, got {args.horizon:g}")
    given = [f for f in POLICY_FLAGS if getattr(args, f) is not None]
    if args.scaler_config and given:
        raise ValueError(f"--scaler-config sets the scaler's policy; set {', '.join(flag(f) for f in given)} "
                         "in that file instead")
    for name in POLICY_FLAGS:
        if getattr(args, name) is None and not args.scaler_config:
            setattr(args, name, getattr(ScalerSettings, name))
    for name in ("margin", "tolerance", "scale_up_tolerance", "scale_down_tolerance"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {value:g}")
    if args.scale_up_gpus is not None and args.scale_up_gpus < 1:
        raise ValueError(f"--scale-up-gpus must be >= 1, got {args.scale_up_gpus}")
    least = args.min_gpus or 0
    if least < 0 or (args.max_gpus is not None and args.max_gpus < max(1, least)):
        raise ValueError(f"need 0 <= --min-gpus <= --max-gpus and --max-gpus >= 1, got {least}, {args.max_gpus}")
    return policies


def check_static_warmup(args: argparse.Namespace) -> None:
    if not 0 < args.static_warmup <= 1:
        raise ValueError(f"--static-warmup must be in (0, 1], got {args.static_warmup:g}")


def scaler_settings(args: argparse.Namespace):
    """The scaler settings of the options checked by :func:`check_scaling`, or of ``--scaler-config``."""
    from dprobe.sim.policies import ScalerSettings

    if args.scaler_config:
        from dprobe.services.scaler.config import load_config

        return ScalerSettings(configured=load_config({"config": args.scaler_config}, env={}).gpu_policy())
    return ScalerSettings(margin=args.margin, tolerance=args.tolerance, min_gpus=args.min_gpus,
                          scale_up_tolerance=args.scale_up_tolerance,
                          scale_down_tolerance=args.scale_down_tolerance, scale_up_gpus=args.scale_up_gpus)
