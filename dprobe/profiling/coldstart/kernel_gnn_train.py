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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

DEV_ROWS = 96  # rows a fast_dev_run fits on (and a third as many it scores), one epoch


def train_kernel_gnn(out_dir: str, data_dir: str, held_out_fold: int = 0, folds: int = 5, epochs: int = 20,
                     hidden: int = 32, layers: int = 3, max_seconds: float | None = 300.0, threads: int = 1,
                     seed: int = 0, fast_dev_run: bool = False) -> dict[str, Any]:
    """Fit on every family fold but ``held_out_fold`` (of :func:`~dprobe.profiling.coldstart.timm_infer.cv_folds`
    by family), score rule, vector and network on the fold left out; write ``kernel_gnn.pt`` (weights,
    ``torch.load(weights_only=True)``) and ``report.json`` under ``out_dir``. Returns their paths and the scores.
    ``fast_dev_run`` (``trainer.fast_dev_run``, as tests set it): a check that the stage runs end to end, on
    :data:`DEV_ROWS` rows of the fitting families and a third as many of the held-out ones, one epoch."""
    from dprobe.core.gpus import GPUS
    from dprobe.profiling.coldstart import inference
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
        if fast_dev_run:
            epochs, pick = 1, np.random.default_rng(seed)
            train = np.sort(pick.choice(train, size=min(DEV_ROWS, len(train)), replace=False))
            test = np.sort(pick.choice(test, size=min(DEV_ROWS // 3, len(test)), replace=False))
        y = runs["step_time_s"].to_numpy(float)
        log.info("kernel GNN: %d rows to fit, %d of unseen families (%s), %d epochs", len(train), len(test),
                 name, epochs)
        rows = np.concatenate([train, test])  # each row's graph, by its index in runs
        graphs = dict(zip(rows.tolist(), graphs_for(runs.iloc[rows], [ests[i] for i in rows]), strict=True))
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


# --- training steps (benchmarks/graph_gnn_training.py) ---------------------------------------------------

def training_step_rows(data_dir: str, cache_dir: str, bench_dirs: Sequence[str] = (),
                       workers: int | None = 1) -> tuple[Any, list[Any], list[str]]:
    """The cold-start training set (:func:`~dprobe.profiling.coldstart.dataset.load_dataset` of ``data_dir``,
    then each of ``bench_dirs`` by :func:`~dprobe.profiling.coldstart.dataset.load_benchmark_dataset`, joined as
    ``benchmarks/coldstart_gpus.py`` joins them), each row's replayed training step and its precision, in its
    order. The replays come from the caches training reads (``cache_dir``, where a run not cached is replayed
    and cached; a benchmark folder's ``replays.jsonl.gz``)."""
    from dprobe.data import load_h200_profiles
    from dprobe.profiling.coldstart.dataset import (
        _stack_or_error,
        concat_datasets,
        load_benchmark_dataset,
        load_dataset,
        run_inputs,
    )
    from dprobe.profiling.coldstart.replay import ReplayEstimate
    from dprobe.profiling.coldstart.stack import stack_of_record
    from dprobe.profiling.coldstart.timm_bench import (
        REPLAYS,
        load_stack,
        load_timm_bench,
        read_replays,
        replay_key,
    )

    ds = load_dataset(data_dir, cache_dir, progress=False, workers=workers)
    profiles = load_h200_profiles(data_dir)
    runs = profiles.train_runs()
    runs["stack"] = [_stack_or_error(row, profiles.env) for _, row in runs.iterrows()]
    runs = runs.set_index(runs["run_id"].astype(str)).loc[ds.run_ids]
    ests = [run_inputs(row, cache_dir)[1].est for _, row in runs.iterrows()]
    precisions = [str(p) for p in runs["precision"]]
    parts = [ds]
    for bench_dir in bench_dirs:
        bench = load_benchmark_dataset(bench_dir, progress=False)
        stack = load_stack(bench_dir)
        fused = stack_of_record(stack).attention == "fused"
        cache = read_replays(Path(bench_dir) / REPLAYS)
        table = load_timm_bench(bench_dir).runs.drop_duplicates("model").set_index("model")
        for model, batch in zip(bench.models, bench.batch, strict=True):
            key = replay_key(model, int(batch), int(table.loc[model, "image"]), str(stack["precision"]),
                             str(stack["optimizer"]), fused)
            if key not in cache:
                raise ValueError(f"{bench_dir}: timm:{model} was replayed here, not read from its cache")
            ests.append(ReplayEstimate.from_dict(cache[key]["est"]))
            precisions.append(str(stack["precision"]))
        parts.append(bench)
    return concat_datasets(parts), ests, precisions


def _training_fold(graphs: list, host_scale: np.ndarray, y: np.ndarray, test: int,
                   fit_kw: dict[str, Any]) -> tuple[np.ndarray, float, int]:
    """One fold of :func:`crossval_training_gnn`: each of ``graphs`` put on its machine's host factor
    (``host_scale``), the GNN fitted on all but the last ``test`` of them (measured steps ``y``), its p50 of
    those last ones, its training seconds and epochs."""
    from dprobe.profiling.coldstart.kernel_gnn import fit_kernel_gnn, predict_kernel_gnn

    for g, s in zip(graphs, host_scale, strict=True):
        g.host_scale = torch.tensor([float(s)], dtype=torch.float64)
    cut = len(graphs) - test
    fitted = fit_kernel_gnn(graphs[:cut], y, **fit_kw)
    return predict_kernel_gnn(fitted, graphs[cut:]), fitted.seconds, len(fitted.history)


def crossval_training_gnn(ds: Any, graphs: list, folds: int | None = 20, seed: int = 0,
                          trainable: np.ndarray | None = None, scored: np.ndarray | None = None,
                          workers: int = 1, **fit_kw: Any) -> dict[str, Any]:
    """Leave-family-out cross-validation of the GNN on training-step graphs (``graphs``, one per row of the
    cold-start training set ``ds``, from :func:`~dprobe.profiling.coldstart.kernel_gnn.training_graph`), on
    the folds :func:`~dprobe.profiling.coldstart.crossval.cross_validate` deals
    (:func:`~dprobe.core.conformal.held_out_groups` of the families, ``folds`` and ``seed`` as given there):
    each fold fitted once, one fixed recipe (``fit_kw`` for :func:`~dprobe.profiling.coldstart.kernel_gnn.fit_kernel_gnn`),
    on the other families' rows (those of ``trainable`` only, where given, as ``cross_validate``'s), each
    graph's ``host_scale`` its machine's host factor from the fold's training rows
    (:func:`~dprobe.profiling.coldstart.fit.host_factors`, as the vector model is told it). Rows ``scored``
    (default: all) of each fold left out are predicted. Returns ``{"pred": [rows] (NaN where not scored),
    "folds": [{rows, seconds, epochs}], "groups": the test rows of each fold}``; ``workers``: folds fitted in
    that many processes at once (the figures do not depend on it)."""
    from dprobe.core.conformal import held_out_groups
    from dprobe.core.workers import map_folds
    from dprobe.profiling.coldstart.fit import host_factors
    from dprobe.profiling.coldstart.model import TARGETS

    fams = np.asarray(ds.families)
    n = len(fams)
    scored = np.ones(n, dtype=bool) if scored is None else np.asarray(scored, dtype=bool)
    y = ds.y[:, TARGETS.index("step_time_seconds")]
    plans, tests = [], []
    for test in held_out_groups(fams, folds, seed):
        others = np.isin(fams, sorted(set(fams) - set(fams[test])))
        if trainable is not None:
            others &= trainable
        train = np.flatnonzero(others & np.isfinite(y) & (y > 0))
        factors = host_factors(ds, train)
        scale = np.exp([factors.get(m, 0.0) for m in ds.machines])
        test = test[scored[test]]
        rows = np.concatenate([train, test])  # a worker gets the fold's graphs only
        tests.append(test)
        plans.append(([graphs[i] for i in rows], scale[rows], y[train], len(test), fit_kw))
    results = map_folds(_training_fold, plans, workers, "kernel GNN, training steps, leave-family-out", False)
    pred = np.full(n, np.nan)
    out = []
    for test, (p, seconds, epochs) in zip(tests, results, strict=True):
        pred[test] = p
        out.append({"rows": int(len(test)), "seconds": seconds, "epochs": epochs})
    return {"pred": pred, "folds": out, "groups": tests}
