"""Forecasters behind one interface: the baselines and the DProbe model."""

from dprobe.forecasting.base import QUANTILES, Forecast, ForecastInput, Forecaster
from dprobe.forecasting.baselines import BASELINES, make_baseline

__all__ = ["BASELINES", "QUANTILES", "Forecast", "ForecastInput", "Forecaster", "make_baseline"]
