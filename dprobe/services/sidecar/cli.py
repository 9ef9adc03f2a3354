"""``dprobe sidecar``: live GPU metrics in, forecasts out on /metrics."""

from __future__ import annotations

import argparse

from dprobe.core.options import add_service_parser
from dprobe.services.sidecar.config import OPTIONS, SidecarConfig

DESCRIPTION = """Sample GPU metrics (NVML, dcgm-exporter, Prometheus or a replayed trace), forecast every
target's GPU memory and utilisation, and serve the forecasts on /metrics (plus /healthz, /readyz).
Settings come from a YAML file (--config FILE, or DPROBE_SIDECAR_CONFIG), which may hold every option
(conf/sidecar.example.yaml), from environment variables (DPROBE_SIDECAR_<OPTION>, e.g.
DPROBE_SIDECAR_DCGM_URL) and from the flags below; flags win over the environment, which wins over
the file. Without a GPU the default source replays a bundled trace."""


def run(config: SidecarConfig) -> int:
    from dprobe.services.sidecar.service import Sidecar

    return Sidecar(config).run()


def register(subparsers: argparse._SubParsersAction) -> None:
    add_service_parser(subparsers, "sidecar", "run the forecasting sidecar (Prometheus exporter)", DESCRIPTION,
                       OPTIONS, run)
