"""``dprobe sidecar``: live GPU metrics in, forecasts out on /metrics."""

from __future__ import annotations

import argparse

from dprobe.core.options import add_service_parser
from dprobe.services.sidecar.config import OPTIONS, SidecarConfig

DESCRIPTION = """Sample GPU metrics (NVML, dcgm-exporter, Prometheus or a replayed trace), forecast every
target's GPU memory and utilisation, and serve the forecasts on /metrics (plus /healthz, /readyz).
Every option can also come from a YAML file (--config) and from environment variables
(DPROBE_SIDECAR_<OPTION>, e.g. DPROBE_SIDECAR_DCGM_URL); flags win over the environment, which
wins over the file. Without a GPU the default source replays a bundled trace."""


def run(config: SidecarConfig) -> int:
    from dprobe.services.sidecar.service import Sidecar

    return Sidecar(config).run()


def register(subparsers: argparse._SubParsersAction) -> None:
    add_service_parser(subparsers, "sidecar", "run the forecasting sidecar (Prometheus exporter)", DESCRIPTION,
                       OPTIONS, run)
