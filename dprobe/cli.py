"""The ``dprobe`` console script: one subcommand per module, each with ``--help``.

A subcommand lives next to the code it drives and exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (called with the parsed arguments, returns an exit code). Add new ones to
``SUBCOMMANDS`` with their one-line help. Only the module of the command given is imported (``dprobe
--help`` imports none: it lists the helps below), so that help and errors come in a fraction of a second.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dprobe import __version__

# command -> (its module, with register(subparsers); the one-line help `dprobe --help` lists, the same as
# the module's own parser's: tests/test_cli_help.py checks both)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("dprobe.train", "train and score the forecaster and the profilers, as python train.py (Hydra "
              "overrides: +exp=gnn key=value ...; --help: the config groups)"),
    "graph": ("dprobe.graph.cli", "trace a model into a portable graph (JSON)"),
    "predict": ("dprobe.profiling.cli", "cold-start prediction of a training job from its model"),
    "evaluate": ("dprobe.evaluation.cli", "score forecasts against the baselines on a data directory"),
    "sidecar": ("dprobe.services.sidecar.cli", "run the forecasting sidecar (Prometheus exporter)"),
    "scaler": ("dprobe.services.scaler.cli", "run the scaler (forecasts -> scaling recommendations)"),
    "simulate": ("dprobe.sim.cli", "simulate GPU clusters on traces: quotas, a fixed-size cluster, GPU sharing"),
    "profiles": ("dprobe.data.cli", "list or grow a profiles data set (runs measured on a GPU)"),
    "gpu": ("dprobe.profiling.calibrate.cli", "GPU figures: calibrate measures this GPU's throughput into a "
            "--gpu-spec file"),
}

LONG_RUNNING = {"sidecar", "scaler"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The console script's parser: every subcommand's own (``command`` None), or only ``command``'s, the
    others listed by their help alone ("": none)."""
    parser = argparse.ArgumentParser(
        prog="dprobe",
        description="Forecast GPU memory and utilisation of deep-learning workloads, "
        "and turn forecasts into GPU scaling recommendations.",
    )
    parser.add_argument("--version", action="version", version=f"dprobe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (path, help_) in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(path).register(sub)
        else:
            sub.add_parser(name, help=help_, add_help=False)
    return parser


def command_of(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option), "" for none or an unknown one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SUBCOMMANDS else ""
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    base = logging.INFO if args.command in LONG_RUNNING else logging.WARNING  # services log state changes
    level = max(logging.DEBUG, base - 10 * args.verbose)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except (OSError, ValueError) as exc:  # bad input (a DatasetError is one), a missing file, a port in use
        print(f"dprobe {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a slim install asked for what needs the full one
        from dprobe.core.lazy import missing_package

        message = missing_package(exc)
        if message is None:
            raise
        print(f"dprobe {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
