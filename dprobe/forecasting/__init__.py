"""Forecasters behind one interface: the baselines and the DProbe model."""

from dprobe.forecasting.base import QUANTILES, Forecast, Forecaster, ForecastInput
from dprobe.forecasting.baselines import BASELINES, make_baseline
from dprobe.forecasting.loading import CheckpointError, load_forecaster

__all__ = [
    "BASELINES", "QUANTILES", "CheckpointError", "Forecast", "ForecastInput", "Forecaster", "load_forecaster",
    "make_baseline",
]
