"""Recognise which bundled data set a directory is laid out like, and load it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dprobe.data.alibaba import DUTY_FILE, MEMORY_FILE, load_alibaba
from dprobe.data.alibaba import NAME as ALIBABA
from dprobe.data.common import DatasetError, SeriesDataset
from dprobe.data.h200 import NAME as H200
from dprobe.data.h200 import load_h200_series
from dprobe.data.helios import NAME as HELIOS
from dprobe.data.helios import load_helios, vc_files

# h200-profiles: its training runs as series of whole jobs (split by model family, not in time)
SERIES_LOADERS: dict[str, Callable[[Path], SeriesDataset]] = {ALIBABA: load_alibaba, HELIOS: load_helios,
                                                              H200: load_h200_series}


# what dprobe train says where its data is not there (conf/paths/default.yaml: paths.data_dir)
WHERE_DATA_GOES = ("set DPROBE_DATA_DIR=DIR, run from a directory holding datasets/, or pass paths.data_dir=DIR "
                   "(the data sets are datasets/ of dprobe's repository)")
# small cuts of bundled data sets that ship inside the package (tools/cut_replay_sample.py writes them), for what
# must run where dprobe is installed from the package alone: the sidecar's replay without a GPU
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
# the source checkout's datasets/ (where dprobe is imported from a checkout; nothing there in an installed wheel)
CHECKOUT_DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def data_dir_candidates(folder: str) -> list[Path]:
    """Where bundled data set ``folder`` is looked for, in order: ``$DPROBE_DATA_DIR/folder``,
    ``./datasets/folder``, then the source checkout's ``datasets/folder``."""
    candidates = []
    if os.environ.get("DPROBE_DATA_DIR"):
        candidates.append(Path(os.environ["DPROBE_DATA_DIR"]) / folder)
    candidates += [Path.cwd() / "datasets" / folder, CHECKOUT_DATASETS / folder]
    return candidates


def packaged_sample(folder: str) -> Path | None:
    """The sample of bundled data set ``folder`` that ships in the package, or None where there is none."""
    path = SAMPLES_DIR / folder
    return path if path.is_dir() else None


def find_data_dir(folder: str, hint: str = "pass its directory", sample: bool = False) -> tuple[Path, bool]:
    """Where bundled data set ``folder`` lives (:func:`data_dir_candidates`), and whether that is the packaged
    sample (``sample``: taken only where no full copy is found, :func:`packaged_sample`). FileNotFoundError,
    in one line, naming the places looked in and ``hint`` (how to point elsewhere)."""
    candidates = data_dir_candidates(folder)
    for path in candidates:
        if path.is_dir():
            return path, False
    cut = packaged_sample(folder) if sample else None
    if cut is not None:
        return cut, True
    raise FileNotFoundError(f"bundled data set {folder} not found (looked in {', '.join(map(str, candidates))});"
                            f" set DPROBE_DATA_DIR or {hint}")


def bundled_dir(folder: str, hint: str = "pass its directory") -> Path:
    """Where bundled data set ``folder`` lives: ``$DPROBE_DATA_DIR``, ``./datasets`` or the source
    checkout's, never the packaged sample; FileNotFoundError naming the places looked in and ``hint`` (how to
    point elsewhere)."""
    return find_data_dir(folder, hint)[0]


def detect_dataset(directory: str | Path) -> str:
    """The name of the bundled data set whose layout ``directory`` follows."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DatasetError(f"{directory}: not a directory")
    if any((directory / f"{stem}{s}").is_file() for stem in (DUTY_FILE, MEMORY_FILE) for s in (".csv.gz", ".csv")):
        return ALIBABA
    if vc_files(directory):
        return HELIOS
    if (directory / "runs.csv").is_file() and (directory / "samples.csv").is_file():
        return H200
    if any((directory / f"philly{s}").is_file() for s in (".csv.gz", ".csv")):
        return "philly-jobs"
    if any(directory.glob("cluster*.csv.gz")) or any(directory.glob("cluster*.csv")):
        return "itp-elasticflow"
    raise DatasetError(
        f"{directory}: not laid out like a known data set: expected {DUTY_FILE}.csv.gz and / or "
        f"{MEMORY_FILE}.csv.gz ({ALIBABA}), vc*.csv.gz ({HELIOS}), runs.csv + samples.csv (h200-profiles), "
        "philly.csv.gz (philly-jobs) or cluster*.csv.gz (itp-elasticflow)"
    )


def load_series_dataset(directory: str | Path) -> SeriesDataset:
    """Load a directory of series (alibaba-genai-2026 or helios-earth-vc layout; h200-profiles: its training
    runs, one series each)."""
    name = detect_dataset(directory)
    if name not in SERIES_LOADERS:
        raise DatasetError(f"{directory}: {name} holds runs or jobs, not series; evaluate it with its own experiment")
    return SERIES_LOADERS[name](Path(directory))
