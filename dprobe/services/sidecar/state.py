"""What the sidecar's collector reads at scrape time: the latest samples, the latest forecasts, source health,
the job profiles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class Latest:
    """The latest sample of a target; ``labels``: its identity labels (dcgm-exporter's names); ``gpu_model``:
    its GPU's model name where the source gives it; ``extra``: its further readings that are finite and not
    negative (a sample's ``extra``: ``power_watts``, ``sm_clock_hertz``, ...)."""

    ts: float
    memory_bytes: float | None
    utilization_ratio: float | None
    source: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_model: str = ""
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ForecastSnapshot:
    """One forecast cycle's output for all targets, published by reference swap.

    ``quantiles[metric]`` is ``(len(targets), len(horizons), len(levels))``;
    ``input_ts[i]`` is the time of the last sample the forecast of ``targets[i]`` used, ``labels[i]``
    that sample's identity labels (empty where not given), ``tokens[i]`` the workload token its forecast
    used (``graph``, ``vector`` or ``unknown``; empty for a forecaster without one, a baseline).
    """

    made_at: float
    targets: tuple[str, ...]
    input_ts: np.ndarray
    horizons: tuple[int, ...]
    levels: tuple[float, ...]
    quantiles: dict[str, np.ndarray]
    labels: tuple[Mapping[str, str], ...] = ()
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JobRow:
    """The cold-start profile of the training job a target runs: ``values[stem][quantile]`` (stems such as
    ``gpu_memory_bytes``, exported as ``dprobe_job_predicted_<stem>``) and ``info`` (the job's description)."""

    target: str
    labels: Mapping[str, str]
    values: Mapping[str, Mapping[str, float]]
    info: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """A source's health: ``up`` when its last poll succeeded, its failed polls, and its refused readings
    by reason (``rejected``: :data:`dprobe.services.sources.base.REJECT_REASONS` -> count)."""

    name: str
    up: bool
    errors_total: int
    rejected: Mapping[str, int] = field(default_factory=dict)


class SidecarState(Protocol):
    """What :class:`~dprobe.services.sidecar.collector.SidecarCollector` reads, implemented by
    :class:`~dprobe.services.sidecar.service.Sidecar`; everything is read without blocking the sampling."""

    stale_after: float
    forecast_max_age: float

    def forecast_snapshot(self) -> ForecastSnapshot | None: ...

    def latest_samples(self) -> dict[str, Latest]: ...

    def source_status(self) -> list[SourceStatus]: ...

    def forecast_errors(self) -> int: ...

    def model_labels(self) -> dict[str, str]: ...

    def job_rows(self, latest: dict[str, Latest], fresh: set[str]) -> list[JobRow]: ...

    def ready(self) -> tuple[bool, str]: ...
