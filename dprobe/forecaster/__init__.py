"""Forecasters behind one interface: the baselines and the DProbe model. The names below are imported on
first use (pandas is not, by a command's ``--help``)."""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "BASELINES": "dprobe.forecaster.baselines",
    "CheckpointError": "dprobe.forecaster.loading",
    "Forecast": "dprobe.forecaster.base",
    "ForecastInput": "dprobe.forecaster.base",
    "Forecaster": "dprobe.forecaster.base",
    "QUANTILES": "dprobe.forecaster.base",
    "load_forecaster": "dprobe.forecaster.loading",
    "make_baseline": "dprobe.forecaster.baselines",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["BASELINES", "QUANTILES", "CheckpointError", "Forecast", "ForecastInput", "Forecaster", "load_forecaster",
           "make_baseline"]

if TYPE_CHECKING:
    from dprobe.forecaster.base import QUANTILES, Forecast, Forecaster, ForecastInput
    from dprobe.forecaster.baselines import BASELINES, make_baseline
    from dprobe.forecaster.loading import CheckpointError, load_forecaster
