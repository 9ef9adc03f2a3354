"""Calibration of a fitted forecaster on the validation windows, and the checkpoint it gives.

After training, one pass of the network over every validation window (:func:`validation_outputs`)
chooses, per task and lead, the point forecast to serve (:func:`select_point_sources`) and the shifts
that make the quantiles' coverage nominal (:func:`conformal_shifts`); the forecaster as it will serve
then chooses how its quantiles widen below the first trained lead (:func:`select_short_lead_exponents`).
:func:`build_checkpoint` runs these in order and returns the ``dprobe.pt`` dict
(:mod:`dprobe.forecaster.checkpoint`).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch

from dprobe.core.metrics import pinball_terms
from dprobe.forecaster.checkpoint import ModelForecaster, checkpoint_dict
from dprobe.forecaster.features import REGIMES, last_observed
from dprobe.forecaster.runtime import TrainedForecaster

log = logging.getLogger(__name__)
# a lead's point forecast source: one name, or a name per regime (REGIMES)
PointSource = str | list[str]


@torch.no_grad()
def validation_outputs(module, datamodule) -> dict[int, dict[str, np.ndarray]]:
    """One pass of the network over the validation windows, per task: its quantiles ``q`` (N, H, Q),
    the windows' simple forecasts ``p`` (N, C), targets ``y`` (N, H), ``scale`` (N,), ``series`` (N,)
    and regime ``r`` (N,). What :func:`select_point_sources` and :func:`conformal_shifts` work on."""
    module.eval()
    cols: dict[int, dict[str, list[np.ndarray]]] = {}
    for batch in datamodule.calibration_dataloader():
        q = module(batch.features, batch.stats, batch.task, batch.workload, batch.known).numpy()  # (B, H, Q)
        task = batch.task.numpy()
        for k in np.unique(task):
            rows = task == k
            got = cols.setdefault(int(k), {})
            for name, value in (("q", q), ("p", batch.points.numpy()), ("y", batch.target.numpy()),
                                ("scale", batch.scale.numpy()), ("series", batch.series.numpy()),
                                ("r", batch.regime.numpy())):
                got.setdefault(name, []).append(value[rows])
    return {k: {name: np.concatenate(v) for name, v in got.items()} for k, got in cols.items()}


def select_point_sources(module, datamodule, confidence: float = 0.9, n_boot: int = 500,
                         seed: int = 0, min_regime: int = 200,
                         outputs: dict[int, dict[str, np.ndarray]] | None = None) -> list[list[PointSource]]:
    """For each task and lead, the point forecast to serve, chosen on the validation windows: a name per
    regime, or ``model`` for each lead of a task without validation windows.

    Candidates: the model's p50 held within the simple forecasts, as served (``model``: within all of
    them; ``model_recent``: within the recent ones; :func:`~dprobe.forecaster.features.within_candidates`),
    and the simple forecasts of the window (last value, recent medians and means, EWMA;
    :data:`~dprobe.forecaster.features.SIMPLE_POINTS`). Errors are in the metric's own units, as the
    evaluation counts them. A candidate must beat what it would replace in at least ``confidence`` of
    ``n_boot`` bootstrap resamples of the validation *series* (whole series are resampled, so a gain
    that comes from a few series does not count): the last value is the default, the lowest-MAE
    candidate that beats it is chosen, and ``model`` must also beat ``model_recent``, the more
    cautious version of itself. The choice is stored in the checkpoint; the quantiles stay the
    model's (raised where needed to at least the chosen point, which is kept as chosen).

    The choice is made per regime of the window (:data:`~dprobe.forecaster.features.REGIMES`: its last
    step ``moved``, an earlier one of the last few did, or it ``held``), each lead's entry being one
    name per regime: after a change the network knows more of what follows than the last value
    does, while a held value is often best left as it is. A regime with fewer than ``min_regime`` validation windows takes the choice made
    on all of them. ``outputs``: :func:`validation_outputs`, when already at hand.
    """
    from dprobe.forecaster.features import POINT_CANDIDATES, within_candidates

    names = list(POINT_CANDIDATES)
    outputs = validation_outputs(module, datamodule) if outputs is None else outputs
    rng = np.random.default_rng(seed)
    choice: list[list[PointSource]] = []
    for k in range(len(datamodule.tasks)):
        if k not in outputs:
            choice.append(["model" for _ in range(module.hparams.n_leads)])
            continue
        w = outputs[k]
        p50, cands, series, regime = w["q"][..., 0], w["p"], w["series"], w["r"]  # (N, H), (N, C), (N,), (N,)
        model_points = [within_candidates(p50, cands), within_candidates(p50, cands, recent=True)]  # as served
        points = np.concatenate([np.stack(model_points, axis=1), np.repeat(cands[:, :, None], p50.shape[1], axis=2)],
                                axis=1)
        err = np.abs(points - w["y"][:, None, :]) * w["scale"][:, None, None]  # (N, 2+C, H)
        overall = _robust_choice(err, series, names, confidence, n_boot, rng)
        per_regime = [_robust_choice(err[regime == r], series[regime == r], names, confidence, n_boot, rng, overall)
                      if (regime == r).sum() >= min_regime else overall for r in range(len(REGIMES))]
        choice.append([list(c) for c in zip(*per_regime, strict=True)])
    return choice


def _robust_choice(err: np.ndarray, series: np.ndarray, names: list[str], confidence: float, n_boot: int,
                   rng: np.random.Generator, defaults: list[str] | None = None) -> list[str]:
    """``err`` (N, C, H) absolute errors, ``series`` (N,) -> per lead the chosen candidate's name.
    ``defaults``: per lead, what a candidate has to beat (the last value when not given)."""
    uniq, inv = np.unique(series, return_inverse=True)
    sums = np.zeros((len(uniq), *err.shape[1:]))  # per series: error sums and window counts
    counts = np.zeros((len(uniq), *err.shape[1:]))
    np.add.at(sums, inv, np.nan_to_num(err))
    np.add.at(counts, inv, ~np.isnan(err))
    draws = rng.integers(0, len(uniq), size=(n_boot, len(uniq)))
    boot = sums[draws].sum(1) / np.maximum(counts[draws].sum(1), 1)  # (n_boot, C, H) MAE per resample
    mae = sums.sum(0) / np.maximum(counts.sum(0), 1)  # (C, H)
    # a candidate and the more cautious one it must also beat
    cautious = {names.index("model"): names.index("model_recent")} if "model_recent" in names else {}
    out = []
    for h in range(err.shape[2]):
        base = names.index(defaults[h] if defaults else "last_value")
        beats = (boot[:, :, None, h] < boot[:, None, :, h]).mean(0) >= confidence  # (C, C): row beats column
        ok = [c for c in range(len(names)) if c == base or beats[c, base]]
        best = min(ok, key=lambda c: mae[c, h])
        if best in cautious and cautious[best] in ok and not beats[best, cautious[best]]:
            best = cautious[best]
        out.append(names[best])
    return out


def conformal_shifts(module, datamodule, point_sources: list[list] | None = None, min_windows: int = 50,
                     by_regime: bool | None = None,
                     outputs: dict[int, dict[str, np.ndarray]] | None = None) -> list[list[list[list[float]]]]:
    """Per task, regime, lead and quantile: the shift (window units) that makes validation coverage nominal.

    Conformalised quantile regression, one-sided: for level a, the shift is the
    a-quantile (finite-sample corrected: :func:`dprobe.core.conformal.conformal_shift`) of ``y - q_a``
    over the validation windows, so ``q_a + shift`` covers a share a of them. The p50 gets no shift.
    With ``point_sources``, coverage is that of what is served: an upper quantile
    is raised to at least the chosen point, so windows at or below the point are
    covered whatever the shift, and the shift is calibrated on the others.

    Each regime of the window (:data:`~dprobe.forecaster.features.REGIMES`) may be calibrated on its own
    windows (Mondrian conformal prediction: a value that just moved is less certain than one held for
    a while), a lead of a regime with fewer than ``min_windows`` of them taking the shift of all.
    ``by_regime`` None decides per task by two-fold cross-fitting over the validation series: the
    regimes get shifts of their own where that lowers the pinball loss (in the metric's units) of the
    upper quantiles on the series they were not calibrated on, else all regimes share one.
    ``outputs``: :func:`validation_outputs`, when already at hand.
    """
    from dprobe.forecaster.features import served_point

    levels = np.asarray(module.hparams.quantiles, dtype=float)
    outputs = validation_outputs(module, datamodule) if outputs is None else outputs
    shifts = []
    for k in range(len(datamodule.tasks)):
        out = np.zeros((len(REGIMES), module.hparams.n_leads, len(levels)))
        if k in outputs:
            w = dict(outputs[k])
            w["point"] = (served_point(w["q"][..., 0], w["p"], point_sources[k], w["r"])
                          if point_sources is not None else np.full(w["y"].shape, -np.inf))
            split = by_regime
            if split is None:
                fold = w["series"] % 2
                loss = {b: sum(_upper_pinball(w, fold == f, _fit_shifts(w, fold != f, levels, min_windows, b), levels)
                               for f in (0, 1)) for b in (False, True)}
                split = bool(loss[True] < loss[False])
                log.info("%s: quantiles calibrated %s (cross-fitted pinball %.4g by regime, %.4g pooled)",
                         datamodule.task_specs[k].name if hasattr(datamodule, "task_specs") else k,
                         "per regime" if split else "on all windows", loss[True], loss[False])
            out = _fit_shifts(w, np.ones(len(w["y"]), bool), levels, min_windows, split)
        shifts.append(out.tolist())
    return shifts


def _fit_shifts(w: dict[str, np.ndarray], rows: np.ndarray, levels: np.ndarray, min_windows: int,
                by_regime: bool) -> np.ndarray:
    """``(R, H, Q)`` shifts from the validation windows ``rows`` of one task (see :func:`conformal_shifts`)."""
    y, q, point, regime = w["y"][rows], w["q"][rows], w["point"][rows], w["r"][rows]
    sc = y[..., None] - q
    covered = (y <= point)[..., None] & (levels > 0.5)[None, None, :]
    sc = np.where(covered, -np.inf, sc)
    overall = _shifts(sc, levels, min_windows)
    out = np.repeat(overall[None], len(REGIMES), axis=0)
    for r in range(len(REGIMES) if by_regime else 0):  # Mondrian: each regime on its own windows
        out[r] = _shifts(sc[regime == r], levels, min_windows, overall)
    return out


def _upper_pinball(w: dict[str, np.ndarray], rows: np.ndarray, shifts: np.ndarray, levels: np.ndarray) -> float:
    """Summed pinball loss, in the metric's units, of the served upper quantiles (shifted, raised to the
    point) on the validation windows ``rows``."""
    upper = levels > 0.5
    q = w["q"][rows][..., upper] + shifts[w["r"][rows]][..., upper]
    q = np.maximum(q, w["point"][rows][..., None])
    err = (w["y"][rows][..., None] - q) * w["scale"][rows][:, None, None]  # (N, H, U)
    return float(np.nansum(pinball_terms(err, levels[upper])))


def _shifts(sc: np.ndarray, levels: np.ndarray, min_windows: int, fallback: np.ndarray | None = None) -> np.ndarray:
    """``(N, H, Q)`` conformity scores -> ``(H, Q)`` shifts; a lead with fewer than ``min_windows`` scores
    keeps ``fallback`` (0 without one)."""
    from dprobe.core.conformal import conformal_shift

    out = np.zeros(sc.shape[1:]) if fallback is None else np.array(fallback, dtype=float)
    for i, a in enumerate(levels):
        if a == 0.5:
            continue
        for j in range(sc.shape[1]):
            col = sc[:, j, i][~np.isnan(sc[:, j, i])]
            if len(col) >= min_windows:
                # windows the point covers (-inf) need no shift: count them at the lowest one needed
                finite = col[np.isfinite(col)]
                out[j, i] = conformal_shift(np.maximum(col, finite.min() if len(finite) else 0.0), a)
    return out


SHORT_LEAD_EXPONENTS = (1.0, 0.5)  # the default first: linear, then the square root


def select_short_lead_exponents(forecaster: TrainedForecaster, datamodule, confidence: float = 0.9,
                                n_boot: int = 500, seed: int = 0, max_windows: int = 20000) -> list[float]:
    """Per task, how the quantiles' spread grows below the first trained lead
    (:func:`~dprobe.forecaster.runtime.interpolate_leads`): linearly (1.0) unless the square root of
    the lead (0.5) has the lower pinball loss, in the metric's units, at leads 1 .. L-1 of the validation
    windows in at least ``confidence`` of ``n_boot`` resamples of the validation series.

    The sidecar's horizons often fall there (a minute ahead of a task trained at 5, 15 and 30 steps of
    57 s): series that move like a random walk widen fast at first, those that jump now and then
    (jobs arriving in a virtual cluster) about linearly.
    """
    from dprobe.forecaster.runtime import interpolate_leads

    rng = np.random.default_rng(seed)
    names = [str(e) for e in SHORT_LEAD_EXPONENTS]
    levels = np.asarray(forecaster.quantile_levels, dtype=float)
    out = []
    for k, ts in enumerate(datamodule.tasks):
        first = int(ts.spec.leads[0])
        rows = datamodule.calibration_rows[datamodule.calibration_rows[:, 0] == k]
        if first < 2 or not len(rows):
            out.append(SHORT_LEAD_EXPONENTS[0])
            continue
        if len(rows) > max_windows:
            rows = rows[rng.choice(len(rows), max_windows, replace=False)]
        series, origin = rows[:, 1], rows[:, 2]
        values, cov = ts.windows(series, origin, forecaster.context_length)  # (N, context), (N, context, C)
        cond = known = None
        if forecaster.conditioned and ts.known.any():
            cond, known = ts.workload[series].astype(np.float32), ts.known[series].astype(np.float32)
        q = forecaster.predict_task(k, ts.spec, values, cov, cond, known)  # (N, H, Q) at the trained leads
        short = np.arange(1, first)
        y = ts.values[series[:, None], origin[:, None] + short]  # (N, L-1)
        last = last_observed(values)
        err = np.empty((len(rows), len(names), 1))
        for c, exponent in enumerate(SHORT_LEAD_EXPONENTS):
            quantiles = interpolate_leads(last, q, ts.spec.leads, short, exponent)
            e = y[..., None] - quantiles
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # windows whose targets are all gaps: NaN
                err[:, c, 0] = np.nanmean(pinball_terms(e, levels), axis=(1, 2))
        choice = _robust_choice(err, series, names, confidence, n_boot, rng, [names[0]])[0]
        out.append(float(choice))
    return out


def build_checkpoint(module, datamodule, select_point: bool = True, calibrate_quantiles: bool = True) -> dict:
    """The ``dprobe.pt`` dict (:func:`~dprobe.forecaster.checkpoint.checkpoint_dict`) of ``module`` fitted on
    ``datamodule``, calibrated on its validation windows: the point forecasts (``select_point``; else the
    model's p50), the quantiles' shifts (``calibrate_quantiles``; else none), then, with the forecaster as
    it will serve, how the quantiles widen below the first lead. Records the data module's split.

    Runs on the CPU, wherever training ran (the data module's batches are CPU tensors, and a checkpoint must
    load on a machine without a GPU): ``module`` is moved there.
    """
    module = module.cpu()
    outputs = validation_outputs(module, datamodule)  # one pass over the validation windows serves both
    sources = select_point_sources(module, datamodule, outputs=outputs) if select_point else None
    if sources:
        log.info("point forecast per task and lead (chosen on validation): %s",
                 {t.name: s for t, s in zip(datamodule.task_specs, sources, strict=True)})
    shifts = conformal_shifts(module, datamodule, sources, outputs=outputs) if calibrate_quantiles else None
    known = sum(int(t.known.sum()) for t in datamodule.tasks)
    if module.hparams.use_graph:
        log.info("workload conditioning: %d training series with a known workload%s", known,
                 "" if known else " (no workloads.csv: graphs given at inference will be ignored)")
    choices = dict(point_sources=sources, quantile_shifts=shifts, workloads_trained=known > 0,
                   workload_tasks=[bool(t.known.any()) for t in datamodule.tasks], split=datamodule.split)
    # how the quantiles widen below the first lead, chosen with the forecaster as it will serve
    serving = ModelForecaster(checkpoint_dict(module, datamodule.task_specs, **choices))
    exponents = select_short_lead_exponents(serving, datamodule)
    log.info("quantile spread below the first lead per task (1: linear, 0.5: square root): %s",
             {t.name: e for t, e in zip(datamodule.task_specs, exponents, strict=True)})
    return checkpoint_dict(module, datamodule.task_specs, short_lead_exponents=exponents, **choices)
