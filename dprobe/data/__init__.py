"""Loaders for the bundled traces: tidy frames on a regular grid.

Every loader accepts any directory laid out like the matching folder of
``datasets/`` (same file names and columns; other pods, VCs or runs).
"""

from dprobe.data.alibaba import load_alibaba
from dprobe.data.common import DatasetError, SeriesDataset
from dprobe.data.h200 import H200Profiles, load_h200_profiles
from dprobe.data.helios import load_helios
from dprobe.data.joblogs import load_itp, load_philly
from dprobe.data.registry import detect_dataset, load_series_dataset

__all__ = [
    "DatasetError",
    "H200Profiles",
    "SeriesDataset",
    "detect_dataset",
    "load_alibaba",
    "load_h200_profiles",
    "load_helios",
    "load_itp",
    "load_philly",
    "load_series_dataset",
]
