"""Fitting the cold-start ensemble on runs of a :class:`~dprobe.profiling.coldstart.dataset.ProfileDataset`:
the machines' host factors, the members (fitted together), and the p90 calibrated on held-out families."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch

from dprobe.core.conformal import conformal_shift, family_folds
from dprobe.profiling.coldstart.dataset import ProfileDataset
from dprobe.profiling.coldstart.features import FEATURES, with_host_factor
from dprobe.profiling.coldstart.model import (
    TARGETS,
    ColdStartEnsemble,
    ColdStartModel,
    build_member,
    fit_standardisation,
    pinball,
)
from dprobe.profiling.coldstart.residual import roofline_targets, to_residual

CALIBRATION_FOLDS = 5  # groups of families the p90 shift is calibrated on (see fit)
DEFAULTS: dict[str, Any] = {"hidden": 64, "graph_dim": 0, "layers": 2, "dropout": 0.3, "lr": 3e-3,
                            "weight_decay": 1e-3, "target_weights": [1.0, 1.0, 1.0, 1.0], "ensemble": 10}
HOST_BOUND_BUSY = 0.7  # a run whose GPU is idle more than 30 % of each step counts as host-bound
MIN_HOST_BOUND_RUNS = 3


def host_factors(ds: ProfileDataset, idx: np.ndarray) -> dict[str, float]:
    """Per machine (a collection of runs measured on one host), the log of how slowly its host issues ops,
    from the runs ``idx`` only, centred on the mean over machines (0: the typical machine).

    A machine's figure is the median, over its host-bound runs (busy share below ``HOST_BOUND_BUSY``),
    of the measured step time against the analytical host time; one with fewer than
    ``MIN_HOST_BOUND_RUNS`` such runs counts as typical (0).
    """
    machines = np.asarray(ds.machines)[idx]
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    ok = ds.valid[idx, ui] & ds.valid[idx, si] & (ds.y_fit[idx, ui] < HOST_BOUND_BUSY)
    ratio = np.log(np.where(ok, ds.y_fit[idx, si], 1.0)) - ds.feats[idx, FEATURES.index("log_t_host")]
    raw = {m: float(np.median(ratio[ok & (machines == m)])) for m in sorted(set(machines))
           if np.count_nonzero(ok & (machines == m)) >= MIN_HOST_BOUND_RUNS}
    centre = float(np.mean(list(raw.values()))) if raw else 0.0
    return {str(m): raw[m] - centre if m in raw else 0.0 for m in sorted(set(machines))}


def for_machines(ds: ProfileDataset, factors: dict[str, float]) -> ProfileDataset:
    """``ds`` with every run's features and analytical step / utilisation taken on its machine's host
    factor (``factors``, log; a machine not in it counts as typical)."""
    feats = with_host_factor(ds.feats, np.array([factors.get(m, 0.0) for m in ds.machines]))
    base = ds.base.copy()
    base[:, 2:] = roofline_targets(feats)
    return replace(ds, feats=feats, base=base)


def _new_member(hp: dict[str, Any], x: torch.Tensor, seed: int) -> ColdStartModel:
    """An untrained member, initialised from ``seed``, standardising features as its training rows ``x`` do."""
    torch.manual_seed(seed)
    member = build_member(hp, x.shape[1])
    mu, sd = fit_standardisation(x)
    member.mu.copy_(mu)
    member.sd.copy_(sd)
    return member


def fit(ds: ProfileDataset, idx: np.ndarray, max_epochs: int, seed: int, hp: dict[str, Any],
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
    fold = family_folds([ds.families[i] for i in idx], CALIBRATION_FOLDS, seed) if calibrate else None
    if fold is not None:
        held_out = fit_members(ds, [idx[fold != g] for g in range(CALIBRATION_FOLDS)], max_epochs,
                               [seed] * CALIBRATION_FOLDS, hp)
        scores = []
        for g, member in enumerate(held_out):
            held = idx[fold == g]
            with torch.no_grad():
                graphs = Batch.from_data_list([ds.graphs[i] for i in held]) if hp["graph_dim"] > 0 else None
                p90 = member(graphs, torch.tensor(ds.feats[held], dtype=torch.float32))[..., 1].numpy()
            score = to_residual(ds.y_fit[held], ds.base[held]) - p90
            scores.append(np.where(ds.valid[held], score, np.nan))
        s = np.concatenate(scores)
        shift = [conformal_shift(s[:, t], 0.9) for t in range(s.shape[1])]
        model.p90_shift.copy_(torch.as_tensor(shift, dtype=torch.float32))
    return model


def fit_members(ds: ProfileDataset, subsets: list[np.ndarray], max_epochs: int, seeds: list[int],
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

    n = len(ds.run_ids)
    x = torch.tensor(ds.feats, dtype=torch.float32)  # [n, F]: every run; each member weighs its own
    r = torch.tensor(np.where(ds.valid, to_residual(ds.y_fit, ds.base), 0.0), dtype=torch.float32)
    valid = torch.tensor(hp["target_weights"], dtype=torch.float32) * torch.tensor(ds.valid, dtype=torch.float32)
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


def _fit_member(ds: ProfileDataset, idx: np.ndarray, max_epochs: int, seed: int, hp: dict[str, Any]
                ) -> ColdStartModel:
    """One member fitted alone on the runs ``idx`` (members with a graph encoder; see :func:`fit_members`)."""
    x = torch.tensor(ds.feats[idx], dtype=torch.float32)
    r = torch.tensor(np.where(ds.valid[idx], to_residual(ds.y_fit[idx], ds.base[idx]), 0.0),
                     dtype=torch.float32)
    batch = Batch.from_data_list([ds.graphs[i] for i in idx]) if hp["graph_dim"] > 0 else None
    model = _new_member(hp, x, seed)
    w = torch.tensor(hp["target_weights"], dtype=torch.float32) * torch.tensor(ds.valid[idx], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    model.train()
    for _ in range(max_epochs):
        opt.zero_grad()
        loss = pinball(model(batch, x), r, w)
        loss.backward()
        opt.step()
    return model.eval()


def unseen_gpu_shift(ds: ProfileDataset, max_epochs: int, seed: int, hp: dict[str, Any]) -> dict[str, float]:
    """How much wider (added to the p90 residual, per target) a prediction's p90 must be on a GPU no
    training run was on: each GPU of ``ds`` held out in turn, the model fitted (and calibrated) on the
    others' runs, the shift that makes its p90 cover 90 % of the held-out GPU's runs; the largest over
    GPUs, never below 0. A target gets none unless a held-out GPU and the others both measured it
    (``{}`` with fewer than two GPUs)."""
    gpus = sorted(set(ds.gpus))
    if len(gpus) < 2:
        return {}
    shifts: dict[str, float] = {}
    for gpu in gpus:
        held = np.flatnonzero(np.asarray(ds.gpus) == gpu)
        train = np.flatnonzero(np.asarray(ds.gpus) != gpu)
        model = fit(ds, train, max_epochs, seed, hp)
        with torch.no_grad():
            p90 = model(None, torch.tensor(ds.feats[held], dtype=torch.float32))[..., 1].numpy()
        score = np.where(ds.valid[held], to_residual(ds.y_fit[held], ds.base[held]) - p90, np.nan)
        for t, name in enumerate(TARGETS):  # where both the held-out GPU and the others measured it
            if np.isfinite(score[:, t]).sum() >= 10 and ds.valid[train, t].sum() >= 10:
                shifts[name] = max(shifts.get(name, 0.0), float(conformal_shift(score[:, t], 0.9)), 0.0)
    return shifts
