"""Fit the data-parallel model (:mod:`.model`) on measured steps, score it leave-one-model-out, and write what
``dprobe predict --gpus`` ships (``_fitted.py``).

Every measured cluster (pollux-placements' T4 cluster, Gavel's K80, P100 and V100 servers) gets its own link
bandwidths, stragglers and two-node penalty; how DistributedDataParallel hides the all-reduce
(:data:`~.model.SHARED`) is one set for all. A cluster never measured gets its nominal link bandwidths times
the median efficiency the measured clusters reach on each side, and their median stragglers
(:func:`~.model.unseen_cluster`).

``python -m dprobe.profiling.dataparallel.fit [--data DIR] [--no-gavel] [--write]`` refits on
``datasets/pollux-placements`` (or DIR laid out like it) and Gavel's data-parallel rows and prints the
parameters; ``--write`` replaces the shipped ones.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dprobe.profiling.dataparallel.data import load_all
from dprobe.profiling.dataparallel.model import (
    PER_CLUSTER,
    SHARED,
    WINDOW_BLEND,
    Fitted,
    sync_seconds,
    unseen_cluster,
)
from dprobe.profiling.dataparallel.predict import predict_rows

FITTED_MODULE = Path(__file__).with_name("_fitted.py")
EPS_SYNC = 1e-3  # s: sync times this small count as equal in the loss (one-node rings hide almost all)
START = {"intra_bandwidth": 2e9, "inter_bandwidth": 1e9, "per_gpu_on_node": 0.1, "two_node_penalty": 0.3,
         "overlap": 1.0, "tail": 0.1, "straggler": 0.03, "straggler_intra": 0.01}
LEVELS = (0.9, 0.925, 0.95, 0.975)  # the p90's quantile: the lowest whose held-out models average >= 90 %
TARGET_COVERAGE = 0.9


def predict_sync(fitted: Fitted, steps: pd.DataFrame) -> np.ndarray:
    """Predicted synchronisation seconds of each row of :func:`~.data.load_all` (its cluster's parameters)."""
    out = np.full(len(steps), np.nan)
    for cluster, idx in steps.groupby("cluster").indices.items():
        part = steps.iloc[idx]
        out[idx] = sync_seconds(fitted.params(cluster), part.single_step.to_numpy(), part.grad_bytes.to_numpy(),
                                part.gpus.to_numpy(), part.nodes.to_numpy(), part.busiest.to_numpy(),
                                fitted.window(part.window.to_numpy()))
    return out


def _names(clusters: list[str]) -> list[str]:
    return list(SHARED) + [f"{n}@{c}" for c in clusters for n in PER_CLUSTER]


def _unpack(theta: np.ndarray, names: list[str]) -> dict[str, float]:
    values = {}
    for name, v in zip(names, np.clip(theta, -40.0, 40.0), strict=True):
        values[name] = 1.0 / (1.0 + math.exp(-v)) if name.startswith("tail") else math.exp(v)
    return values


def fit_params(steps: pd.DataFrame, window_blend: float = WINDOW_BLEND) -> Fitted:
    """Least squares on the log ratio of predicted to measured step time (every row) and sync time (rows that
    measured it), each model and cluster weighing the same, a soft L1 loss against the odd slow measurement."""
    clusters = sorted(steps.cluster.unique())
    names = _names(clusters)
    key = steps.group + "/" + steps.cluster
    weight = 1.0 / np.sqrt(steps.groupby(key).group.transform("size").to_numpy())
    step, sync, single = (steps[c].to_numpy(dtype=np.float64) for c in ("step_time", "sync_time", "single_step"))
    has = ~np.isnan(sync)
    start = np.array([math.log(START[n.split("@")[0]]) if not n.startswith("tail") else
                      math.log(START["tail"] / (1 - START["tail"])) for n in names])

    def to_fitted(theta: np.ndarray) -> Fitted:
        values = _unpack(theta, names)
        return Fitted({n: values[n] for n in SHARED},
                      {c: {n: values[f"{n}@{c}"] for n in PER_CLUSTER} for c in clusters}, window_blend)

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = predict_sync(to_fitted(theta), steps)
        return np.concatenate([weight * np.log((single + pred) / step),
                               weight[has] * np.log((pred[has] + EPS_SYNC) / (sync[has] + EPS_SYNC))])

    result = least_squares(residuals, start, loss="soft_l1", f_scale=0.3, max_nfev=4000)
    return to_fitted(result.x)


def leave_one_model_out(steps: pd.DataFrame, window_blend: float = WINDOW_BLEND) -> pd.DataFrame:
    """Each model (``group``: a pollux-placements model with Gavel's job type of the same architecture) predicted
    by parameters fitted on the other models: ``steps`` with ``pred_sync`` and ``pred_step`` (its own one-GPU
    step time plus the predicted sync, as a user with ``--step-time`` has), each row through
    :func:`~.predict.predict_data_parallel` as ``dprobe predict`` calls it. ``attrs["fits"]``: each held-out
    model's :class:`~.model.Fitted`."""
    out = steps.copy()
    out["pred_sync"] = np.nan
    fits = {}
    for group in sorted(steps.group.unique()):
        held = (steps.group == group).to_numpy()
        fits[group] = fit_params(steps[~held], window_blend)
        out.loc[held, "pred_sync"] = predict_rows(steps[held], fits[group])
    out["pred_step"] = out.single_step + out.pred_sync
    out.attrs["fits"] = fits
    return out


def _log_residuals(scored: pd.DataFrame) -> dict[str, pd.Series]:
    return {"step": np.log(scored.step_time / scored.pred_step),
            "sync": np.log((scored.sync_time + EPS_SYNC) / (scored.pred_sync + EPS_SYNC))}


def _quantile(values: np.ndarray, groups: np.ndarray, level: float) -> float:
    """The ``level`` quantile of ``values``, each group weighing the same."""
    order = np.argsort(values)
    values, groups = values[order], groups[order]
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    cum = np.cumsum(1.0 / counts[inverse])
    return float(values[min(int(np.searchsorted(cum / cum[-1], level)), len(values) - 1)])


def coverage(scored: pd.DataFrame, level: float) -> dict[str, dict[str, float]]:
    """Per model, the share of its rows under a p90 whose factor comes from the other models' held-out
    residuals only (nested: never its own): ``{"step": {model: share}, "sync": {...}}``."""
    out: dict[str, dict[str, float]] = {"step": {}, "sync": {}}
    for kind, res in _log_residuals(scored).items():
        ok = res.notna().to_numpy()
        for group in sorted(scored.group.unique()):
            mine = (scored.group == group).to_numpy()
            if not (mine & ok).any():
                continue
            factor = _quantile(res[~mine & ok].to_numpy(), scored.group[~mine & ok].to_numpy(), level)
            out[kind][group] = float(np.mean(res[mine & ok].to_numpy() <= factor))
    return out


def p90_factors(scored: pd.DataFrame) -> dict[str, float]:
    """The p90 factors on a p50 (step, sync): the quantile of held-out models' log residuals (each model
    weighing the same) at the lowest of :data:`LEVELS` whose nested per-model coverage averages >= 90 %."""
    res = _log_residuals(scored)
    out: dict[str, float] = {}
    for kind in ("step", "sync"):
        ok = res[kind].notna().to_numpy()
        for level in LEVELS:
            if np.mean(list(coverage(scored, level)[kind].values())) >= TARGET_COVERAGE:
                break
        out[kind] = math.exp(max(_quantile(res[kind][ok].to_numpy(), scored.group[ok].to_numpy(), level), 0.0))
        out[f"{kind}_level"] = level
    return out


def fitted(root: str | Path | None = None, param_counts: dict[str, int] | None = None,
           gavel: str | Path | None | bool = None) -> dict[str, Any]:
    """What ships: the parameters fitted on every model, what an unseen cluster gets, and the p90 factors
    from leave-one-model-out."""
    steps = load_all(root, param_counts, gavel)
    fit = fit_params(steps)
    factors = p90_factors(leave_one_model_out(steps))
    return {**fit.as_dict(), "unseen": {k: float(f"{v:.6g}") for k, v in unseen_cluster(fit).items()},
            "p90_step_factor": round(factors["step"], 4), "p90_sync_factor": round(factors["sync"], 4),
            "p90_levels": {"step": factors["step_level"], "sync": factors["sync_level"]},
            "models": sorted(steps.model.unique()), "groups": sorted(steps.group.unique()), "rows": len(steps)}


def write_module(path: Path, doc: str, name: str, values: dict[str, Any]) -> None:
    """Write ``values`` as the Python module ``path`` holding the constant ``name`` (a fitted table the code
    reads with no data set at run time), its docstring ``doc``."""
    path.write_text(f'"""{doc}"""\n\n' "from typing import Any\n\n"
                    f"{name}: dict[str, Any] = {pprint.pformat(values, sort_dicts=True, width=110)}\n")


def write_fitted(values: dict[str, Any], path: Path = FITTED_MODULE) -> None:
    """Write ``values`` as the module ``dprobe predict`` reads (no data set needed at run time)."""
    write_module(path, "Data-parallel parameters fitted on datasets/pollux-placements and the data-parallel rows of\n"
                 "datasets/gavel-colocation; written by ``python -m dprobe.profiling.dataparallel.fit --write``\n"
                 "(do not edit).", "FITTED", values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dprobe.profiling.dataparallel.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="directory laid out like datasets/pollux-placements")
    ap.add_argument("--no-gavel", action="store_true", help="leave Gavel's data-parallel rows out")
    ap.add_argument("--write", action="store_true", help=f"replace {FITTED_MODULE.name} with the refit")
    args = ap.parse_args(argv)
    t0 = time.time()
    values = fitted(args.data, gavel=False if args.no_gavel else None)
    print(json.dumps(values, indent=2))
    print(f"fitted in {time.time() - t0:.0f} s")
    if args.write:
        write_fitted(values)
        print(f"wrote {FITTED_MODULE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
