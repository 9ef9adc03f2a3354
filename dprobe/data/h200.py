"""h200-profiles: training / serving runs on an H200 with 10 Hz NVML samples and per-step allocator figures."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dprobe.data.common import (
    COUNT,
    NON_NEGATIVE,
    PERCENT,
    POSITIVE_COUNT,
    SECONDS,
    DatasetError,
    SeriesDataset,
    family_of,
    read_csv,
)
from dprobe.graph.cache import cached_model_graph
from dprobe.graph.schema import GraphError, ModelGraph

NAME = "h200-profiles"
RUN_COLUMNS = [
    "collection", "run_id", "kind", "status", "lib", "model", "config", "arch", "config_kwargs", "task",
    "image", "seq", "vocab", "batch", "precision", "optimizer", "params", "param_bytes",
    "peak_alloc_bytes", "peak_reserved_bytes", "nvml_peak_used_bytes", "step_time_median_s",
    "nvml_gpu_util_pct_mean_2nd_half", "t_begin", "t_end",
]
RUN_NUMERIC = [
    "collection", "image", "seq", "vocab", "batch", "params", "param_bytes", "peak_alloc_bytes",
    "peak_reserved_bytes", "nvml_peak_used_bytes", "step_time_median_s", "nvml_gpu_util_pct_mean_2nd_half",
    "t_begin", "t_end",
]
# what the numeric columns may hold (blank: missing); a value outside is an error naming file, column and row
RUN_RANGES = {
    "collection": POSITIVE_COUNT, "image": POSITIVE_COUNT, "seq": POSITIVE_COUNT, "vocab": POSITIVE_COUNT,
    "batch": POSITIVE_COUNT, "params": COUNT, "param_bytes": COUNT, "peak_alloc_bytes": COUNT,
    "peak_reserved_bytes": COUNT, "nvml_peak_used_bytes": COUNT, "step_time_median_s": NON_NEGATIVE,
    "nvml_gpu_util_pct_mean_2nd_half": PERCENT, "t_begin": SECONDS, "t_end": SECONDS,
}
SAMPLE_RANGES = {"collection": POSITIVE_COUNT, "t": SECONDS, "gpu_util_pct": PERCENT, "mem_util_pct": PERCENT,
                 "mem_used_bytes": NON_NEGATIVE, "mem_total_bytes": NON_NEGATIVE, "power_w": NON_NEGATIVE,
                 "sm_clock_mhz": NON_NEGATIVE}
STEP_RANGES = {"collection": POSITIVE_COUNT, "step": COUNT, "t_start": SECONDS, "t_end": SECONDS,
               "batch": POSITIVE_COUNT, "alloc_bytes": COUNT, "reserved_bytes": COUNT, "peak_alloc_bytes": COUNT}
SAMPLE_COLUMNS = ["collection", "t", "label", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
                  "mem_total_bytes", "power_w", "sm_clock_mhz"]
STEP_COLUMNS = ["collection", "run_id", "step", "phase", "t_start", "t_end", "batch", "alloc_bytes",
                "reserved_bytes", "peak_alloc_bytes"]
SAMPLE_PERIOD_S = 0.1
# run settings that runs.csv leaves blank for a whole collection, as the data set's README states them
# (collection 1 ran with cudnn.benchmark on)
COLLECTION_SETTINGS: dict[int, dict[str, object]] = {1: {"cudnn_benchmark": True}}
# where ``phases`` is true, every 25th step is preceded by an evaluation pass and a 0.25 s stall (README)
PHASE_STALL_S, PHASE_EVERY = 0.25, 25
# the GPU of a collection that env.json does not name (the data set's own)
DEFAULT_GPU = "NVIDIA H200"


def read_env(directory: Path) -> dict[str, dict]:
    """``env.json``: each collection's GPU and library versions, keyed ``collection_N`` ({} if absent)."""
    path = directory / "env.json"
    if not path.is_file():
        return {}
    try:
        env = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(env, dict) or not all(isinstance(v, dict) for v in env.values()):
        raise DatasetError(f"{path}: expected an object of collections, e.g. {{\"collection_1\": {{\"gpu\": ...}}}}")
    for key, entry in env.items():
        check_gpu_entry(entry, f"{path}: {key}")
    return env


def check_gpu_entry(entry: dict, where: str) -> None:
    """A :class:`DatasetError` (prefixed ``where``) for a collection's ``gpu`` that is not a name or a
    ``gpu_total_bytes`` that is not a number of bytes > 0 (either may be absent)."""
    total = entry.get("gpu_total_bytes")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int | float)
                              or not 0 < total < float("inf")):
        raise DatasetError(f"{where}: 'gpu_total_bytes' must be a number of bytes > 0, got {total!r}")
    if not isinstance(entry.get("gpu", ""), str):
        raise DatasetError(f"{where}: 'gpu' must be the GPU's name, got {entry['gpu']!r}")


def _collection_gpu(runs: pd.DataFrame, env: dict[str, dict]) -> pd.DataFrame:
    """Each run's GPU name and memory (bytes; NaN where unknown) from its collection's env.json entry."""
    entries = [env.get(f"collection_{int(c)}", {}) for c in runs["collection"]]
    return pd.DataFrame({"gpu": [str(e.get("gpu") or DEFAULT_GPU) for e in entries],
                         "gpu_total_bytes": [float(e.get("gpu_total_bytes") or np.nan) for e in entries]},
                        index=runs.index)


def _parse_kwargs(path: Path, value: object, run_id: str) -> dict:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value == "":
        return {}
    try:
        parsed = json.loads(str(value))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: column 'config_kwargs' of run {run_id} is not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise DatasetError(f"{path}: column 'config_kwargs' of run {run_id} must be a JSON object")
    return parsed


def _flag(values: pd.Series) -> pd.Series:
    return values.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0")).astype(bool)


def _host_stall(runs: pd.DataFrame) -> pd.Series:
    """Seconds per step the GPU waits on the host: the phases' data-loading stall, spread over its steps."""
    phases = _flag(runs.get("phases", pd.Series(False, index=runs.index)))
    return phases.astype(float) * (PHASE_STALL_S / PHASE_EVERY)


def _setting(runs: pd.DataFrame, name: str) -> pd.Series:
    """A boolean run setting: the column where given, else its collection's setting, else False."""
    given = runs.get(name, pd.Series(np.nan, index=runs.index))
    from_collection = runs["collection"].map(lambda c: COLLECTION_SETTINGS.get(int(c), {}).get(name))
    return _flag(given.where(given.notna(), from_collection))


def _step_window_nvml(runs: pd.DataFrame, samples: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """NVML while each run's measured steps ran: mean utilisation (%) and peak used memory (bytes).

    The window runs from the first step after warm-up to the end of the last step. ``runs.csv``'s
    ``nvml_gpu_util_pct_mean_2nd_half`` and ``nvml_peak_used_bytes`` cover the *whole* run instead,
    which in collection 1 includes FLOP counting and cuDNN autotuning: an idle GPU that can bring
    the utilisation to a fifth of the training figure, and a memory peak up to 4 GiB above the
    training's. Runs without steps, or without samples in the window, keep the whole-run figures.
    """
    measured = steps[steps["phase"] != "warmup"]
    window = measured.groupby("run_id").agg(t0=("t_start", "min"), t1=("t_end", "max"))
    out = pd.DataFrame({"gpu_util_pct_steps": runs["nvml_gpu_util_pct_mean_2nd_half"].astype(float),
                        "nvml_used_bytes_steps": runs["nvml_peak_used_bytes"].astype(float)}, index=runs.index)
    by_run = dict(list(samples.groupby(["collection", "label"])))
    for i, (rid, collection) in enumerate(zip(runs["run_id"], runs["collection"], strict=True)):
        if rid not in window.index or (collection, rid) not in by_run:
            continue
        s = by_run[(collection, rid)]
        inside = s[(s["t"] >= window.loc[rid, "t0"]) & (s["t"] <= window.loc[rid, "t1"])]
        if len(inside):
            out.iloc[i] = [float(inside["gpu_util_pct"].mean()), float(inside["mem_used_bytes"].max())]
    return out


def check_one_state(directory: Path, runs: pd.DataFrame, samples: pd.DataFrame, steps: pd.DataFrame,
                    env: dict[str, dict]) -> None:
    """A :class:`DatasetError` naming a run whose collection the files disagree on, as when they come from
    different states of the data set (files replaced one by one, and the replacing stopped halfway): a
    collection of runs.csv without a sample in samples.csv, with an ``ok`` run but without a step in
    steps.csv (which has steps of others), or without an ``env.json`` entry where an earlier collection
    has one written by ``dprobe profiles add`` (it writes one for each collection it adds). A collection with
    its ``env.json`` entry is whole (the entry is written last). runs.csv may list fewer runs than samples.csv
    and steps.csv hold."""
    sampled, stepped = set(samples["collection"]), set(steps["collection"])
    added = [int(k.split("_")[1]) for k, v in env.items() if re.fullmatch(r"collection_\d+", k) and "added" in v]
    for collection, group in runs.groupby("collection", sort=True):
        number = int(collection)
        if f"collection_{number}" in env:  # env.json is swapped in last: its entry means the rest is there too
            continue  # (a session may have no NVML sample, a dry run on the CPU)
        missing = None
        if collection not in sampled:
            missing = f"samples.csv has no sample of collection {number}"
        elif len(steps) and collection not in stepped and (group["status"] == "ok").any():
            missing = f"steps.csv has no step of collection {number}"
        elif f"collection_{number}" not in env and any(m < number for m in added):
            earlier = max(m for m in added if m < number)
            missing = (f"env.json has no collection_{number} (it has collection_{earlier}, written by "
                       "`dprobe profiles add`)")
        if missing:
            raise DatasetError(
                f"{directory}: run {group['run_id'].iloc[0]} of collection {number} is in runs.csv, but {missing}: "
                "the files are not from one state of the data set (were they replaced one by one and the "
                "replacing stopped halfway?); put back all four files of one state")


@dataclass
class H200Profiles:
    """The three tables of h200-profiles, checked and typed.

    ``runs``: one row per run (spec, measured peaks; ``config_kwargs`` parsed to
    dicts, ``image`` defaulting to 224 for image models; derived: ``cudnn_benchmark``,
    ``host_stall_s``; ``gpu_util_pct_steps`` and ``nvml_used_bytes_steps``, the
    mean NVML utilisation and peak used memory while the measured steps ran; ``gpu`` and
    ``gpu_total_bytes``, the device its collection ran on, from ``env.json``, an H200 where it is
    silent). ``samples``: NVML samples (``label`` names the run on the GPU). ``steps``: per-step
    allocator figures. ``env``: ``env.json``, one entry per collection.
    """

    runs: pd.DataFrame
    samples: pd.DataFrame
    steps: pd.DataFrame
    env: dict[str, dict] = field(default_factory=dict)

    def train_runs(self, ok_only: bool = True) -> pd.DataFrame:
        runs = self.runs[self.runs["kind"] == "train"]
        if ok_only:
            runs = runs[runs["status"] == "ok"]
        return runs.reset_index(drop=True)

    def run_samples(self, run_id: str) -> pd.DataFrame:
        """NVML samples of one run, with ``t_rel`` = seconds since the run's first sample."""
        run = self.runs.loc[self.runs["run_id"] == run_id]
        if run.empty:
            raise KeyError(f"no run {run_id!r}")
        collection = run["collection"].iloc[0]
        s = self.samples[(self.samples["collection"] == collection) & (self.samples["label"] == run_id)]
        s = s.sort_values("t").copy()
        s["t_rel"] = s["t"] - (s["t"].iloc[0] if len(s) else 0.0)
        return s.reset_index(drop=True)

    def run_steps(self, run_id: str) -> pd.DataFrame:
        return self.steps[self.steps["run_id"] == run_id].sort_values("step").reset_index(drop=True)


def load_h200_profiles(directory: str | Path) -> H200Profiles:
    """Load a directory laid out like ``datasets/h200-profiles`` (runs.csv, samples.csv, steps.csv; env.json
    names each collection's GPU)."""
    directory = Path(directory)
    paths = {name: directory / f"{name}.csv" for name in ("runs", "samples", "steps")}
    for name, path in paths.items():
        if not path.is_file():
            raise DatasetError(f"{directory}: missing file {name}.csv")
    runs = read_csv(paths["runs"], RUN_COLUMNS, numeric=RUN_NUMERIC, ranges=RUN_RANGES)
    runs["run_id"] = runs["run_id"].astype(str)
    repeated = sorted(set(runs.loc[runs["run_id"].duplicated(), "run_id"]))
    if repeated:
        raise DatasetError(f"{paths['runs']}: run id(s) {', '.join(repeated[:5])} appear more than once (each run "
                           "needs an id of its own across collections; `dprobe profiles add` renumbers them)")
    runs["config_kwargs"] = [
        _parse_kwargs(paths["runs"], v, rid) for v, rid in zip(runs["config_kwargs"], runs["run_id"], strict=True)
    ]
    is_vision = runs["lib"].isin(["torchvision", "timm"])
    runs.loc[is_vision & runs["image"].isna(), "image"] = 224
    runs["cudnn_benchmark"] = _setting(runs, "cudnn_benchmark")
    runs["host_stall_s"] = _host_stall(runs)
    for col in ("precision", "optimizer", "kind", "status", "lib", "model"):
        runs[col] = runs[col].astype("string")
    samples = read_csv(paths["samples"], SAMPLE_COLUMNS, numeric=[c for c in SAMPLE_COLUMNS if c != "label"],
                       ranges=SAMPLE_RANGES)
    samples["label"] = samples["label"].astype(str)
    steps = read_csv(paths["steps"], STEP_COLUMNS,
                     numeric=[c for c in STEP_COLUMNS if c not in ("run_id", "phase")], ranges=STEP_RANGES)
    steps["run_id"] = steps["run_id"].astype(str)
    runs[["gpu_util_pct_steps", "nvml_used_bytes_steps"]] = _step_window_nvml(runs, samples, steps)
    env = read_env(directory)
    check_one_state(directory, runs, samples, steps, env)
    runs[["gpu", "gpu_total_bytes"]] = _collection_gpu(runs, env)
    return H200Profiles(runs=runs, samples=samples, steps=steps, env=env)


# the training runs as series (a job-scale task of the forecaster): NVML samples on the 0.1 s grid, forecast
# from each run's first second on, 1, 5 and 10 s ahead
JOB_FREQ = pd.Timedelta(milliseconds=100)
JOB_LEAD_STEPS = (10, 50, 100)
JOB_FIRST_ORIGIN = 10
JOB_TARGETS = {"gpu_memory_bytes": "mem_used_bytes", "gpu_duty_cycle_pct": "gpu_util_pct"}


def load_h200_series(directory: str | Path) -> SeriesDataset:
    """The training runs of an h200-profiles directory as a data set of whole jobs: one series per run
    (``unique_id`` its run id) of NVML device memory (``gpu_memory_bytes``) and utilisation
    (``gpu_duty_cycle_pct``, percent) on the 0.1 s grid from its first sample, grouped by model family
    (split by family, not in time: :meth:`dprobe.core.split.Split.group_role`). Which model each run
    trains is in runs.csv (:func:`run_workloads`)."""
    profiles = load_h200_profiles(directory)
    runs = profiles.train_runs()
    if runs.empty:
        raise DatasetError(f"{directory}: no training run with status ok in runs.csv")
    samples = profiles.samples
    frames, groups = [], {}
    for run in runs.itertuples(index=False):
        s = samples[(samples["collection"] == run.collection) & (samples["label"] == run.run_id)]
        if len(s) < 2:
            continue
        step = np.rint((s["t"].to_numpy() - s["t"].min()) / JOB_FREQ.total_seconds()).astype(int)
        values = s[list(JOB_TARGETS.values())].groupby(step).mean()
        grid = np.arange(int(step.max()) + 1)
        values = values.reindex(grid)
        frame = pd.DataFrame({"unique_id": run.run_id, "ds": pd.Timestamp(0) + grid * JOB_FREQ})
        for target, column in JOB_TARGETS.items():
            frame[target] = values[column].to_numpy(dtype=float)
        frame["gap"] = frame[list(JOB_TARGETS)].isna().any(axis=1)
        frames.append(frame)
        groups[run.run_id] = family_of(str(run.model))
    if not frames:
        raise DatasetError(f"{directory}: no training run has NVML samples in samples.csv")
    return SeriesDataset(name=NAME, frame=pd.concat(frames, ignore_index=True), targets=list(JOB_TARGETS),
                         covariates=[], freq=JOB_FREQ, lead_steps=JOB_LEAD_STEPS, season_length=JOB_FIRST_ORIGIN,
                         units={"gpu_memory_bytes": "bytes", "gpu_duty_cycle_pct": "percent"}, groups=groups,
                         first_origin=JOB_FIRST_ORIGIN)


def run_workloads(directory: str | Path) -> pd.DataFrame:
    """The ``workloads.csv`` rows (:mod:`dprobe.data.workloads`) of an h200-profiles directory's training runs,
    from runs.csv: which model each run's series trains, at which batch and size."""
    runs = load_h200_profiles(directory).train_runs()
    rows = []
    for _, run in runs.iterrows():
        spec = run_spec(run)
        rows.append({"series": str(run["run_id"]), "model": spec["model"], "batch": spec["batch"],
                     "image": spec["image"], "seq": spec["seq"],
                     "config_kwargs": json.dumps(spec["config_kwargs"]) if spec["config_kwargs"] else None})
    return pd.DataFrame(rows, columns=["series", "model", "batch", "image", "seq", "config_kwargs"])


def run_spec(run_row: Any) -> dict[str, Any]:
    """Model spec of an h200-profiles runs.csv row (see the data card's "How a model is rebuilt")."""
    get = run_row.get if hasattr(run_row, "get") else lambda k, d=None: getattr(run_row, k, d)
    lib = str(get("lib"))
    kwargs = get("config_kwargs") or {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs) if kwargs.strip() else {}
    if isinstance(kwargs, float):
        kwargs = {}
    if lib == "transformers":
        model = f"transformers:{get('config')}/{get('arch')}"
    elif lib in ("torchvision", "timm"):
        model = f"{lib}:{get('model')}"
    else:
        raise GraphError(f"run {get('run_id')}: cannot rebuild a model of lib {lib!r}")

    def num(key: str) -> int | None:
        v = get(key)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)

    return {"model": model, "config_kwargs": dict(kwargs), "batch": int(get("batch")),
            "image": num("image") if lib != "transformers" else None,
            "seq": num("seq") if lib == "transformers" else None}


def graph_for_run(run_row: Any, cache_dir: str | Path | None = None) -> ModelGraph:
    """Graph of a run (at the run's batch size), cached as JSON under ``cache_dir`` keyed by spec hash."""
    return cached_model_graph(run_spec(run_row), cache_dir)
