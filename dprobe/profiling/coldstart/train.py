"""Training the cold-start model on h200-profiles: its leave-family-out scores, then the model fitted on
every run, saved as a checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprobe.profiling.coldstart.checkpoint import KIND, VERSION
from dprobe.profiling.coldstart.crossval import cross_validate
from dprobe.profiling.coldstart.dataset import (
    ProfileDataset,
    concat_datasets,
    load_benchmark_dataset,
    load_dataset,
)
from dprobe.profiling.coldstart.features import FEATURES
from dprobe.profiling.coldstart.fit import DEFAULTS, fit, for_machines, unseen_gpu_shift
from dprobe.profiling.coldstart.model import TARGETS, ColdStartEnsemble


def train_coldstart(data_dir: str, out_dir: str, max_epochs: int = 400, seed: int = 0, folds: int | None = None,
                    workers: int | None = 1, progress: bool = True, benchmarks: list[str] | None = None,
                    **hparams: Any) -> dict:
    """Fit on every run of ``data_dir`` and save ``out_dir/coldstart.pt`` (loadable with weights_only=True).
    ``benchmarks``: timm training benchmark folders (e.g. datasets/timm-train-rtx3090) whose step times,
    on their own GPUs, are learnt from too (:func:`~dprobe.profiling.coldstart.dataset.load_benchmark_dataset`);
    with runs on more than one GPU the checkpoint also learns how much wider p90s must be on a GPU it
    never saw (:func:`~dprobe.profiling.coldstart.fit.unseen_gpu_shift`).
    ``folds``: the leave-family-out scores in that many groups of families (:func:`cross_validate`);
    ``workers``: processes for the replays and the folds (1: none; None: one per core, at most four);
    ``progress``: bars over the replays and the folds.

    Returns ``{"checkpoint": path, "metrics": {...}, "table": str, "plot": path, "cv_util": {...}}``:
    leave-family-out metrics (learned and analytical), their table against the targets (also
    ``out_dir/report.txt``), ``out_dir/lofo.png``, their picture (predicted against measured, run by
    run), and the leave-family-out utilisation prediction of each run by run id (for the job-scale model).
    """
    from dprobe.profiling.coldstart.report import format_scores, host_factor_note, plot_cross_validation

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(hparams.pop("cache_dir", out / "cache"))
    hp = {**DEFAULTS, **hparams}
    ds = load_dataset(data_dir, cache, progress=progress, workers=workers)
    parts = [load_benchmark_dataset(b, progress=progress) for b in benchmarks or []]
    ds = concat_datasets([ds, *parts])
    cv = cross_validate(data_dir, cache, max_epochs=max_epochs, seed=seed, ds=ds, progress=progress, folds=folds,
                        workers=workers, **hp)
    factors = cv.host_factors  # learnt from every run
    model = fit(for_machines(ds, factors), np.arange(len(ds.run_ids)), max_epochs, seed, hp)
    unseen = unseen_gpu_shift(for_machines(ds, factors), max_epochs, seed, hp) if hp["graph_dim"] == 0 else {}
    memory_factors = {gpu: f for b in benchmarks or [] for gpu, f in [benchmark_memory_factor(b, ds, model)]}
    ckpt = {"version": VERSION, "kind": KIND, "features": FEATURES, "targets": TARGETS,
            "gpus": sorted(set(ds.gpus)),  # the GPUs the model learnt from
            # added to the p90 residual of a job on a GPU not in "gpus" (log; per target where measured)
            "unseen_gpu_p90_shift": {k: round(v, 4) for k, v in unseen.items()},
            # per GPU whose fit / does-not-fit labels the model learnt from: its stack's factor on memory
            "memory_factors": {k: round(v, 4) for k, v in memory_factors.items()},
            # the machines it learnt from: how slowly each one's host issued ops (1: typical)
            "host_factors": {m: round(math.exp(v), 4) for m, v in factors.items()},
            "hparams": {k: v for k, v in hp.items()}, "n_features": len(FEATURES),
            "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "metrics": {"learned": cv.learned, "typical_machine": cv.typical_machine,
                        "analytical": cv.analytical}}
    path = out / "coldstart.pt"
    torch.save(ckpt, path)
    plot = plot_cross_validation(cv, out / "lofo.png")
    grouped = f" in {cv.folds} folds" if cv.folds < cv.families else ""
    table = (f"cold start, leave-model-family-out on {data_dir}: {cv.runs} runs, {cv.families} families"
             f"{grouped}\n"
             + format_scores(cv.learned, cv.analytical, cv.typical_machine)[0]
             + "\n" + host_factor_note(cv) + per_gpu_note(cv)
             + "".join(f"\nleft out: {r}" for r in ds.skipped))
    (out / "report.txt").write_text(table + "\n")
    return {"checkpoint": str(path), "metrics": ckpt["metrics"], "table": table, "plot": str(plot),
            "cv_util": cv.utilisation_by_run()}


def benchmark_memory_factor(directory: str, ds: ProfileDataset, model: ColdStartEnsemble) -> tuple[str, float]:
    """The GPU of a timm benchmark folder and the factor on ``model``'s predicted memory that gets most of
    its fit / does-not-fit labels right (:func:`~dprobe.profiling.coldstart.timm_bench.fit_memory_factor`:
    the benchmark's stack, its CUDA context and workspaces, against the replay's)."""
    from dprobe.profiling.coldstart.replay import CUDA_CONTEXT_BYTES
    from dprobe.profiling.coldstart.residual import predict_targets
    from dprobe.profiling.coldstart.timm_bench import fit_label_peaks, fit_memory_factor, load_stack

    stack = load_stack(directory)
    gpu = str(stack["gpu"])
    rows = np.flatnonzero(np.asarray(ds.gpus) == gpu)
    peak = TARGETS.index("peak_memory_bytes")
    p50 = predict_targets(model, [ds.graphs[i] for i in rows], ds.feats[rows], ds.base[rows])[0][:, peak]
    up = fit_label_peaks(directory, [ds.models[i] for i in rows], p50, ds.base[rows, peak])
    return gpu, fit_memory_factor(p50, up, float(stack["gpu_memory_bytes"]), CUDA_CONTEXT_BYTES)


def per_gpu_note(cv: Any) -> str:
    """With runs on more than one GPU: each GPU's step-time MAPE and p90 coverage, leave-family-out."""
    gpus = np.asarray(cv.dataset.gpus)
    if len(set(gpus)) < 2:
        return ""
    si = TARGETS.index("step_time_seconds")
    lines = []
    for g in sorted(set(gpus)):
        on = (gpus == g) & cv.dataset.valid[:, si]
        y = cv.dataset.y[on, si]
        mape = 100 * float(np.mean(np.abs(cv.p50[on, si] - y) / y))
        lines.append(f"\n{g}: {int(on.sum())} runs with a step time, step MAPE {mape:.1f} %, "
                     f"p90 coverage {float(np.mean(y <= cv.p90[on, si])):.2f}")
    return "".join(lines)
