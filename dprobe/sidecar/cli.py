"""``dprobe sidecar``: live GPU metrics in, forecasts out on /metrics."""

from __future__ import annotations

import argparse
import logging

from dprobe.sidecar.config import ENV_PREFIX, add_arguments, load_config

DESCRIPTION = """Sample GPU metrics (NVML, dcgm-exporter, Prometheus or a replayed trace), forecast every
target's GPU memory and utilisation, and serve the forecasts on /metrics (plus /healthz, /readyz).
Every option can also come from a YAML file (--config) and from environment variables
(DPROBE_SIDECAR_<OPTION>, e.g. DPROBE_SIDECAR_DCGM_URL); flags win over the environment, which
wins over the file. Without a GPU the default source replays a bundled trace."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sidecar", help="run the forecasting sidecar (Prometheus exporter)",
                                   description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    opts = {k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")}
    config = load_config(opts)
    level = getattr(logging, config.log_level.upper(), logging.INFO)
    if getattr(args, "verbose", 0):
        level = min(level, logging.WARNING - 10 * min(args.verbose, 2))
    logging.getLogger("dprobe").setLevel(level)
    from dprobe.sidecar.service import Sidecar

    return Sidecar(config).run()


__all__ = ["ENV_PREFIX", "register", "run"]
