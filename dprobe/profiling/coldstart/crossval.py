"""Leave-model-family-out cross-validation of the cold-start model: each family scored by models that
never saw it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dprobe.core.conformal import held_out_groups
from dprobe.profiling.coldstart.dataset import ProfileDataset, load_dataset, measured
from dprobe.profiling.coldstart.fit import DEFAULTS, fit, for_machines, host_factors
from dprobe.profiling.coldstart.model import TARGETS
from dprobe.profiling.coldstart.residual import apply_stall, predict_targets


@dataclass
class CrossValidation:
    """What :func:`cross_validate` found: the scores, and each run's held-out prediction."""

    learned: dict[str, float]  # :func:`metrics` of the learned p50 and p90
    typical_machine: dict[str, float]  # the same models told nothing of the machine (host factor 1)
    analytical: dict[str, float]  # the analytical estimate's
    families: int
    folds: int
    runs: int
    p50: np.ndarray  # [runs, 4] each run's prediction by the models that never saw its family
    p90: np.ndarray
    dataset: ProfileDataset
    host_factors: dict[str, float]  # per machine, log, from every run

    def utilisation_by_run(self) -> dict[str, float]:
        """The leave-family-out utilisation prediction of each run, by run id."""
        util = self.p50[:, TARGETS.index("gpu_utilization")]
        return {rid: float(u) for rid, u in zip(self.dataset.run_ids, util, strict=True)}


def metrics(y: np.ndarray, p50: np.ndarray, p90: np.ndarray | None = None,
            valid: np.ndarray | None = None) -> dict[str, float]:
    """Errors over the runs that have each target (``valid``; all of them if not given)."""
    from scipy.stats import spearmanr

    y = np.where(measured(y) if valid is None else valid, y, np.nan)
    ape = np.abs(p50 - y) / y
    has_step = ~np.isnan(y[:, 3])
    m = {"peak_mape": 100 * np.nanmean(ape[:, 0]), "peak_worst_ape": 100 * np.nanmax(ape[:, 0]),
         "nvml_mape": 100 * np.nanmean(ape[:, 1]), "util_mae_points": 100 * np.nanmean(np.abs(p50[:, 2] - y[:, 2])),
         "step_mape": 100 * np.nanmean(ape[:, 3]),
         "step_spearman": float(spearmanr(p50[has_step, 3], y[has_step, 3])[0])}
    if p90 is not None:
        cov = np.nanmean(np.where(np.isnan(y), np.nan, y <= p90), axis=0)
        m.update({f"p90_coverage_{t}": float(c) for t, c in zip(TARGETS, cov, strict=True)})
    return {k: float(v) for k, v in m.items()}


def _score_fold(test: np.ndarray, train: np.ndarray, max_epochs: int, seed: int, hp: dict[str, Any],
                calibrate: bool, ds: ProfileDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One leave-family-out fold: fitted on ``train``, the p50 / p90 of the runs ``test`` (told their
    machine's host factor from the training runs on it) and their p50 at the typical host factor.

    In a worker process ``ds`` comes with each fold (about 7 MB pickled for h200-profiles, a tenth of a
    second against several seconds of fitting): handed over once at the worker's start instead, it
    would go through the pipe that starts the process, and a worker that died before reading it (e.g.
    a script without ``if __name__ == "__main__"``) would leave the parent blocked on that pipe."""
    # each machine's host factor from the other families' runs on it, as a user would have it
    # from jobs that ran on that machine before
    factors = host_factors(ds, train)
    model = fit(for_machines(ds, factors), train, max_epochs, seed, hp, calibrate=calibrate)
    p50, p90 = predict_runs(model, ds, test, factors)
    return p50, p90, predict_runs(model, ds, test)[0]


def predict_runs(model: Any, ds: ProfileDataset, idx: np.ndarray,
                 factors: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The p50 and p90 ``[len(idx), 4]`` that ``model`` gives the runs ``idx`` of ``ds``, as ``dprobe predict``
    gives a job (its features are the CLI's, :func:`~dprobe.profiling.coldstart.job.job_inputs`): each run
    on its machine's host factor (``factors``, log, :func:`~dprobe.profiling.coldstart.fit.host_factors`; a
    machine not in it counts as typical, as ``dprobe predict`` without ``--host-factor``), its host stall
    put back (``--host-stall``)."""
    idx = np.asarray(idx)
    fold = for_machines(ds, factors or {})
    p50, p90 = predict_targets(model, [ds.graphs[i] for i in idx], fold.feats[idx], fold.base[idx])
    apply_stall(p50, p90, ds.stall[idx])
    return p50, p90


def cross_validate(data_dir: str, cache_dir: str | Path, max_epochs: int = 400, seed: int = 0,
                   ds: ProfileDataset | None = None, progress: bool = True, train_families: int | None = None,
                   calibrate: bool = True, folds: int | None = None, workers: int | None = 1,
                   trainable: np.ndarray | None = None, **hparams: Any) -> CrossValidation:
    """Leave-model-family-out: each family is scored by a model trained on the other families only
    (``progress``: a bar over the folds). ``folds``: deal the families at random (seeded by ``seed``)
    into that many groups and leave out one group at a time instead, which is quicker with many families
    and still never scores a family that was in training. ``train_families``: train on that many of the
    other families, drawn at random, to see how the errors fall with more families. ``calibrate=False``
    skips the p90 calibration (its p90 coverage is then not meaningful; the p50 is the same, and quicker).
    ``workers``: folds fitted in that many processes at once (1: none; None: one per core, at most four;
    the scores do not depend on it). ``trainable``: a mask of the runs a fold may learn from (e.g. one
    GPU's, to score the others as a GPU no training run was on); every run is still predicted."""
    from dprobe.core.workers import map_folds, resolve_workers

    hp = {**DEFAULTS, **hparams}
    ds = ds if ds is not None else load_dataset(data_dir, cache_dir, workers=workers)
    fams = np.array(ds.families)
    n = len(fams)
    p50, p90 = np.zeros((n, 4)), np.zeros((n, 4))
    p50_typical = np.zeros((n, 4))  # the same models, told nothing of the machine (host factor of a typical one)
    rng = np.random.default_rng(seed)
    groups = held_out_groups(fams, folds, seed)
    plans = []
    for test in groups:
        others = sorted(set(fams) - set(fams[test]))
        if train_families is not None:
            others = list(rng.choice(others, size=min(train_families, len(others)), replace=False))
        train = np.isin(fams, others) if trainable is None else np.isin(fams, others) & trainable
        plans.append((test, np.where(train)[0]))
    score = partial(_score_fold, max_epochs=max_epochs, seed=seed, hp=hp, calibrate=calibrate, ds=ds)
    scored = map_folds(score, plans, resolve_workers(workers), "cold start, leave-family-out", progress)
    for (test, _), (fold_p50, fold_p90, fold_typical) in zip(plans, scored, strict=True):
        p50[test], p90[test], p50_typical[test] = fold_p50, fold_p90, fold_typical
    analytical = ds.base.copy()
    apply_stall(analytical, analytical.copy(), ds.stall)
    return CrossValidation(learned=metrics(ds.y, p50, p90, ds.valid),
                           typical_machine=metrics(ds.y, p50_typical, valid=ds.valid),
                           analytical=metrics(ds.y, analytical, valid=ds.valid),
                           families=len(set(fams)), folds=len(groups), runs=n, p50=p50, p90=p90,
                           dataset=ds, host_factors=host_factors(ds, np.arange(n)))
