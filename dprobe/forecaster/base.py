"""The forecasting interface shared by the evaluation harness, the sidecar and the scaler.

A forecaster takes a batch of recent windows of one metric and returns, for
each requested lead time, a point forecast and the quantiles in
:data:`QUANTILES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dprobe.core.names import QUANTILES


@dataclass
class ForecastInput:
    """A batch of histories of one metric.

    values: ``(B, L)`` float, oldest first, most recent last; NaN (or an infinity, which no
    metric can take: a broken exporter's value) marks a gap.
    covariates: optional ``(B, L, C)`` past covariates aligned with ``values``.
    graphs: optional per-row model graph (``dprobe.graph.ModelGraph`` or None).
    """

    values: np.ndarray
    metric: str
    leads: tuple[int, ...]
    step_seconds: float
    covariates: np.ndarray | None = None
    graphs: list[Any] | None = None

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.values.ndim != 2:
            raise ValueError(f"values must be (batch, length), got shape {self.values.shape}")
        if self.values.shape[1] == 0:
            raise ValueError("values must hold at least one time step, got an empty window")
        self.values = _infinities_as_gaps(self.values)
        if self.covariates is not None:
            self.covariates = _infinities_as_gaps(np.asarray(self.covariates))
        if not self.leads or min(self.leads) < 1:
            raise ValueError(f"leads must be positive step counts, got {self.leads}")
        self.leads = tuple(int(h) for h in self.leads)


def _infinities_as_gaps(x: np.ndarray) -> np.ndarray:
    """``x`` with its infinities made NaN (gaps); ``x`` itself, uncopied, when it has none."""
    inf = np.isinf(x)
    return np.where(inf, np.nan, x) if inf.any() else x


@dataclass
class Forecast:
    """point: ``(B, H)``; quantiles: ``(B, H, Q)`` non-decreasing along Q, for :data:`QUANTILES`."""

    point: np.ndarray
    quantiles: np.ndarray
    leads: tuple[int, ...]
    quantile_levels: tuple[float, ...] = QUANTILES


@runtime_checkable
class Forecaster(Protocol):
    """Anything with a ``name`` and ``predict(ForecastInput) -> Forecast``."""

    name: str

    def predict(self, batch: ForecastInput) -> Forecast: ...
