"""Fit and cross-validate the per-job co-location model on datasets/gavel-colocation.

Every prediction, fitted or a rule, goes through :func:`dprobe.sharing.interference.predict_colocation`,
as ``dprobe predict --colocate`` calls it, with the job types' cold-start profiles shipped in
``gavel_profiles.json`` (tools/gavel_models.py). Cross-validation holds model types out: a fold fits on the
pairs that do not involve the type and predicts every pair that does (as either job); each held-out job is
scored by the per-job model, the time-share rule ``min(1, 1 / (u_1 + u_2))``, the older symmetric
contention model and the training folds' mean speed. Whether a pair fits in memory is scored on every pair,
run or not (a throughput of 0: did not fit, or was not run).

    python -m dprobe.sharing.interference_fit [--write] [--json]

``--write`` fits on every measured pair and writes ``interference_fitted.json`` (the trees, the figures,
and the choice of default: the per-job model where it beat the time-share rule). Needs LightGBM
(``pip install -e '.[bench]'``); predicting with the written file needs numpy only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dprobe.sharing.gavel import job_profile, leave_model_type_out, load_pairs, load_profiles, unordered_pairs
from dprobe.sharing.interference import (
    FEATURES,
    FITTED_PATH,
    GPU,
    FittedColocation,
    Trees,
    pair_features,
    predict_colocation,
)

# LightGBM's settings: small trees, shrinkage, row and feature subsampling (one thread: deterministic)
PARAMS = {"objective": "l2", "learning_rate": 0.05, "num_leaves": 8, "min_data_in_leaf": 20, "lambda_l2": 1.0,
          "bagging_fraction": 0.8, "bagging_freq": 1, "feature_fraction": 0.8, "num_threads": 1, "seed": 0,
          "deterministic": True, "verbose": -1}
ROUNDS = 200
RULES = ("per-job", "time-share", "contention", "constant")


@dataclass
class GavelJobs:
    """Gavel's pairs (:func:`~dprobe.sharing.gavel.load_pairs`) with the profiles and GPUs to predict them."""

    pairs: pd.DataFrame
    profiles: dict[str, Any]
    measured_alone: bool = False  # True: each job's step time is its measured one alone (1 / throughput)

    def gpu(self, key: str) -> GPU:
        g = self.profiles["gpus"][key]
        return GPU(float(g["memory_bytes"]), float(g["fp32_flops"]), float(g["bandwidth"]), str(g["name"]))

    def profile(self, job: str, gpu: str, alone: float | None = None) -> dict[str, Any]:
        """The job type's profile on the GPU; with ``measured_alone``, its step time the measured one."""
        prof = job_profile(job, gpu, self.profiles)
        if self.measured_alone and alone and alone > 0:
            prof = {**prof, "step_time_seconds": {"p50": 1.0 / float(alone), "p90": 1.0 / float(alone)}}
        return prof

    def pair(self, row: Any) -> tuple[dict[str, Any], dict[str, Any], GPU]:
        """Job A's and job B's profiles and the GPU of one row of ``pairs``."""
        return (self.profile(row.a, row.gpu, row.alone_a), self.profile(row.b, row.gpu, row.alone_b),
                self.gpu(row.gpu))


def gavel_jobs(data: str | Path | None = None, profiles: str | Path | None = None,
               measured_alone: bool = False) -> GavelJobs:
    """The bundled (or ``data``'s) pairs with the shipped (or ``profiles``') job profiles."""
    return GavelJobs(load_pairs(data), load_profiles(profiles), measured_alone)


def design(jobs: GavelJobs, rows: pd.DataFrame) -> np.ndarray:
    """The per-job model's inputs for each row (job A beside job B)."""
    return np.array([pair_features(*jobs.pair(r)) for r in rows.itertuples()]) if len(rows) else np.zeros(
        (0, len(FEATURES)))


def fit_trees(x: np.ndarray, y: np.ndarray, params: dict[str, Any] | None = None, rounds: int = ROUNDS) -> Trees:
    """Boosted trees of speed on the inputs (LightGBM), as :class:`Trees` arrays."""
    import lightgbm as lgb

    booster = lgb.train({**PARAMS, **(params or {})}, lgb.Dataset(x, y, free_raw_data=False), rounds)
    return trees_from_lightgbm(booster.dump_model())


def _flatten(root: dict[str, Any]) -> list[tuple[int, float, int, int, float, bool]]:
    """One LightGBM tree (``tree_structure``) as rows: feature (-1: leaf), threshold, left, right, value,
    whether a NaN goes left; the root first."""
    nodes: list[tuple[int, float, int, int, float, bool]] = []

    def walk(node: dict[str, Any]) -> int:
        i = len(nodes)
        nodes.append((-1, 0.0, 0, 0, float(node.get("leaf_value", 0.0)), True))
        if "split_feature" in node:
            if node.get("decision_type", "<=") != "<=":
                raise ValueError(f"unsupported split {node.get('decision_type')!r}")
            left, right = walk(node["left_child"]), walk(node["right_child"])
            if node.get("missing_type") == "NaN":
                nan_left = bool(node.get("default_left", True))
            else:  # LightGBM reads a NaN as 0 where training saw none
                nan_left = float(node["threshold"]) >= 0.0
            nodes[i] = (int(node["split_feature"]), float(node["threshold"]), left, right, 0.0, nan_left)
        return i

    walk(root)
    return nodes


def trees_from_lightgbm(dump: dict[str, Any]) -> Trees:
    """LightGBM's ``dump_model()`` as :class:`Trees` (numerical splits ``<=`` only), trees padded with leaves."""
    flat = [_flatten(info["tree_structure"]) for info in dump["tree_info"]]
    width = max(len(n) for n in flat)
    pad = [n + [(-1, 0.0, 0, 0, 0.0, True)] * (width - len(n)) for n in flat]
    field = [[[node[k] for node in tree] for tree in pad] for k in range(6)]
    return Trees(np.array(field[0], dtype=np.int64), np.array(field[1], dtype=np.float64),
                 np.array(field[2], dtype=np.int64), np.array(field[3], dtype=np.int64),
                 np.array(field[4], dtype=np.float64), np.array(field[5], dtype=bool))


def fit(jobs: GavelJobs, rows: pd.DataFrame | None = None) -> Trees:
    """The per-job model fitted on the measured ``rows`` (default: every measured pair)."""
    rows = jobs.pairs[jobs.pairs["measured"]] if rows is None else rows
    return fit_trees(design(jobs, rows), rows["speed"].to_numpy())


def _predictors(jobs: GavelJobs, trees: Trees, mean: float) -> dict[str, Callable[[Any], float]]:
    """Job A's speed beside job B by each rule, through :func:`predict_colocation`."""
    fitted = FittedColocation(trees, per_job_default=True, unseen_gpus=True)

    def by(method: str) -> Callable[[Any], float]:
        return lambda r: predict_colocation(*jobs.pair(r), method=method, fitted=fitted)["speeds"][0]

    return {"per-job": by("per-job"), "time-share": by("time-share"), "contention": by("contention"),
            "constant": lambda r: mean}


def cross_validate(jobs: GavelJobs, folds: list[tuple[str, np.ndarray, np.ndarray]] | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Speed MAE of each rule per fold and over all held-out jobs (model types held out unless ``folds``
    says otherwise: (name, training rows, held-out rows) of the measured pairs), and each held-out row's
    predictions (``rows``)."""
    measured = jobs.pairs[jobs.pairs["measured"]].reset_index(drop=True)
    folds = leave_model_type_out(measured) if folds is None else folds
    per_fold, scored = [], []
    for name, train, held in folds:
        trees = fit(jobs, measured.iloc[train])
        predict = _predictors(jobs, trees, float(measured["speed"].iloc[train].mean()))
        part = measured.iloc[held]
        got = {rule: np.array([predict[rule](r) for r in part.itertuples()]) for rule in RULES}
        truth = part["speed"].to_numpy()
        per_fold.append({"fold": name, "jobs": len(part),
                         "mae": {rule: float(np.mean(np.abs(got[rule] - truth))) for rule in RULES}})
        scored.append(part.assign(fold=name, **{f"pred_{k.replace('-', '_')}": v for k, v in got.items()}))
        if progress:
            progress(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in per_fold[-1]["mae"].items()))
    rows = pd.concat(scored, ignore_index=True)
    overall = {rule: float(np.mean(np.abs(rows[f"pred_{rule.replace('-', '_')}"] - rows["speed"]))) for rule in RULES}
    spread = {rule: {"min": min(f["mae"][rule] for f in per_fold), "max": max(f["mae"][rule] for f in per_fold),
                     "std": float(np.std([f["mae"][rule] for f in per_fold]))} for rule in RULES}
    return {"folds": per_fold, "overall": overall, "spread": spread, "held_out_jobs": len(rows), "rows": rows}


def leave_gpu_out(pairs: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Folds that hold out one GPU each."""
    gpus = pairs["gpu"].to_numpy()
    return [(g, np.flatnonzero(gpus != g), np.flatnonzero(gpus == g)) for g in sorted(set(gpus))]


def fit_accuracy(jobs: GavelJobs) -> dict[str, Any]:
    """How often :func:`predict_colocation`'s memory verdict is right on each pair (once per pair, both
    orders alike): "no" for a pair that was not run together, "yes" or "maybe" for one that was; per
    model type (every pair that involves it) and over all, beside "always fits"."""
    pairs = unordered_pairs(jobs.pairs)
    said = np.array([predict_colocation(*jobs.pair(r), method="time-share")["fits"] != "no"
                     for r in pairs.itertuples()])
    ran = pairs["measured"].to_numpy()
    right = said == ran
    per_type = {name: float(right[held].mean()) for name, _, held in leave_model_type_out(pairs)}
    return {"pairs": len(pairs), "ran": int(ran.sum()), "accuracy": float(right.mean()),
            "always_fits": float(ran.mean()), "per_type": per_type,
            "missed": {"fit_said_no": int((~said & ran).sum()), "no_fit_said_fits": int((said & ~ran).sum())}}


def summary_of(cv: dict[str, Any]) -> dict[str, Any]:
    """A cross-validation result without its rows (what the fitted file keeps)."""
    return {k: v for k, v in cv.items() if k != "rows"}


def write_fitted(jobs: GavelJobs, path: str | Path = FITTED_PATH,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Cross-validate (model types held out, then GPUs held out), fit on every measured pair and write the
    model with its figures and the default it earns."""
    by_type = cross_validate(jobs, progress=progress)
    measured = jobs.pairs[jobs.pairs["measured"]].reset_index(drop=True)
    by_gpu = cross_validate(jobs, leave_gpu_out(measured), progress=progress)
    memory = fit_accuracy(jobs)
    beats = by_type["overall"]["per-job"] < by_type["overall"]["time-share"]
    beats_gpu = all(f["mae"]["per-job"] < f["mae"]["time-share"] for f in by_gpu["folds"])
    doc = {"format": "dprobe-colocation/1", "features": list(FEATURES), "params": PARAMS, "rounds": ROUNDS,
           "data": "datasets/gavel-colocation", "measured_jobs": len(measured),
           "gpus": sorted({jobs.gpu(g).name for g in measured["gpu"]}),
           "per_job_default": bool(beats), "unseen_gpus": bool(beats and beats_gpu),
           "summary": {"leave_model_type_out": summary_of(by_type), "leave_gpu_out": summary_of(by_gpu),
                       "memory_fit": memory},
           "trees": fit(jobs).to_dict()}
    Path(path).write_text(json.dumps(doc) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {FITTED_PATH.name}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    jobs = gavel_jobs()
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    if args.write:
        doc = write_fitted(jobs, progress=say)
        out = doc["summary"]
        say(f"wrote {FITTED_PATH}: per-job default {doc['per_job_default']}, on unseen GPUs {doc['unseen_gpus']}")
    else:
        out = {"leave_model_type_out": summary_of(cross_validate(jobs, progress=say)),
               "memory_fit": fit_accuracy(jobs)}
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def job_effects_mae(pairs: pd.DataFrame) -> float:
    """A reference, not a prediction: the speed MAE of the best additive fit, per GPU, of one effect of each
    job type beside anything plus one of each job type it is beside, fitted on every measured pair and
    scored on the same pairs. What pair-to-pair noise leaves to any model built from the two job types."""
    errors = []
    for _, part in pairs[pairs["measured"]].groupby("gpu"):
        design_a = pd.get_dummies(part["a"]).to_numpy(float)
        design_b = pd.get_dummies(part["b"]).to_numpy(float)
        x = np.hstack([design_a, design_b])
        y = part["speed"].to_numpy()
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        errors.append(np.abs(x @ coef - y))
    return float(np.concatenate(errors).mean())


def symmetric_floor(pairs: pd.DataFrame) -> dict[str, float]:
    """What no model that gives both jobs of a pair one speed can beat: each pair's two measured speeds
    replaced by their mean (the best single value for both), its MAE; and the mean gap between the two."""
    m = pairs[pairs["measured"]]
    both = m.merge(m, left_on=["gpu", "a", "b"], right_on=["gpu", "b", "a"], suffixes=("", "_other"))
    gap = np.abs(both["speed"] - both["speed_other"]).to_numpy()
    return {"mae": float(np.mean(gap / 2)), "mean_gap": float(np.mean(gap))}
