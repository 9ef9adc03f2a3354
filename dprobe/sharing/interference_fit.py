"""Fit and validate the per-job co-location model on datasets/gavel-colocation, leaving whole sources out.

Every prediction, fitted or a rule, goes through :func:`dprobe.sharing.interference.predict_colocation`,
as ``dprobe predict --colocate`` calls it, with the job types' cold-start profiles shipped in
``gavel_profiles.json`` (tools/gavel_models.py). The model learns the share of the time-share rule's speed
a job keeps (a bounded residual on the rule, monotone in the partner's load). Validation leaves out, in
turn:

- each GPU architecture (Gavel's K80, P100, V100: Kepler, Pascal, Volta),
- each job class (vision, language, recommendation, reinforcement learning, generative),
- each model type (the older, finer folds),
- and the lab: the co-located pair measured on an H200 (datasets/h200-profiles, another lab, another
  architecture), predicted from its two jobs' ``dprobe predict`` profiles.

Each held-out job is scored by the per-job model, the time-share rule ``min(1, 1 / (u_1 + u_2))``, the
older symmetric contention model, no slowdown at all and the training folds' mean speed. The per-job model
becomes ``auto``'s choice inside its support only if it beat the rule on every architecture and job class
left out; the speed interval (p10) of each method is calibrated on left-out-source residuals. Whether a
pair fits in memory is scored on every Gavel pair, run or not (a throughput of 0: did not fit, or was not
run).

    python -m dprobe.sharing.interference_fit [--write] [--json]

``--write`` fits on every measured pair and writes ``interference_fitted.json`` (the trees, the figures,
the support, the intervals and the choice of default). Needs LightGBM (the train extra); predicting with
the written file needs numpy only.
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

from dprobe.core.gpus import generation
from dprobe.sharing.gavel import job_profile, leave_model_type_out, load_pairs, load_profiles, unordered_pairs
from dprobe.sharing.interference import (
    FEATURES,
    FITTED_FORMAT,
    FITTED_PATH,
    GPU,
    INTERVAL_LEVEL,
    PARTNER_LOAD,
    SPEED_FLOOR,
    FittedColocation,
    Trees,
    pair_features,
    predict_colocation,
    time_share,
)
from dprobe.sharing.support import Support, job_class

# LightGBM's settings: small trees, shrinkage, row and feature subsampling (one thread: deterministic)
PARAMS = {"objective": "l2", "learning_rate": 0.05, "num_leaves": 8, "min_data_in_leaf": 20, "lambda_l2": 1.0,
          "bagging_fraction": 0.8, "bagging_freq": 1, "feature_fraction": 0.8, "num_threads": 1, "seed": 0,
          "deterministic": True, "verbose": -1}
# the share of the time-share speed never rises with the partner's load
MONOTONE = {"monotone_constraints": [-1 if f in PARTNER_LOAD else 0 for f in FEATURES]}
ROUNDS = 200
RULES = ("per-job", "time-share", "contention", "no-slowdown", "constant")
H200_RUNS = Path(__file__).resolve().parents[2] / "datasets" / "h200-profiles" / "runs.csv"
LAB_PROFILES = Path(__file__).with_name("lab_profiles.json")


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


def shares(jobs: GavelJobs, rows: pd.DataFrame) -> np.ndarray:
    """What the per-job model learns of each row: the measured speed as a share of the time-share rule's
    (both jobs' profiled utilisations), within [SPEED_FLOOR, 1]."""
    out = []
    for r in rows.itertuples():
        a, b, _ = jobs.pair(r)
        out.append(r.speed / time_share(min(a["gpu_utilization"]["p50"], 1.0), min(b["gpu_utilization"]["p50"], 1.0)))
    return np.clip(np.array(out, dtype=np.float64), SPEED_FLOOR, 1.0)


def fit_trees(x: np.ndarray, y: np.ndarray, params: dict[str, Any] | None = None, rounds: int = ROUNDS) -> Trees:
    """Boosted trees of ``y`` on the inputs (LightGBM), as :class:`Trees` arrays."""
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
    return fit_trees(design(jobs, rows), shares(jobs, rows), MONOTONE)


Pair = tuple[dict[str, Any], dict[str, Any], GPU]


def _predictors(trees: Trees, mean: float) -> dict[str, Callable[[Pair], float]]:
    """Job A's speed beside job B by each method, through :func:`predict_colocation`."""
    fitted = FittedColocation(trees, per_job_default=True)

    def by(method: str) -> Callable[[Pair], float]:
        return lambda pair: predict_colocation(*pair, method=method, fitted=fitted)["speeds"][0]

    return {"per-job": by("per-job"), "time-share": by("time-share"), "contention": by("contention"),
            "no-slowdown": lambda pair: 1.0, "constant": lambda pair: mean}


def cross_validate(jobs: GavelJobs, folds: list[tuple[str, np.ndarray, np.ndarray]] | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Speed MAE of each method per fold and over all held-out jobs (model types held out unless ``folds``
    says otherwise: (name, training rows, held-out rows) of the measured pairs), and each held-out row's
    predictions (``rows``)."""
    measured = jobs.pairs[jobs.pairs["measured"]].reset_index(drop=True)
    folds = leave_model_type_out(measured) if folds is None else folds
    per_fold: list[dict[str, Any]] = []
    scored: list[pd.DataFrame] = []
    for name, train, held in folds:
        trees = fit(jobs, measured.iloc[train])
        predict = _predictors(trees, float(measured["speed"].iloc[train].mean()))
        part = measured.iloc[held]
        pairs = [jobs.pair(r) for r in part.itertuples()]
        got = {rule: np.array([predict[rule](p) for p in pairs]) for rule in RULES}
        truth = part["speed"].to_numpy()
        per_fold.append({"fold": name, "jobs": len(part),
                         "mae": {rule: float(np.mean(np.abs(got[rule] - truth))) for rule in RULES}})
        scored.append(part.assign(fold=name, **{_col(k): v for k, v in got.items()}))
        if progress:
            progress(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in per_fold[-1]["mae"].items()))
    rows = pd.concat(scored, ignore_index=True)
    overall = {rule: float(np.mean(np.abs(rows[_col(rule)] - rows["speed"]))) for rule in RULES}
    spread = {rule: {"min": min(f["mae"][rule] for f in per_fold), "max": max(f["mae"][rule] for f in per_fold),
                     "std": float(np.std([f["mae"][rule] for f in per_fold]))} for rule in RULES}
    return {"folds": per_fold, "overall": overall, "spread": spread, "held_out_jobs": len(rows), "rows": rows}


def _col(method: str) -> str:
    return "pred_" + method.replace("-", "_")


def leave_gpu_out(pairs: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Folds that hold out one GPU (here: one architecture) each."""
    gpus = pairs["gpu"].to_numpy()
    return [(g, np.flatnonzero(gpus != g), np.flatnonzero(gpus == g)) for g in sorted(set(gpus))]


def leave_class_out(pairs: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Folds that hold out one job class each (:func:`~dprobe.sharing.support.job_class`): every pair with a
    job of the class, as either job."""
    ca = np.array([job_class(m) for m in pairs["model_a"]])
    cb = np.array([job_class(m) for m in pairs["model_b"]])
    folds = []
    for c in sorted(set(ca) | set(cb)):
        held = (ca == c) | (cb == c)
        folds.append((c, np.flatnonzero(~held), np.flatnonzero(held)))
    return folds


def run_model(job: Any) -> tuple[str, dict[str, Any]]:
    """The model spec and ``predict_job`` keywords of one row of an h200-profiles-like ``runs.csv``, as
    ``dprobe predict`` would be called for it."""
    if job["lib"] == "transformers":
        name = f"transformers:{job['config']}/{job['arch']}"
    else:
        name = f"{job['lib']}:{job['model']}"
    return name, {"batch": int(float(job["batch"])), "precision": str(job["precision"]),
                  "optimizer": str(job["optimizer"]), "image": _whole(job["image"]), "seq": _whole(job["seq"])}


def load_lab_profiles(path: str | Path = LAB_PROFILES) -> dict[str, dict[str, Any]]:
    """The shipped profiles of the co-located runs of datasets/h200-profiles by run id
    (``tools/pair_profiles.py --write``)."""
    return json.loads(Path(path).read_text())["profiles"]


def lab_pairs(runs_csv: str | Path = H200_RUNS,
              profile: Callable[[Any], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Another lab's co-located pairs (an h200-profiles-like ``runs.csv``): each job with a solo run of the
    same configuration, its measured speed (solo step time over co-located), both jobs' profiles as
    ``dprobe predict`` gives them (``profile`` of a runs.csv row; default: the shipped ``lab_profiles.json``
    by run id) on the GPU they name, and the pair's device memory as NVML measured it."""
    from dprobe.sharing.interference import _pairs_and_solo, _solo_match

    runs = pd.read_csv(runs_csv)
    pairs, solo = _pairs_and_solo(runs)
    if profile is None:
        shipped = load_lab_profiles()
        profile = (lambda job: shipped[job["run_id"]])  # noqa: E731 - a lookup
    out = []
    for pair_id, members in pairs.groupby("pair"):
        if len(members) != 2:
            continue
        jobs = [m for _, m in members.iterrows()]
        profiles = [profile(j) for j in jobs]
        together = float(jobs[0]["nvml_peak_used_bytes"])
        for k in (0, 1):
            ref, _ = _solo_match(solo, jobs[k])
            if ref is None:
                continue
            out.append({"source": Path(runs_csv).parent.name, "pair": pair_id, "job": jobs[k]["run_id"],
                        "a": profiles[k], "b": profiles[1 - k], "gpu": GPU.of(profiles[k]["gpu_spec"]),
                        "speed": float(ref["step_time_median_s"]) / float(jobs[k]["step_time_median_s"]),
                        "pair_device_bytes": together})
    return out


def _whole(value: Any) -> int | None:
    """A whole number from a runs.csv cell (None where empty)."""
    return int(float(value)) if str(value) not in ("", "nan") else None


def score_lab(rows: list[dict[str, Any]], trees: Trees, mean: float) -> dict[str, Any]:
    """Each method's speed MAE on another lab's pairs (``lab_pairs``), the per-job model fitted on Gavel."""
    predict = _predictors(trees, mean)
    got = {m: [predict[m]((r["a"], r["b"], r["gpu"])) for r in rows] for m in RULES}
    truth = np.array([r["speed"] for r in rows])
    return {"jobs": len(rows), "mae": {m: float(np.mean(np.abs(np.array(v) - truth))) if rows else None
                                       for m, v in got.items()},
            "rows": [{"job": r["job"], "speed": r["speed"], **{m: got[m][i] for m in RULES}}
                     for i, r in enumerate(rows)]}


def sharing_extra(rows: list[dict[str, Any]]) -> float:
    """What a second process on the GPU adds to the two jobs' own predicted device memory (p50): the median
    over measured pairs of NVML's reading with both minus the two predictions, at least 0."""
    seen: dict[str, float] = {}
    for r in rows:
        seen[r["pair"]] = r["pair_device_bytes"] - (r["a"]["device_memory_bytes"]["p50"]
                                                    + r["b"]["device_memory_bytes"]["p50"])
    return max(0.0, float(np.median(list(seen.values())))) if seen else 0.0


def pooled_quantile(groups: list[np.ndarray], q: float) -> float:
    """The ``q`` quantile of the values of several sources together, each source weighing the same however
    many jobs it has (a source of 1,000 jobs does not drown one of 10)."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    values = np.concatenate(groups)
    weights = np.concatenate([np.full(len(g), 1.0 / len(g)) for g in groups])
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(int(np.searchsorted(cum, q)), len(values) - 1)])


def interval_ratio(groups: dict[str, np.ndarray], level: float = INTERVAL_LEVEL) -> dict[str, Any]:
    """The factor on a p50 speed that gives its lower end (p10 at ``level`` 0.9), from measured / predicted
    speed grouped by left-out source: the ``1 - level`` quantile of all sources together, each weighing the
    same (``ratio``, shipped). Per source: the coverage the factor from the *other* sources gives it
    (``coverage_left_out``: what a source never seen gets), and the shipped factor's (``coverage``)."""
    groups = {s: np.asarray(v, dtype=np.float64) for s, v in groups.items() if len(v)}
    if not groups:
        return {"ratio": 1.0, "level": level, "sources": {}}
    ratio = pooled_quantile(list(groups.values()), 1 - level)
    per = {}
    for s, v in groups.items():
        others = [x for t, x in groups.items() if t != s]
        left_out = pooled_quantile(others, 1 - level) if others else None
        per[s] = {"jobs": len(v), "coverage_left_out": float(np.mean(v >= left_out)) if left_out is not None else None,
                  "ratio_left_out": left_out, "coverage": float(np.mean(v >= ratio))}
    return {"ratio": ratio, "level": level, "sources": per}


def fit_accuracy(jobs: GavelJobs, fitted: FittedColocation | None = None) -> dict[str, Any]:
    """How often :func:`predict_colocation`'s memory verdict is right on each pair (once per pair, both
    orders alike): "no" for a pair that was not run together, "yes" or "maybe" for one that was; per
    model type (every pair that involves it) and over all, beside "always fits"."""
    pairs = unordered_pairs(jobs.pairs)
    said = np.array([predict_colocation(*jobs.pair(r), method="time-share", fitted=fitted)["fits"] != "no"
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


def support_of(jobs: GavelJobs) -> Support:
    """What the measured pairs cover: the GPUs' architectures, the job types' classes, the range of the
    jobs' profiled utilisations."""
    measured = jobs.pairs[jobs.pairs["measured"]]
    u = [jobs.profile(r.a, r.gpu)["gpu_utilization"]["p50"] for r in measured.itertuples()]
    return Support(tuple(sorted({generation(jobs.gpu(g).name) for g in measured["gpu"]})),
                   tuple(sorted({job_class(m) for m in measured["model_a"]})),
                   round(float(min(u)), 4), round(float(max(u)), 4))


def validate(jobs: GavelJobs, lab: list[dict[str, Any]] | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every validation of the module docstring: model types, GPU architectures and job classes left out of
    Gavel, the lab left out (``lab``: :func:`lab_pairs`), the intervals and the memory verdict."""
    measured = jobs.pairs[jobs.pairs["measured"]].reset_index(drop=True)
    by_type = cross_validate(jobs, progress=progress)
    by_gpu = cross_validate(jobs, leave_gpu_out(measured), progress=progress)
    by_class = cross_validate(jobs, leave_class_out(measured), progress=progress)
    lab = lab or []
    trees = fit(jobs)
    by_lab = score_lab(lab, trees, float(measured["speed"].mean()))
    beats = all(f["mae"]["per-job"] < f["mae"]["time-share"] for cv in (by_gpu, by_class) for f in cv["folds"])
    ratios: dict[str, dict[str, np.ndarray]] = {m: {} for m in ("per-job", "time-share", "contention")}
    for kind, cv in (("architecture", by_gpu), ("class", by_class)):
        for name, part in cv["rows"].groupby("fold"):
            ratios["per-job"][f"{kind} {name}"] = (part["speed"] / part[_col("per-job")]).to_numpy()
    for rule in ("time-share", "contention"):  # nothing fitted: every measured job is left out
        for kind, cv in (("architecture", by_gpu), ("class", by_class)):
            for name, part in cv["rows"].groupby("fold"):
                ratios[rule][f"{kind} {name}"] = (part["speed"] / part[_col(rule)]).to_numpy()
        if lab:
            ratios[rule]["lab " + lab[0]["source"]] = np.array([r["speed"] / r[rule] for r in by_lab["rows"]])
    return {"leave_model_type_out": by_type, "leave_gpu_out": by_gpu, "leave_class_out": by_class,
            "leave_lab_out": by_lab, "per_job_beats_rule_everywhere": beats, "trees": trees,
            "intervals": {m: interval_ratio(g) for m, g in ratios.items()},
            "sharing_extra_bytes": sharing_extra(lab), "support": support_of(jobs)}


def write_fitted(jobs: GavelJobs, path: str | Path = FITTED_PATH, lab: list[dict[str, Any]] | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Validate (:func:`validate`), fit on every measured pair and write the model with its figures, its
    support, its intervals and the default it earns."""
    v = validate(jobs, lab, progress)
    fitted = FittedColocation(v["trees"], v["per_job_beats_rule_everywhere"], v["support"],
                              sharing_extra_bytes=v["sharing_extra_bytes"])
    measured = jobs.pairs[jobs.pairs["measured"]]
    doc = {"format": FITTED_FORMAT, "features": list(FEATURES), "params": {**PARAMS, **MONOTONE}, "rounds": ROUNDS,
           "data": "datasets/gavel-colocation", "measured_jobs": len(measured),
           "gpus": sorted({jobs.gpu(g).name for g in measured["gpu"]}),
           "per_job_default": bool(v["per_job_beats_rule_everywhere"]), "support": v["support"].as_dict(),
           "speed_p10_ratio": {m: round(i["ratio"], 4) for m, i in v["intervals"].items()},
           "sharing_extra_bytes": v["sharing_extra_bytes"],
           "summary": {**{k: summary_of(v[k]) for k in ("leave_model_type_out", "leave_gpu_out", "leave_class_out")},
                       "leave_lab_out": v["leave_lab_out"], "intervals": v["intervals"],
                       "memory_fit": fit_accuracy(jobs, fitted)},
           "trees": v["trees"].to_dict()}
    Path(path).write_text(json.dumps(doc) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {FITTED_PATH.name}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    jobs = gavel_jobs()
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    lab = lab_pairs()
    if args.write:
        doc = write_fitted(jobs, lab=lab, progress=say)
        out = doc["summary"]
        say(f"wrote {FITTED_PATH}: per-job default inside its support {doc['per_job_default']}")
    else:
        v = validate(jobs, lab, progress=say)
        out = {k: summary_of(v[k]) for k in ("leave_model_type_out", "leave_gpu_out", "leave_class_out")}
        out.update(leave_lab_out=v["leave_lab_out"], intervals=v["intervals"], memory_fit=fit_accuracy(jobs))
    if args.json:
        print(json.dumps(out))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
