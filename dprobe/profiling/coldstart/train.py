"""Training the cold-start model on h200-profiles, and leave-model-family-out cross-validation."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch
from tqdm.auto import tqdm

from dprobe.core.conformal import conformal_shift, family_folds, held_out_groups
from dprobe.graph.encoder import graph_cache_path, graph_for_run, graph_to_data, run_spec
from dprobe.profiling.coldstart.features import (
    FEATURES,
    MEMORY_FEATURES,
    analytical_for,
    family_of,
    job_features,
    replay_cache_path,
    with_host_factor,
)
from dprobe.profiling.coldstart.gpus import GPUSpec, gpu_key, gpu_spec
from dprobe.profiling.coldstart.model import (
    TARGETS,
    ColdStartEnsemble,
    ColdStartModel,
    fit_standardisation,
    pinball,
)
from dprobe.profiling.coldstart.replay import ReplayEstimate

log = logging.getLogger(__name__)
VERSION = 4  # 4: the memory head sees the op-mix shares
CALIBRATION_FOLDS = 5  # groups of families the p90 shift is calibrated on (see fit)
DEFAULTS: dict[str, Any] = {"hidden": 64, "graph_dim": 0, "layers": 2, "dropout": 0.3, "lr": 3e-3,
                            "weight_decay": 1e-3, "target_weights": [1.0, 1.0, 1.0, 1.0], "ensemble": 10}


def baseline(est: ReplayEstimate, feats: list[float] | np.ndarray) -> np.ndarray:
    """Analytical predictions: peak, NVML, utilisation (GPU busy share of the roofline step), step time."""
    return np.array([est.peak_bytes, est.device_bytes, *roofline_targets(np.asarray(feats, dtype=np.float64))])


def roofline_targets(feats: np.ndarray) -> np.ndarray:
    """Utilisation (GPU busy share of the roofline step, within 5-95 %) and step time from feature rows."""
    log_roof = feats[..., FEATURES.index("log_t_roof")]
    busy = np.clip(np.exp(feats[..., FEATURES.index("log_t_gpu")] - log_roof), 0.05, 0.95)
    return np.stack([busy, np.exp(log_roof)], axis=-1)


HOST_BOUND_BUSY = 0.7  # a run whose GPU is idle more than 30 % of each step counts as host-bound
MIN_HOST_BOUND_RUNS = 3


def machines_of(ds: dict[str, Any]) -> list[str]:
    """The machine each run was measured on (one for all where the data set does not say)."""
    return list(ds.get("machines") or ["machine"] * len(ds["feats"]))


def host_factors(ds: dict[str, Any], idx: np.ndarray) -> dict[str, float]:
    """Per machine (a collection of runs measured on one host), the log of how slowly its host issues ops,
    from the runs ``idx`` only, centred on the mean over machines (0: the typical machine).

    A machine's figure is the median, over its host-bound runs (busy share below ``HOST_BOUND_BUSY``),
    of the measured step time against the analytical host time; one with fewer than
    ``MIN_HOST_BOUND_RUNS`` such runs counts as typical (0).
    """
    machines = np.asarray(machines_of(ds))[idx]
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    ok = ds["valid"][idx, ui] & ds["valid"][idx, si] & (ds["y_fit"][idx, ui] < HOST_BOUND_BUSY)
    ratio = np.log(np.where(ok, ds["y_fit"][idx, si], 1.0)) - ds["feats"][idx, FEATURES.index("log_t_host")]
    raw = {m: float(np.median(ratio[ok & (machines == m)])) for m in sorted(set(machines))
           if np.count_nonzero(ok & (machines == m)) >= MIN_HOST_BOUND_RUNS}
    centre = float(np.mean(list(raw.values()))) if raw else 0.0
    return {str(m): raw[m] - centre if m in raw else 0.0 for m in sorted(set(machines))}


def for_machines(ds: dict[str, Any], factors: dict[str, float]) -> dict[str, Any]:
    """``ds`` with every run's features and analytical step / utilisation taken on its machine's host
    factor (``factors``, log; a machine not in it counts as typical)."""
    feats = with_host_factor(ds["feats"], np.array([factors.get(m, 0.0) for m in machines_of(ds)]))
    base = ds["base"].copy()
    base[:, 2:] = roofline_targets(feats)
    return {**ds, "feats": feats, "base": base}


def to_residual(y: np.ndarray, base: np.ndarray) -> np.ndarray:
    r = np.log(y / base)
    u = np.clip(y[..., 2], 0.01, 0.99)
    r[..., 2] = np.log(u / (1 - u))
    return r


def from_residual(r: np.ndarray, base: np.ndarray) -> np.ndarray:
    y = base * np.exp(r)
    y[..., 2] = 1 / (1 + np.exp(-r[..., 2]))
    return y


def measured(y: np.ndarray) -> np.ndarray:
    """Which targets a run has: a finite, positive measurement."""
    return np.isfinite(y) & (y > 0)


def busy_utilisation(util: np.ndarray, step: np.ndarray, stall: np.ndarray) -> np.ndarray:
    """Utilisation while the job runs steps, from utilisation measured over steps and host stalls."""
    return np.clip(util * (step + stall) / step, 0.01, 0.99)


def with_stall(busy: np.ndarray, step: np.ndarray, stall: np.ndarray) -> np.ndarray:
    """Utilisation over steps and host stalls (``stall`` seconds per step, GPU idle) from the busy share."""
    return busy * step / (step + stall)


def apply_stall(p50: np.ndarray, p90: np.ndarray, stall: np.ndarray) -> None:
    """In place: turn predicted busy utilisation into utilisation with stalls (both with the p50 step)."""
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    step = p50[..., si].copy()
    p50[..., ui] = with_stall(p50[..., ui], step, stall)
    p90[..., ui] = with_stall(p90[..., ui], step, stall)


def _replay_run(row: Any, cache_dir: str | Path) -> tuple[dict[str, Any], GPUSpec, ReplayEstimate, Any]:
    """A runs.csv row's model spec, GPU spec, replay estimate and model graph (both cached)."""
    spec = run_spec(row)
    gpu = gpu_spec(str(row["gpu"]), float(row["gpu_total_bytes"]))
    est = analytical_for(spec["model"], spec["batch"], str(row["precision"]), str(row["optimizer"]),
                         image=spec["image"], seq=spec["seq"], config_kwargs=spec["config_kwargs"], cache_dir=cache_dir)
    return spec, gpu, est, graph_for_run(row, cache_dir)


def _is_cached(row: Any, cache_dir: str | Path) -> bool:
    """Whether the run's replay and graph are both in the cache (or cannot be made at all)."""
    try:
        spec = run_spec(row)
        replay = replay_cache_path(spec["model"], spec["batch"], str(row["precision"]), str(row["optimizer"]),
                                   spec["image"], spec["seq"], spec["config_kwargs"], cache_dir)
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
                 workers: int | None = 1) -> dict[str, Any]:
    """Graphs, features, analytical baselines and measured targets of every ok training run.

    ``y`` holds the measurements; ``y_fit`` the targets the model learns, where utilisation is the busy
    share without the run's host stalls (``stall``, seconds per step), which prediction puts back.
    Memory and utilisation as NVML shows them are taken while the measured steps ran (the loader's
    ``nvml_used_bytes_steps``, ``gpu_util_pct_steps``), not over setup work before them. ``valid``
    marks the targets a run has (a missing measurement is left out of the loss and the scores).
    ``progress``: a progress bar over the runs (replays are cached, so it is quick after the first time).
    ``workers``: processes for the replays not yet cached (1: none; None: one per core, at most four).
    A run that cannot be used (no spec for its GPU, a model this install cannot build or replay) is
    left out, logged, and listed in ``skipped``.
    """
    from dprobe.core.workers import resolve_workers
    from dprobe.data import load_h200_profiles

    runs = load_h200_profiles(data_dir).train_runs()
    t0 = time.time()
    warm_cache(runs, cache_dir, resolve_workers(workers), progress)
    graphs, feats, bases, ys, fams, ids, gpus, machines, skipped = [], [], [], [], [], [], [], [], []
    for _, row in tqdm(runs.iterrows(), total=len(runs), desc="replaying training steps", unit="run",
                       leave=False, disable=not progress):
        try:
            spec, gpu, est, graph = _replay_run(row, cache_dir)
        except Exception as exc:  # a GPU without a spec, a model this install cannot build or replay: left out
            reason = (str(exc).splitlines() or [""])[0][:200]
            skipped.append(f"run {row['run_id']} ({row['lib']}:{row['model']}, collection {int(row['collection'])}): "
                           f"{type(exc).__name__}: {reason}")
            log.warning("left out: %s", skipped[-1])
            continue
        graphs.append(graph_to_data(graph))
        gpus.append(gpu_key(str(row["gpu"])))
        machines.append(f"collection {int(row['collection'])}")  # one session on one machine
        f = job_features(est, spec["batch"], str(row["precision"]), str(row["optimizer"]), gpu,
                         cudnn_benchmark=bool(row["cudnn_benchmark"]))
        feats.append(f)
        bases.append(baseline(est, f))
        ys.append([row["peak_alloc_bytes"], row["nvml_used_bytes_steps"],
                   row["gpu_util_pct_steps"] / 100.0, row["step_time_median_s"]])
        fams.append(family_of(str(row["model"])))
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
    ds["skipped"] = skipped
    return ds


def make_dataset(graphs: list, feats: np.ndarray, base: np.ndarray, y: np.ndarray, families: list[str],
                 run_ids: list[str], models: list[str] | None = None, batch: np.ndarray | None = None,
                 stall: np.ndarray | None = None, valid: np.ndarray | None = None,
                 gpus: list[str] | None = None, machines: list[str] | None = None) -> dict[str, Any]:
    """The training set as the functions here take it (see :func:`load_dataset`); no stalls, every
    target with a positive measurement valid and every run on an H200, all on one machine, unless given."""
    n = len(run_ids)
    y = np.asarray(y, dtype=np.float64)
    stall = np.zeros(n) if stall is None else np.asarray(stall, dtype=np.float64)
    y_fit = y.copy()
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    y_fit[:, ui] = busy_utilisation(y[:, ui], y[:, si], stall)
    return {"graphs": graphs, "feats": np.asarray(feats, dtype=np.float64), "base": np.asarray(base),
            "y": y, "y_fit": y_fit, "valid": measured(y) if valid is None else valid,
            "stall": stall, "families": list(families), "run_ids": list(run_ids),
            "models": list(models) if models is not None else ["?"] * n,
            "batch": np.ones(n) if batch is None else batch, "gpus": list(gpus) if gpus else ["h200"] * n,
            "machines": list(machines) if machines else ["machine"] * n}


def target_groups(features: list[str]) -> list[tuple[list[int], list[int]]]:
    """Memory targets see the memory features only; utilisation and step time see all of them."""
    memory = [i for i, name in enumerate(features) if name in MEMORY_FEATURES]
    return [([0, 1], memory), ([2, 3], list(range(len(features))))]


def _member(hp: dict[str, Any], n_features: int) -> ColdStartModel:
    return ColdStartModel(n_features, hidden=hp["hidden"], graph_dim=hp["graph_dim"], layers=hp["layers"],
                          dropout=hp["dropout"], groups=target_groups(FEATURES))


def _new_member(hp: dict[str, Any], x: torch.Tensor, seed: int) -> ColdStartModel:
    """An untrained member, initialised from ``seed``, standardising features as its training rows ``x`` do."""
    torch.manual_seed(seed)
    member = _member(hp, x.shape[1])
    mu, sd = fit_standardisation(x)
    member.mu.copy_(mu)
    member.sd.copy_(sd)
    return member


def fit(ds: dict[str, Any], idx: np.ndarray, max_epochs: int, seed: int, hp: dict[str, Any],
        calibrate: bool = True) -> ColdStartEnsemble:
    """``hp["ensemble"]`` members on the runs ``idx`` (seeds ``seed``, ``seed + 1``, ...), p90 calibrated
    unless ``calibrate`` is False (the p50 does not depend on it).

    The p90 shift per target is the one that makes the p90 residual cover 90 % of the families held out
    *within* ``idx``: the runs' families are dealt into ``CALIBRATION_FOLDS`` groups, and one member is
    fitted without each group and scored on it (split-conformal over families, so a shift learnt here
    carries to a new family). The ensemble, and then those members, are fitted together
    (:func:`fit_members`; apart, so that the ensemble's dropout draws do not depend on ``calibrate``).
    """
    model = ColdStartEnsemble(fit_members(ds, [idx] * hp["ensemble"], max_epochs,
                                          [seed + k for k in range(hp["ensemble"])], hp))
    fold = family_folds([ds["families"][i] for i in idx], CALIBRATION_FOLDS, seed) if calibrate else None
    if fold is not None:
        held_out = fit_members(ds, [idx[fold != g] for g in range(CALIBRATION_FOLDS)], max_epochs,
                               [seed] * CALIBRATION_FOLDS, hp)
        scores = []
        for g, member in enumerate(held_out):
            held = idx[fold == g]
            with torch.no_grad():
                graphs = Batch.from_data_list([ds["graphs"][i] for i in held]) if hp["graph_dim"] > 0 else None
                p90 = member(graphs, torch.tensor(ds["feats"][held], dtype=torch.float32))[..., 1].numpy()
            score = to_residual(ds["y_fit"][held], ds["base"][held]) - p90
            scores.append(np.where(ds["valid"][held], score, np.nan))
        s = np.concatenate(scores)
        shift = [conformal_shift(s[:, t], 0.9) for t in range(s.shape[1])]
        model.p90_shift.copy_(torch.as_tensor(shift, dtype=torch.float32))
    return model


def fit_members(ds: dict[str, Any], subsets: list[np.ndarray], max_epochs: int, seeds: list[int],
                hp: dict[str, Any]) -> list[ColdStartModel]:
    """Member k fitted on the runs ``subsets[k]`` from the seed ``seeds[k]``: all of them at once.

    Their weights are stacked and trained as one (``torch.func.vmap`` over the member), each member's
    loss moving only its own weights, with one AdamW over the stack, which is the same optimiser
    per weight as one for each member. A few times as quick as one member after another on a CPU (the
    networks are small; the time goes to issuing their ops); the dropout masks are the only draws
    that differ from fitting them one by one. Members with a graph encoder are fitted one by one.
    """
    if hp["graph_dim"] > 0:
        return [_fit_member(ds, rows, max_epochs, seed, hp) for rows, seed in zip(subsets, seeds, strict=True)]
    from torch.func import functional_call, stack_module_state, vmap

    n = len(ds["run_ids"])
    x = torch.tensor(ds["feats"], dtype=torch.float32)  # [n, F]: every run; each member weighs its own
    r = torch.tensor(np.where(ds["valid"], to_residual(ds["y_fit"], ds["base"]), 0.0), dtype=torch.float32)
    valid = torch.tensor(hp["target_weights"], dtype=torch.float32) * torch.tensor(ds["valid"], dtype=torch.float32)
    members, weights = [], []
    for rows, seed in zip(subsets, seeds, strict=True):
        members.append(_new_member(hp, x[rows], seed).train())
        share = torch.zeros(n)
        share[rows] = n / len(rows)  # the mean over all runs is then the mean over the member's runs
        weights.append(valid * share[:, None])
    params, buffers = stack_module_state(members)  # name -> [M, ...]
    shape = members[0]

    def loss(p: dict, b: dict, w: torch.Tensor) -> torch.Tensor:
        return pinball(functional_call(shape, (p, b), (None, x)), r, w)

    losses = vmap(loss, randomness="different")
    w = torch.stack(weights)  # [M, n, 4]
    opt = torch.optim.AdamW(list(params.values()), lr=hp["lr"], weight_decay=hp["weight_decay"])
    for _ in range(max_epochs):
        opt.zero_grad()
        losses(params, buffers, w).sum().backward()
        opt.step()
    for k, member in enumerate(members):
        member.load_state_dict({name: v[k].detach() for name, v in {**params, **buffers}.items()})
    return [member.eval() for member in members]


def _fit_member(ds: dict[str, Any], idx: np.ndarray, max_epochs: int, seed: int, hp: dict[str, Any]
                ) -> ColdStartModel:
    """One member fitted alone on the runs ``idx`` (members with a graph encoder; see :func:`fit_members`)."""
    x = torch.tensor(ds["feats"][idx], dtype=torch.float32)
    r = torch.tensor(np.where(ds["valid"][idx], to_residual(ds["y_fit"][idx], ds["base"][idx]), 0.0),
                     dtype=torch.float32)
    batch = Batch.from_data_list([ds["graphs"][i] for i in idx]) if hp["graph_dim"] > 0 else None
    model = _new_member(hp, x, seed)
    w = torch.tensor(hp["target_weights"], dtype=torch.float32) * torch.tensor(ds["valid"][idx], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    model.train()
    for _ in range(max_epochs):
        opt.zero_grad()
        loss = pinball(model(batch, x), r, w)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def predict_residuals(model: ColdStartModel | ColdStartEnsemble, graphs: list, feats: np.ndarray) -> np.ndarray:
    graph_batch = Batch.from_data_list(graphs) if model.encoder is not None else None
    out = model(graph_batch, torch.tensor(feats, dtype=torch.float32))
    return out.numpy().astype(np.float64)


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
                calibrate: bool, ds: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One leave-family-out fold: fitted on ``train``, the p50 / p90 of the runs ``test`` (told their
    machine's host factor from the training runs on it) and their p50 at the typical host factor.

    In a worker process ``ds`` comes with each fold (about 7 MB pickled for h200-profiles, a tenth of a
    second against several seconds of fitting): handed over once at the worker's start instead, it
    would go through the pipe that starts the process, and a worker that died before reading it (e.g.
    a script without ``if __name__ == "__main__"``) would leave the parent blocked on that pipe."""
    # each machine's host factor from the other families' runs on it, as a user would have it
    # from jobs that ran on that machine before
    fold = for_machines(ds, host_factors(ds, train))
    model = fit(fold, train, max_epochs, seed, hp, calibrate=calibrate)
    graphs = [ds["graphs"][i] for i in test]
    res = predict_residuals(model, graphs, fold["feats"][test])
    typical = predict_residuals(model, graphs, ds["feats"][test])[..., 0]
    return (from_residual(res[..., 0], fold["base"][test]), from_residual(res[..., 1], fold["base"][test]),
            from_residual(typical, ds["base"][test]))


def cross_validate(data_dir: str, cache_dir: str | Path, max_epochs: int = 400, seed: int = 0,
                   ds: dict[str, Any] | None = None, progress: bool = True, train_families: int | None = None,
                   calibrate: bool = True, folds: int | None = None, workers: int | None = 1,
                   **hparams: Any) -> dict[str, Any]:
    """Leave-model-family-out: each family is scored by a model trained on the other families only
    (``progress``: a bar over the folds). ``folds``: deal the families at random (seeded by ``seed``)
    into that many groups and leave out one group at a time instead, which is quicker with many families
    and still never scores a family that was in training. ``train_families``: train on that many of the
    other families, drawn at random, to see how the errors fall with more families. ``calibrate=False``
    skips the p90 calibration (its p90 coverage is then not meaningful; the p50 is the same, and quicker).
    ``workers``: folds fitted in that many processes at once (1: none; None: one per core, at most four;
    the scores do not depend on it)."""
    from dprobe.core.workers import map_folds, resolve_workers

    hp = {**DEFAULTS, **hparams}
    ds = ds or load_dataset(data_dir, cache_dir, workers=workers)
    fams = np.array(ds["families"])
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
        plans.append((test, np.where(np.isin(fams, others))[0]))
    score = partial(_score_fold, max_epochs=max_epochs, seed=seed, hp=hp, calibrate=calibrate, ds=ds)
    scored = map_folds(score, plans, resolve_workers(workers), "cold start, leave-family-out", progress)
    for (test, _), (fold_p50, fold_p90, fold_typical) in zip(plans, scored, strict=True):
        p50[test], p90[test], p50_typical[test] = fold_p50, fold_p90, fold_typical
    apply_stall(p50, p90, ds["stall"])
    apply_stall(p50_typical, p50_typical.copy(), ds["stall"])
    analytical = ds["base"].copy()
    apply_stall(analytical, analytical.copy(), ds["stall"])
    return {"learned": metrics(ds["y"], p50, p90, ds["valid"]),
            "typical_machine": metrics(ds["y"], p50_typical, valid=ds["valid"]),
            "analytical": metrics(ds["y"], analytical, valid=ds["valid"]),
            "families": len(set(fams)), "folds": len(groups), "runs": n, "p50": p50, "p90": p90, "dataset": ds,
            "host_factors": host_factors(ds, np.arange(n))}


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
    from dprobe.profiling.coldstart.report import format_scores, plot_cross_validation

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(hparams.pop("cache_dir", out / "cache"))
    hp = {**DEFAULTS, **hparams}
    ds = load_dataset(data_dir, cache, progress=progress, workers=workers)
    cv = cross_validate(data_dir, cache, max_epochs=max_epochs, seed=seed, ds=ds, progress=progress, folds=folds,
                        workers=workers, **hp)
    factors = cv["host_factors"]  # learnt from every run
    model = fit(for_machines(ds, factors), np.arange(len(ds["run_ids"])), max_epochs, seed, hp)
    ckpt = {"version": VERSION, "kind": "dprobe-coldstart", "features": FEATURES, "targets": TARGETS,
            "gpus": sorted(set(ds["gpus"])),  # the GPUs the model learnt from
            # the machines it learnt from: how slowly each one's host issued ops (1: typical)
            "host_factors": {m: round(math.exp(v), 4) for m, v in factors.items()},
            "hparams": {k: v for k, v in hp.items()}, "n_features": len(FEATURES),
            "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "metrics": {"learned": cv["learned"], "typical_machine": cv["typical_machine"],
                        "analytical": cv["analytical"]}}
    path = out / "coldstart.pt"
    torch.save(ckpt, path)
    plot = plot_cross_validation(cv, out / "lofo.png")
    grouped = f" in {cv['folds']} folds" if cv["folds"] < cv["families"] else ""
    table = (f"cold start, leave-model-family-out on {data_dir}: {cv['runs']} runs, {cv['families']} families"
             f"{grouped}\n"
             + format_scores(cv["learned"], cv["analytical"], cv["typical_machine"])[0]
             + "\n" + host_factor_note(cv)
             + "".join(f"\nleft out: {r}" for r in ds.get("skipped", [])))
    (out / "report.txt").write_text(table + "\n")
    return {"checkpoint": str(path), "metrics": ckpt["metrics"], "table": table, "plot": str(plot),
            "cv_util": utilisation_by_run(cv)}


def utilisation_by_run(cv: dict[str, Any]) -> dict[str, float]:
    """The leave-family-out utilisation prediction of each run of a :func:`cross_validate` result, by run id."""
    util = cv["p50"][:, TARGETS.index("gpu_utilization")]
    return {rid: float(u) for rid, u in zip(cv["dataset"]["run_ids"], util, strict=True)}


def host_factor_note(cv: dict[str, Any]) -> str:
    """A line on the machines' host factors, and what "learned" and "host unknown" mean."""
    factors = ", ".join(f"{m} {math.exp(v):.2f}" for m, v in cv["host_factors"].items())
    return ("learned: each run told its machine's host factor, from the other families' runs on it; "
            f"host unknown: the same models at the typical factor (1). Host factors: {factors}")


def load_checkpoint(path: str | Path) -> tuple[ColdStartEnsemble, dict[str, Any]]:
    from dprobe.forecaster.loading import load_torch_dict

    ckpt = load_torch_dict(path)
    if ckpt.get("kind") != "dprobe-coldstart":
        raise ValueError(f"{path}: not a dprobe cold-start checkpoint")
    if ckpt.get("version") != VERSION or ckpt.get("features") != FEATURES:
        raise ValueError(f"{path}: cold-start checkpoint version {ckpt.get('version')} (this dprobe reads "
                         f"version {VERSION}) or its features differ; retrain it with `python train.py +exp=coldstart`")
    hp = ckpt["hparams"]
    model = ColdStartEnsemble([_member(hp, ckpt["n_features"]) for _ in range(hp["ensemble"])])
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt
