"""The profilers' training set: every training run of an h200-profiles directory, its training step
replayed and its model graph traced (both cached), with the measurements the cold-start model learns and
the job-scale model reads."""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dprobe.core.gpus import gpu_key, gpu_spec
from dprobe.data.h200 import graph_for_run, run_spec
from dprobe.graph.cache import graph_cache_path
from dprobe.graph.encoder import graph_to_data
from dprobe.profiling.coldstart.features import family_of, replay_cache_path
from dprobe.profiling.coldstart.job import JobInputs, job_inputs
from dprobe.profiling.coldstart.model import TARGETS
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.coldstart.residual import busy_utilisation
from dprobe.profiling.coldstart.stack import DEFAULT_STACK, STACKS, SoftwareStack, stack_of_record

log = logging.getLogger(__name__)


@dataclass
class ProfileDataset:
    """Runs as the profilers learn from them, one row each (targets in the order of ``TARGETS``)."""

    graphs: list  # the model graph as PyG ``Data`` (None where not wanted)
    feats: np.ndarray  # [n, len(FEATURES)] job features
    base: np.ndarray  # [n, 4] the analytical estimate of each target
    y: np.ndarray  # [n, 4] the measurements
    y_fit: np.ndarray  # [n, 4] what the model learns: utilisation as the busy share, without the host stalls
    valid: np.ndarray  # [n, 4] the targets a run has (a missing measurement is left out of loss and scores)
    stall: np.ndarray  # [n] seconds per step the GPU waits on the host
    families: list[str]
    run_ids: list[str]
    models: list[str]
    batch: np.ndarray
    gpus: list[str]  # the GPU each run was measured on
    machines: list[str]  # the machine (a collection of runs measured on one host)
    skipped: list[str] = field(default_factory=list)  # runs left out, each with its reason


def arch_family(lib: str, model: str) -> str:
    """The family a run is held out with: a timm model's module (resnet50 and resnet18d: "resnet"; ViT-S and
    DeiT-B: "vision_transformer" / "deit"), as timm benchmarks group them; any other model's name stem
    (:func:`family_of`)."""
    if lib == "timm":
        from dprobe.profiling.coldstart.timm_bench import timm_module

        module = timm_module(model)
        if module:
            return module
    return family_of(model)


def measured(y: np.ndarray) -> np.ndarray:
    """Which targets a run has: a finite, positive measurement."""
    return np.isfinite(y) & (y > 0)


def make_dataset(graphs: list, feats: np.ndarray, base: np.ndarray, y: np.ndarray, families: list[str],
                 run_ids: list[str], models: list[str] | None = None, batch: np.ndarray | None = None,
                 stall: np.ndarray | None = None, valid: np.ndarray | None = None,
                 gpus: list[str] | None = None, machines: list[str] | None = None) -> ProfileDataset:
    """The training set (see :func:`load_dataset`); no stalls, every target with a positive measurement
    valid and every run on an H200, all on one machine, unless given."""
    n = len(run_ids)
    y = np.asarray(y, dtype=np.float64)
    stall = np.zeros(n) if stall is None else np.asarray(stall, dtype=np.float64)
    y_fit = y.copy()
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    y_fit[:, ui] = busy_utilisation(y[:, ui], y[:, si], stall)
    return ProfileDataset(graphs=graphs, feats=np.asarray(feats, dtype=np.float64), base=np.asarray(base),
                          y=y, y_fit=y_fit, valid=measured(y) if valid is None else valid,
                          stall=stall, families=list(families), run_ids=list(run_ids),
                          models=list(models) if models is not None else ["?"] * n,
                          batch=np.ones(n) if batch is None else batch,
                          gpus=list(gpus) if gpus else ["h200"] * n,
                          machines=list(machines) if machines else ["machine"] * n)


def run_stack(row: Any, env: dict[str, dict]) -> SoftwareStack:
    """The software stack a runs.csv row was measured on: its collection's PyTorch and memory format
    (``env.json``; h200-profiles' where it names none) and the run's ``cudnn_benchmark``."""
    entry = env.get(f"collection_{int(row['collection'])}", {})
    return stack_of_record({"torch": entry.get("torch") or STACKS[DEFAULT_STACK].torch,
                            "memory_format": entry.get("memory_format"),
                            "cudnn_benchmark": bool(row["cudnn_benchmark"])})


def _stack_or_error(row: Any, env: dict[str, dict]) -> SoftwareStack | ValueError:
    """:func:`run_stack`, or why there is none (the run is then left out, not the data set)."""
    try:
        return run_stack(row, env)
    except ValueError as exc:
        return exc


def run_inputs(row: Any, cache_dir: str | Path, roofline: str = "plain") -> tuple[dict[str, Any], JobInputs]:
    """A runs.csv row (with its ``stack``, :func:`run_stack`) as ``dprobe predict`` would see the job: its
    model spec and :func:`~dprobe.profiling.coldstart.job.job_inputs` on its GPU and stack (replay cached;
    ``roofline``: the replay roofline of its features)."""
    if isinstance(row["stack"], Exception):  # its record names a stack dprobe cannot take
        raise row["stack"]
    spec = run_spec(row)
    gpu = gpu_spec(str(row["gpu"]), float(row["gpu_total_bytes"]))
    inputs = job_inputs(spec["model"], spec["batch"], str(row["precision"]), str(row["optimizer"]), gpu=gpu,
                        stack=row["stack"], image=spec["image"], seq=spec["seq"],
                        config_kwargs=spec["config_kwargs"], cache_dir=cache_dir, roofline=roofline)
    return spec, inputs


def _replay_run(row: Any, cache_dir: str | Path, roofline: str = "plain") -> tuple[dict[str, Any], JobInputs, Any]:
    """A runs.csv row's model spec, job inputs and model graph (both cached)."""
    spec, inputs = run_inputs(row, cache_dir, roofline)
    return spec, inputs, graph_for_run(row, cache_dir)


def _is_cached(row: Any, cache_dir: str | Path) -> bool:
    """Whether the run's replay and graph are both in the cache (or cannot be made at all)."""
    try:
        spec = run_spec(row)
        replay = replay_cache_path(spec["model"], spec["batch"], str(row["precision"]), str(row["optimizer"]),
                                   spec["image"], spec["seq"], spec["config_kwargs"], cache_dir,
                                   attention=row["stack"].attention)
    except Exception:  # the sequential pass reports what is wrong with the run
        return True
    graph = graph_cache_path(spec, cache_dir)
    return replay is not None and replay.is_file() and graph is not None and graph.is_file()


def _warm_one(row: dict[str, Any], cache_dir: str) -> None:
    with contextlib.suppress(Exception):  # the sequential pass reports what is wrong with the run
        _replay_run(row, cache_dir)


def warm_cache(runs: Any, cache_dir: str | Path, workers: int, progress: bool = True) -> None:
    """Replay and trace the runs not yet in ``cache_dir`` in ``workers`` processes (the replays are
    single-threaded Python: one per core is that many times as fast); the caller then reads the cache."""
    todo = [row for row in runs.to_dict("records") if not _is_cached(row, cache_dir)]
    if workers < 2 or len(todo) < 2:
        return
    from concurrent.futures import as_completed

    from dprobe.core.workers import spawn_pool

    try:
        with spawn_pool(workers) as pool:
            futures = [pool.submit(_warm_one, row, str(cache_dir)) for row in todo]
            for _ in tqdm(as_completed(futures), total=len(futures), unit="run", leave=False, disable=not progress,
                          desc=f"replaying training steps ({workers} processes)"):
                pass
    except BrokenProcessPool as exc:  # a worker died (e.g. out of memory): the caller replays the rest itself
        log.warning("replay workers stopped (%s); replaying the remaining runs in this process", exc)


def load_dataset(data_dir: str, cache_dir: str | Path, progress: bool = True,
                 workers: int | None = 1, roofline: str = "plain") -> ProfileDataset:
    """Graphs, features, analytical baselines and measured targets of every ok training run.

    ``y`` holds the measurements; ``y_fit`` the targets the model learns, where utilisation is the busy
    share without the run's host stalls (``stall``, seconds per step), which prediction puts back.
    Memory and utilisation as NVML shows them are taken while the measured steps ran (the loader's
    ``nvml_used_bytes_steps``, ``gpu_util_pct_steps``), not over setup work before them. ``valid``
    marks the targets a run has (a missing measurement is left out of the loss and the scores).
    ``progress``: a progress bar over the runs (replays are cached, so it is quick after the first time).
    ``workers``: processes for the replays not yet cached (1: none; None: one per core, at most four).
    A run that cannot be used (no spec for its GPU, a model this install cannot build or replay) is
    left out, logged, and listed in ``skipped``. ``roofline``: the replay roofline of the features and
    the analytical baselines (:func:`~dprobe.profiling.coldstart.features.op_seconds`; the shipped
    profiler's is ``plain``).
    """
    from dprobe.core.workers import resolve_workers
    from dprobe.data import load_h200_profiles

    profiles = load_h200_profiles(data_dir)
    runs = profiles.train_runs()
    runs["stack"] = [_stack_or_error(row, profiles.env) for _, row in runs.iterrows()]
    t0 = time.time()
    warm_cache(runs, cache_dir, resolve_workers(workers), progress)
    graphs, feats, bases, ys, fams, ids, gpus, machines, skipped = [], [], [], [], [], [], [], [], []
    for _, row in tqdm(runs.iterrows(), total=len(runs), desc="replaying training steps", unit="run",
                       leave=False, disable=not progress):
        try:
            spec, inputs, graph = _replay_run(row, cache_dir, roofline)
        except Exception as exc:  # a GPU without a spec, a model this install cannot build or replay: left out
            reason = (str(exc).splitlines() or [""])[0][:200]
            skipped.append(f"run {row['run_id']} ({row['lib']}:{row['model']}, collection {int(row['collection'])}): "
                           f"{type(exc).__name__}: {reason}")
            log.warning("left out: %s", skipped[-1])
            continue
        graphs.append(graph_to_data(graph))
        gpus.append(gpu_key(str(row["gpu"])))
        machines.append(f"collection {int(row['collection'])}")  # one session on one machine
        feats.append(inputs.feats)
        bases.append(inputs.base)
        ys.append([row["peak_alloc_bytes"], row["nvml_used_bytes_steps"],
                   row["gpu_util_pct_steps"] / 100.0, row["step_time_median_s"]])
        fams.append(arch_family(str(row["lib"]), str(row["model"])))
        ids.append(str(row["run_id"]))
    log.info("features of %d runs in %.1f s", len(ids), time.time() - t0)
    if not ids:
        raise ValueError(f"{data_dir}: no run could be replayed" + (f", e.g. {skipped[0]}" if skipped else ""))
    if skipped:
        log.warning("%d of %d runs of %s left out: no spec for their GPU, or their models could not be built "
                    "or replayed here", len(skipped), len(runs), data_dir)
    kept = runs.set_index(runs["run_id"].astype(str)).loc[ids]  # the replayed runs, in order
    ds = make_dataset(graphs, np.array(feats), np.array(bases), np.array(ys), fams, ids,
                      models=[str(m) for m in kept["model"]], batch=kept["batch"].to_numpy(),
                      stall=kept["host_stall_s"].to_numpy(dtype=np.float64), gpus=gpus, machines=machines)
    ds.skipped = skipped
    return ds


def concat_datasets(parts: list[ProfileDataset]) -> ProfileDataset:
    """Several training sets as one (their runs in order; run ids must differ)."""
    if len(parts) == 1:
        return parts[0]
    ids = [r for p in parts for r in p.run_ids]
    if len(set(ids)) != len(ids):
        raise ValueError("the training sets share run ids")
    arrays = ("feats", "base", "y", "y_fit", "valid", "stall", "batch")
    lists = ("graphs", "families", "run_ids", "models", "gpus", "machines", "skipped")
    fields: dict[str, Any] = {k: np.concatenate([getattr(p, k) for p in parts]) for k in arrays}
    fields.update({k: [v for p in parts for v in getattr(p, k)] for k in lists})
    return ProfileDataset(**fields)


def load_benchmark_dataset(directory: str | Path, memory_format: str = "nchw",
                           progress: bool = True, roofline: str = "plain") -> ProfileDataset:
    """The runs of a timm training benchmark folder (:mod:`~dprobe.profiling.coldstart.timm_bench`, e.g.
    datasets/timm-train-rtx3090) as training rows: step time only (memory and utilisation not measured
    there), families by timm module, the GPU of its ``stack.json``, replays from its cache (a job not in
    it is replayed here). A model this timm cannot build or replay is left out and listed in ``skipped``.
    Graphs are not traced (None): these rows serve models without a graph embedding. ``roofline``: as
    :func:`load_dataset`'s."""
    from dprobe.core.gpus import GPUS
    from dprobe.profiling.coldstart.timm_bench import (
        REPLAYS,
        load_timm_bench,
        read_replays,
        replay_key,
        replay_one,
    )

    bench = load_timm_bench(directory, memory_format)
    stack = bench.stack
    key = str(stack["gpu"])
    if key not in GPUS:
        raise ValueError(f"{directory}: stack.json names the GPU {key!r}, which dprobe has no spec for "
                         f"({', '.join(GPUS)})")
    gpu = replace(GPUS[key], memory_bytes=float(stack["gpu_memory_bytes"]))
    cache = read_replays(Path(directory) / REPLAYS)
    precision, optimizer, software = str(stack["precision"]), str(stack["optimizer"]), stack_of_record(stack)
    fused = software.attention == "fused"
    feats, bases, ys, fams, ids, models, batches, skipped = [], [], [], [], [], [], [], []
    for r in tqdm(bench.runs.itertuples(), total=len(bench.runs), desc="benchmark runs", unit="run",
                  leave=False, disable=not progress):
        rec = cache.get(replay_key(r.model, int(r.batch), int(r.image), precision, optimizer, fused))
        if rec is None:
            rec = replay_one(r.model, int(r.batch), int(r.image), precision, optimizer, fused)
        if "error" in rec:
            skipped.append(f"{key} benchmark, timm:{r.model} batch {r.batch}: {rec['error']}")
            continue
        inputs = job_inputs(f"timm:{r.model}", int(r.batch), precision, optimizer, gpu=gpu, stack=software,
                            image=int(r.image), est=ReplayEstimate.from_dict(rec["est"]), roofline=roofline)
        feats.append(inputs.feats)
        bases.append(inputs.base)
        ys.append([np.nan, np.nan, np.nan, r.step_time_s])
        fams.append(str(r.family))
        ids.append(f"{key}:{r.model}")
        models.append(str(r.model))
        batches.append(int(r.batch))
    if skipped:
        log.warning("%d of %d runs of %s left out (their models could not be built or replayed here)",
                    len(skipped), len(bench.runs), directory)
    n = len(ids)
    ds = make_dataset([None] * n, np.array(feats).reshape(n, -1), np.array(bases).reshape(n, 4),
                      np.array(ys).reshape(n, 4), fams, ids, models=models, batch=np.array(batches),
                      gpus=[key] * n, machines=[f"{key} benchmark"] * n)
    ds.skipped = skipped
    return ds
