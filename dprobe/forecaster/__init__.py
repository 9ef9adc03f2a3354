"""Forecasters behind one interface: the baselines and the DProbe model."""

from dprobe.forecaster.base import QUANTILES, Forecast, Forecaster, ForecastInput
from dprobe.forecaster.baselines import BASELINES, make_baseline
from dprobe.forecaster.loading import CheckpointError, load_forecaster

__all__ = [
    "BASELINES", "QUANTILES", "CheckpointError", "Forecast", "ForecastInput", "Forecaster", "load_forecaster",
    "make_baseline",
]
