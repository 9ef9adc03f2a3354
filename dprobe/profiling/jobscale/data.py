"""The job-scale training set: each bundled run's first second and what the horizon after it brought, and
for the graph variant the cold-start profiler's view of the run (its replay and leave-family-out
prediction)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dprobe.profiling.jobscale.features import (
    FIRST_SECONDS,
    GRAPH_FEATURES,
    HORIZON_SECONDS,
    JobScaleDataset,
    first_second_features,
    logit,
)

if TYPE_CHECKING:
    from dprobe.profiling.coldstart.dataset import ProfileDataset

log = logging.getLogger(__name__)


def observe_run(samples: Any, batch: int, precision: str, optimizer: str, host_stall_s: float = 0.0
                ) -> tuple[list[float], list[float]] | None:
    """First-second features (:func:`first_second_features`) and horizon targets of one run's NVML
    samples (``t_rel``: seconds since the first), or None if too short."""
    t = samples["t_rel"].to_numpy()
    first = samples[t <= FIRST_SECONDS]
    later = samples[(t > FIRST_SECONDS) & (t <= FIRST_SECONDS + HORIZON_SECONDS)]
    if len(first) < 3 or len(later) < 3:
        return None
    obs = first_second_features(first, batch, precision, optimizer, host_stall_s)
    target = [float(np.quantile(later["mem_used_bytes"], 0.9)), float(later["gpu_util_pct"].mean() / 100)]
    return obs, target


def load_job_dataset(data_dir: str, cache_dir: str | Path, with_graphs: bool = True,
                     coldstart_util: dict[str, float] | None = None, seed: int = 0, folds: int | None = None,
                     progress: bool = True) -> JobScaleDataset:
    """First-second observations and horizon targets of every run; with ``with_graphs`` also each run's
    model graph, the cold-start profiler's graph-derived features and its leave-family-out prediction
    of the run's utilisation (``coldstart_util``, by run id, where the caller has them, e.g. from
    :func:`dprobe.profiling.coldstart.train.train_coldstart`; else cross-validated here, in ``folds``
    groups of families)."""
    from dprobe.data import load_h200_profiles
    from dprobe.profiling.coldstart.features import family_of

    profiles = load_h200_profiles(data_dir)
    runs = profiles.train_runs()
    graph_ds = None
    if with_graphs:
        from dprobe.profiling.coldstart.dataset import load_dataset

        graph_ds = load_dataset(data_dir, cache_dir, progress=progress)
        index = {rid: i for i, rid in enumerate(graph_ds.run_ids)}
    keep, obs, ys, fams, ids = [], [], [], [], []
    for _, row in runs.iterrows():
        rid = str(row["run_id"])
        got = observe_run(profiles.run_samples(rid), int(row["batch"]), str(row["precision"]),
                          str(row["optimizer"]), host_stall_s=float(row["host_stall_s"]))
        if got is None or (graph_ds is not None and rid not in index):
            continue
        obs.append(got[0])
        ys.append(got[1])
        fams.append(family_of(str(row["model"])))
        ids.append(rid)
        if graph_ds is not None:
            keep.append(index[rid])
    if not ids:
        raise ValueError(f"{data_dir}: no run has {FIRST_SECONDS:g} s of samples and more after it")
    out = JobScaleDataset(obs=np.array(obs), y=np.array(ys), families=fams, run_ids=ids)
    if graph_ds is not None:
        from dprobe.profiling.coldstart.features import FEATURES

        if coldstart_util is None:
            coldstart_util = coldstart_utilisation(data_dir, cache_dir, graph_ds, seed, folds, progress)
        missing = [rid for rid in ids if rid not in coldstart_util]
        if missing:
            raise ValueError(f"{data_dir}: no cold-start utilisation prediction for runs {missing[:5]}")
        cols = [FEATURES.index(f) for f in GRAPH_FEATURES]
        out.graphs = [graph_ds.graphs[i] for i in keep]
        out.coldstart_util = np.array([coldstart_util[rid] for rid in ids], dtype=np.float64)
        out.graph_feats = np.concatenate([graph_ds.feats[keep][:, cols], logit(out.coldstart_util)[:, None]], axis=1)
        out.device_estimate = graph_ds.base[keep, 1]  # replayed reserved memory + CUDA context
    return out


def coldstart_utilisation(data_dir: str, cache_dir: str | Path, graph_ds: ProfileDataset, seed: int = 0,
                          folds: int | None = None, progress: bool = True) -> dict[str, float]:
    """The cold-start profiler's leave-family-out utilisation prediction of every run, by run id."""
    from dprobe.profiling.coldstart.crossval import cross_validate

    log.info("cold-start utilisation of %d runs, leave-family-out", len(graph_ds.run_ids))
    return cross_validate(data_dir, cache_dir, seed=seed, ds=graph_ds, progress=progress, calibrate=False,
                          folds=folds).utilisation_by_run()
