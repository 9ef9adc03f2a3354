"""The kernel-graph network's training stage (``python train.py +exp=gnn``): fit
:class:`~dprobe.profiling.coldstart.kernel_gnn.KernelGNN` on timm's inference benchmarks with one fifth of
the model families held out, score it there beside the roofline rule and the hand-made vector model
(:mod:`dprobe.profiling.coldstart.inference`) fitted on the same rows, and save it.

The full comparison (every fold, both groupings) is ``benchmarks/graph_gnn_inference.py``; this stage is
one of its folds, so that a run of ``+exp=gnn`` trains and reports the graph network in minutes."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def train_kernel_gnn(out_dir: str, data_dir: str, held_out_fold: int = 0, folds: int = 5, epochs: int = 20,
                     hidden: int = 32, layers: int = 3, max_seconds: float | None = 300.0, threads: int = 1,
                     seed: int = 0) -> dict[str, Any]:
    """Fit on every family fold but ``held_out_fold`` (of :func:`~dprobe.profiling.coldstart.timm_infer.cv_folds`
    by family), score rule, vector and network on the fold left out; write ``kernel_gnn.pt`` (weights,
    ``torch.load(weights_only=True)``) and ``report.json`` under ``out_dir``. Returns their paths and the scores."""
    from dprobe.profiling.coldstart import inference
    from dprobe.profiling.coldstart.gpus import GPUS
    from dprobe.profiling.coldstart.kernel_gnn import (
        fit_kernel_gnn,
        graphs_for,
        inner_split,
        predict_kernel_gnn,
        scores,
    )
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    if not 0 <= held_out_fold < folds:
        raise ValueError(f"kernel_gnn.held_out_fold must be 0-{folds - 1}, not {held_out_fold}")
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs, ests = inference.load_rows(data_dir)
        name, train, test = cv_folds(runs, "family", folds)[held_out_fold]
        y = runs["step_time_s"].to_numpy(float)
        log.info("kernel GNN: %d rows to fit, %d of unseen families (%s), %d epochs", len(train), len(test),
                 name, epochs)
        graphs = graphs_for(runs, ests)
        fam = runs["family"].to_numpy()
        inner, held = inner_split(list(fam[train]), share=1 / 6, seed=seed)
        calib = fit_kernel_gnn([graphs[i] for i in train[inner]], y[train[inner]], [graphs[i] for i in train[held]],
                               y[train[held]], epochs=epochs, hidden=hidden, layers=layers, seed=seed,
                               max_seconds=max_seconds)
        fitted = fit_kernel_gnn([graphs[i] for i in train], y[train], epochs=epochs, hidden=hidden, layers=layers,
                                seed=seed, max_seconds=max_seconds)
        fitted.p90_factor = calib.p90_factor
        gnn = predict_kernel_gnn(fitted, [graphs[i] for i in test])
        vector = inference.fit(runs.iloc[train].reset_index(drop=True), [ests[i] for i in train])
        x = inference.feature_frame([ests[i] for i in test], list(runs["precision"].iloc[test]),
                                    [GPUS[g] for g in runs["gpu"].iloc[test]])
        v50, v90 = inference.predict_frame(x, model=vector)
        r50, r90 = inference.predict_frame(x, model=vector.as_rule())
    finally:
        torch.set_num_threads(threads_before)
    table = {"rule": scores(y[test], r50, r90), "vector": scores(y[test], v50, v90),
             "gnn": scores(y[test], gnn, gnn * fitted.p90_factor)}
    checkpoint = out / "kernel_gnn.pt"
    torch.save(fitted.state(), checkpoint)
    report = {"held_out": name, "rows_fitted": int(len(train)), "rows_held_out": int(len(test)),
              "families_held_out": sorted(set(fam[test])), "epochs": epochs, "scores": table,
              "seconds": time.perf_counter() - start,
              "benchmark": "python benchmarks/graph_gnn_inference.py (every fold, both groupings)"}
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=1, default=float))
    lines = [f"Kernel-graph network, inference step time on families never seen ({name}, {len(test)} rows):"]
    for key, s in table.items():
        lines.append(f"  {key:7s} MAPE {s['mape']:5.1f} %  Spearman {s['spearman']:.3f}  p90 covers "
                     f"{s['p90_coverage']:.0f} %")
    print("\n".join(lines))
    return {"checkpoint": str(checkpoint), "report": str(path),
            "gnn_mape": float(table["gnn"]["mape"]), "vector_mape": float(table["vector"]["mape"]),
            "rule_mape": float(table["rule"]["mape"]), "seconds": report["seconds"],
            "table": "\n".join(lines)}
