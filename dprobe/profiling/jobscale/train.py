"""Training the job-scale model: fitting a variant, calibrating its upper quantiles on held-out families,
the leave-model-family-out comparison of the variants, and the checkpoint."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch

from dprobe.core.conformal import conformal_shift, family_folds, held_out_groups
from dprobe.core.metrics import pinball_terms
from dprobe.profiling.coldstart.model import fit_standardisation
from dprobe.profiling.jobscale.data import load_job_dataset
from dprobe.profiling.jobscale.features import (
    COLDSTART_FEATURE,
    GRAPH_FEATURES,
    OBS_FEATURES,
    JobScaleDataset,
)
from dprobe.profiling.jobscale.model import (
    LEVELS,
    VARIANTS,
    JobScaleNet,
    anchors,
    graph_anchor,
    model_inputs,
    persist,
    predict_quantiles,
    residual_quantiles,
    to_residual,
)
from dprobe.profiling.jobscale.predict import FORMAT, KIND
from dprobe.profiling.jobscale.report import format_table, plot_cross_validation, scores


def fit(ds: JobScaleDataset, idx: np.ndarray, variant: str, epochs: int = 300, seed: int = 0,
        graph_dim: int = 0) -> JobScaleNet:
    torch.manual_seed(seed)
    x = torch.tensor(model_inputs(ds, idx, variant), dtype=torch.float32)
    r = torch.tensor(to_residual(ds.measured[idx], anchors(ds, idx, variant)), dtype=torch.float32)
    use_gnn = variant == "graph" and graph_dim > 0
    graphs = Batch.from_data_list([ds.graph_list[i] for i in idx]) if use_gnn else None
    net = JobScaleNet(x.shape[1], graph_dim=graph_dim if use_gnn else 0)
    mu, sd = fit_standardisation(x)
    net.mu.copy_(mu)
    net.sd.copy_(sd)
    levels = torch.tensor(LEVELS)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-3)
    net.train()
    for _ in range(epochs):
        opt.zero_grad()
        diff = r.unsqueeze(-1) - net(x, graphs)
        loss = pinball_terms(diff, levels).mean()
        loss.backward()
        opt.step()
    return net.eval()


def fit_memory_quantiles(ds: JobScaleDataset, idx: np.ndarray) -> np.ndarray:
    """Empirical quantiles (``LEVELS``) of log(plateau / graph anchor) over the runs ``idx``."""
    r = np.log(ds.measured[idx, 0] / graph_anchor(ds, idx))
    return np.quantile(r, LEVELS)


def calibrate_upper(ds: JobScaleDataset, idx: np.ndarray, variant: str, epochs: int = 300, seed: int = 0,
                    graph_dim: int = 0, folds: int = 3) -> np.ndarray:
    """Shifts ``(2, Q)`` of the upper residual quantiles that make them cover families held out *within*
    ``idx`` at their levels (split-conformal over families, as the cold-start profiler's p90); p50 stays.

    The runs' families are dealt into ``folds`` groups; a network fitted without each group is scored on it.
    """
    shifts = np.zeros((2, len(LEVELS)))
    fold = family_folds([ds.families[i] for i in idx], folds, seed)
    if fold is None:
        return shifts
    found = []
    for g in range(folds):
        held = fold == g
        net = fit(ds, idx[~held], variant, epochs, seed, graph_dim=graph_dim)
        r = to_residual(ds.measured[idx[held]], anchors(ds, idx[held], variant))
        found.append(r[:, :, None] - residual_quantiles(net, ds, idx[held], variant))
    s = np.concatenate(found)  # (N, 2, Q)
    for t in range(2):
        for k, level in enumerate(LEVELS[1:], start=1):
            shifts[t, k] = conformal_shift(s[:, t, k], level)
    return shifts


def _fold_predictions(test: np.ndarray, ds: JobScaleDataset, variants: list[str], epochs: int, seed: int,
                      graph_dim: int) -> dict[str, np.ndarray]:
    """Every variant's predictions ``(len(test), 2, len(LEVELS))`` of the runs ``test``, fitted on the
    runs of the other families."""
    fams = np.array(ds.families)
    train = np.flatnonzero(~np.isin(fams, fams[test]))
    out = {}
    for variant in variants:
        net = fit(ds, train, variant, epochs, seed, graph_dim=graph_dim)
        shifts = calibrate_upper(ds, train, variant, epochs, seed, graph_dim=graph_dim)
        out[variant] = predict_quantiles(net, ds, test, variant, shifts)
        if variant == "graph":  # memory: the graph rule, its quantiles from the training runs' errors
            offsets = fit_memory_quantiles(ds, train)
            out[variant][:, 0] = graph_anchor(ds, test)[:, None] * np.exp(offsets)[None, :]
    return out


def cross_validate_predictions(ds: JobScaleDataset, epochs: int = 300, seed: int = 0, graph_dim: int = 0,
                               progress: bool = True, folds: int | None = None,
                               workers: int | None = 1) -> dict[str, np.ndarray]:
    """Leave-model-family-out predictions ``(runs, 2, len(LEVELS))`` of every variant: a family is
    never in its own training set (``progress``: a bar over the folds; ``folds``: families dealt into
    that many held-out groups instead of one fold per family; ``workers``: folds fitted in that many
    processes at once, None: one per core, at most four)."""
    from dprobe.core.workers import map_folds, resolve_workers

    n = len(ds.families)
    variants = [v for v in VARIANTS if v != "graph" or ds.graph_feats is not None]
    preds = {v: np.zeros((n, 2, len(LEVELS))) for v in variants}
    preds["persist"] = np.repeat(persist(ds.obs)[:, :, None], len(LEVELS), axis=2)
    groups = held_out_groups(np.array(ds.families), folds, seed)
    fold = partial(_fold_predictions, ds=ds, variants=variants[1:], epochs=epochs, seed=seed, graph_dim=graph_dim)
    for test, got in zip(groups, map_folds(fold, [(t,) for t in groups], resolve_workers(workers),
                                           "job scale, leave-family-out", progress), strict=True):
        for variant, q in got.items():
            preds[variant][test] = q
    return preds


def score_variants(ds: JobScaleDataset, preds: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """:func:`~dprobe.profiling.jobscale.report.scores` of each variant's predictions (``persist`` has no
    quantiles to cover with)."""
    result = {v: scores(ds.measured, q) for v, q in preds.items()}
    result["persist"].pop("p90_coverage", None)
    result["persist"].pop("p99_coverage", None)
    return result


def cross_validate(ds: JobScaleDataset, epochs: int = 300, seed: int = 0, graph_dim: int = 0,
                   folds: int | None = None, workers: int | None = 1) -> dict[str, dict[str, float]]:
    """Leave-model-family-out scores of every variant (:func:`cross_validate_predictions`)."""
    return score_variants(ds, cross_validate_predictions(ds, epochs, seed, graph_dim, folds=folds, workers=workers))


def write_predictions(ds: JobScaleDataset, preds: dict[str, np.ndarray], path: Path) -> Path:
    """Every run's leave-family-out quantiles of every variant as CSV (run_id, family, variant, target,
    p50, p90, p99; memory plateau in bytes, utilisation 0-1): what the forecaster's job series are
    compared with (:mod:`dprobe.evaluation.jobs`)."""
    import pandas as pd

    rows = [{"run_id": rid, "family": fam, "variant": variant, "target": target,
             **{f"p{round(100 * level)}": float(q[i, k, j]) for j, level in enumerate(LEVELS)}}
            for variant, q in preds.items() for i, (rid, fam) in enumerate(zip(ds.run_ids, ds.families, strict=True))
            for k, target in enumerate(("memory_plateau_bytes", "gpu_utilization"))]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def train_jobscale(data_dir: str, out_dir: str, use_graph: bool = True, epochs: int = 300, seed: int = 0,
                   graph_dim: int = 0, cache_dir: str | Path | None = None,
                   folds: int | None = None, coldstart_util: dict[str, float] | None = None,
                   workers: int | None = 1, progress: bool = True, fast_dev_run: bool = False) -> dict[str, Any]:
    """Cross-validate every variant, fit the chosen one on all runs, save ``jobscale.pt`` and a report.
    ``folds``: leave out that many groups of families in turn, not one family at a time; ``workers``:
    processes fitting the folds side by side (None: one per core, at most four); ``progress``: bars over
    the replays and the folds.

    ``graph_dim > 0`` adds a GNN embedding of the model graph to the graph-derived features
    (slow on a CPU: about a second an epoch over all graphs). ``coldstart_util``: the cold-start
    profiler's leave-family-out utilisation predictions by run id
    (:func:`~dprobe.profiling.jobscale.data.load_job_dataset`).
    At inference the graph variant's utilisation anchor and input is the cold-start profiler's
    prediction for the job (``dprobe predict``), as the checkpoint records (``util_anchor``).
    ``fast_dev_run`` (``trainer.fast_dev_run``, as tests set it): a check that the stage runs end to end,
    one epoch, two folds, in this process.
    """
    if fast_dev_run:
        epochs, folds, workers = 1, 2, 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_job_dataset(data_dir, cache_dir or out / "cache", with_graphs=use_graph,
                          coldstart_util=coldstart_util, seed=seed, folds=folds, progress=progress)
    preds = cross_validate_predictions(ds, epochs, seed, graph_dim=graph_dim, progress=progress, folds=folds,
                                       workers=workers)
    result = score_variants(ds, preds)
    table = format_table(result, len(ds.run_ids), len(set(ds.families)), folds)
    variant = "graph" if use_graph else "no_graph"
    plot = plot_cross_validation(ds, preds, variant, out / "lofo.png")
    (out / "report.md").write_text(table + f"\n![{variant} against persist, run by run]({plot.name})\n")
    lofo = write_predictions(ds, preds, out / "lofo.csv")
    every = np.arange(len(ds.run_ids))
    net = fit(ds, every, variant, epochs, seed, graph_dim=graph_dim)
    shifts = calibrate_upper(ds, every, variant, epochs, seed, graph_dim=graph_dim)
    ckpt = {"kind": KIND, "format": FORMAT, "variant": variant, "obs_features": OBS_FEATURES,
            "graph_features": [*GRAPH_FEATURES, COLDSTART_FEATURE] if variant == "graph" else [],
            # utilisation residuals are taken from this: the first second's mean, or the cold-start prediction
            "util_anchor": "coldstart_util" if variant == "graph" else "util_mean",
            "n_features": int(model_inputs(ds, np.arange(1), variant).shape[1]),
            "graph_dim": int(net.encoder.out.out_features) if net.encoder is not None else 0,
            "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}, "cv": result,
            "quantile_shifts": shifts.tolist(),  # for predict_quantiles(..., shifts)
            "memory_log_offsets": (fit_memory_quantiles(ds, every).tolist()
                                   if variant == "graph" else None)}
    torch.save(ckpt, out / "jobscale.pt")
    return {"checkpoint": str(out / "jobscale.pt"), "report": str(out / "report.md"), "table": table,
            "metrics": result, "plot": str(plot), "predictions": str(lofo)}
