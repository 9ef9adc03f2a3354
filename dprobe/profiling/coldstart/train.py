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
from dprobe.profiling.coldstart.dataset import load_dataset
from dprobe.profiling.coldstart.features import FEATURES
from dprobe.profiling.coldstart.fit import DEFAULTS, fit, for_machines
from dprobe.profiling.coldstart.model import TARGETS


def train_coldstart(data_dir: str, out_dir: str, max_epochs: int = 400, seed: int = 0, folds: int | None = None,
                    workers: int | None = 1, progress: bool = True, **hparams: Any) -> dict:
    """Fit on every run of ``data_dir`` and save ``out_dir/coldstart.pt`` (loadable with weights_only=True).
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
    cv = cross_validate(data_dir, cache, max_epochs=max_epochs, seed=seed, ds=ds, progress=progress, folds=folds,
                        workers=workers, **hp)
    factors = cv.host_factors  # learnt from every run
    model = fit(for_machines(ds, factors), np.arange(len(ds.run_ids)), max_epochs, seed, hp)
    ckpt = {"version": VERSION, "kind": KIND, "features": FEATURES, "targets": TARGETS,
            "gpus": sorted(set(ds.gpus)),  # the GPUs the model learnt from
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
             + "\n" + host_factor_note(cv)
             + "".join(f"\nleft out: {r}" for r in ds.skipped))
    (out / "report.txt").write_text(table + "\n")
    return {"checkpoint": str(path), "metrics": ckpt["metrics"], "table": table, "plot": str(plot),
            "cv_util": cv.utilisation_by_run()}
