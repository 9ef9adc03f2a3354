"""The ``dprobe`` console script: one subcommand per module, each with ``--help``.

A subcommand lives next to the code it drives and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (called with
the parsed arguments, returns an exit code). Add new ones to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dprobe import __version__

# module paths, each with register(subparsers); imported lazily so `dprobe --help` stays fast
SUBCOMMANDS: list[str] = [
    "dprobe.train",
    "dprobe.graph.cli",
    "dprobe.profiling.cli",
    "dprobe.evaluation.cli",
    "dprobe.services.sidecar.cli",
    "dprobe.services.scaler.cli",
    "dprobe.sim.cli",
    "dprobe.data.cli",
]

LONG_RUNNING = {"sidecar", "scaler"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dprobe",
        description="Forecast GPU memory and utilisation of deep-learning workloads, "
        "and turn forecasts into GPU scaling recommendations.",
    )
    parser.add_argument("--version", action="version", version=f"dprobe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for path in SUBCOMMANDS:
        importlib.import_module(path).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    base = logging.INFO if args.command in LONG_RUNNING else logging.WARNING  # services log state changes
    level = max(logging.DEBUG, base - 10 * args.verbose)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from dprobe.data import DatasetError

    try:
        return int(args.func(args) or 0)
    except (DatasetError, OSError, ValueError) as exc:  # bad input, a missing file, a port in use
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
