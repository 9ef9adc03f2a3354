"""Loaders for the bundled traces: tidy frames on a regular grid.

Every loader accepts any directory laid out like the matching folder of
``datasets/`` (same file names and columns; other pods, VCs or runs). The names below are imported on
first use (pandas is not, by ``dprobe COMMAND --help``).
"""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "DatasetError": "dprobe.data.common",
    "H200Profiles": "dprobe.data.h200",
    "SeriesDataset": "dprobe.data.common",
    "detect_dataset": "dprobe.data.registry",
    "load_alibaba": "dprobe.data.alibaba",
    "load_h200_profiles": "dprobe.data.h200",
    "load_helios": "dprobe.data.helios",
    "load_itp": "dprobe.data.joblogs",
    "load_philly": "dprobe.data.joblogs",
    "load_series_dataset": "dprobe.data.registry",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "DatasetError", "H200Profiles", "SeriesDataset", "detect_dataset", "load_alibaba", "load_h200_profiles",
    "load_helios", "load_itp", "load_philly", "load_series_dataset",
]

if TYPE_CHECKING:
    from dprobe.data.alibaba import load_alibaba
    from dprobe.data.common import DatasetError, SeriesDataset
    from dprobe.data.h200 import H200Profiles, load_h200_profiles
    from dprobe.data.helios import load_helios
    from dprobe.data.joblogs import load_itp, load_philly
    from dprobe.data.registry import detect_dataset, load_series_dataset
