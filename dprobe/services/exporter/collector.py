"""What the services' collectors share: their families are rendered from the service's state at scrape time."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class StateCollector(Collector):
    """A client_python collector whose families depend on the service's state: nothing to describe at
    registration (the services' registries are made with ``auto_describe=False``)."""

    def describe(self) -> list[Metric]:
        return []
