"""Fit the cluster's all-reduce parameters (:class:`~.model.ClusterParams`) on measured data-parallel steps,
score them leave-one-model-out, and write what ``dprobe predict --gpus`` ships (``_fitted.py``).

``python -m dprobe.profiling.dataparallel.fit [--data DIR] [--write]`` refits on ``datasets/pollux-placements``
(or DIR laid out like it) and prints the parameters; ``--write`` replaces the shipped ones.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dprobe.core.conformal import conformal_shift
from dprobe.profiling.dataparallel.data import load_steps
from dprobe.profiling.dataparallel.model import PARAM_NAMES, ClusterParams, sync_seconds

FITTED_MODULE = Path(__file__).with_name("_fitted.py")
EPS_SYNC = 1e-3  # s: sync times this small count as equal in the loss (one-node rings hide almost all)
START = ClusterParams(intra_bandwidth=5e9, intra_latency=0.0, inter_bandwidth=1e9, inter_latency=0.0,
                      per_gpu_on_node=0.2, two_node_penalty=0.3, overlap=0.5, tail=0.3, straggler=0.02)
# held at their START value, not fitted: the per-ring-step latencies are not identifiable on pollux-placements
# (fitted on all five models they come out near 0; fitted on fewer they drift to milliseconds, which a model
# whose all-reduce backward cannot hide then pays in full)
HELD = ("intra_latency", "inter_latency")
FREE = tuple(n for n in PARAM_NAMES if n not in HELD)
LATENCY_START = {"intra_latency": 5e-5, "inter_latency": 5e-4}  # where the latencies start when fitted
LEVEL = 0.9


def _free(hold: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in PARAM_NAMES if n not in hold)


def _to_params(theta: np.ndarray, hold: tuple[str, ...] = HELD) -> ClusterParams:
    free = _free(hold)
    values = {**START.as_dict(), **dict(zip(free, np.exp(theta), strict=True))}
    values["tail"] = float(1.0 / (1.0 + math.exp(-theta[free.index("tail")])))
    return ClusterParams(**values)


def _to_theta(params: ClusterParams, hold: tuple[str, ...] = HELD) -> np.ndarray:
    free = _free(hold)
    theta = np.log([getattr(params, n) for n in free])
    tail = params.tail
    theta[free.index("tail")] = math.log(tail / (1.0 - tail))
    return theta


def predict_sync(params: ClusterParams, steps: pd.DataFrame) -> np.ndarray:
    """Predicted synchronisation seconds of each row of :func:`~.data.load_steps`."""
    return sync_seconds(params, steps.single_step.to_numpy(), steps.grad_bytes.to_numpy(), steps.gpus.to_numpy(),
                        steps.nodes.to_numpy(), steps.busiest.to_numpy(), steps.window.to_numpy())


def fit_params(steps: pd.DataFrame, hold: tuple[str, ...] = HELD) -> ClusterParams:
    """Least squares on the log ratio of predicted to measured step time and sync time (each model weighing
    the same, a soft L1 loss against the odd slow measurement), all models sharing the parameters (those of
    ``hold`` kept at their :data:`START` value; a latency fitted starts at :data:`LATENCY_START`)."""
    wrong = sorted(set(hold) - set(PARAM_NAMES) | {"tail"} & set(hold))
    if wrong:
        raise ValueError(f"cannot hold {', '.join(wrong)} in the fit: hold any of {', '.join(PARAM_NAMES)} "
                         f"but tail")
    weight = 1.0 / np.sqrt(steps.groupby("model").model.transform("size").to_numpy())
    step, sync, single = (steps[c].to_numpy() for c in ("step_time", "sync_time", "single_step"))

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = predict_sync(_to_params(theta, hold), steps)
        return np.concatenate([weight * np.log((single + pred) / step),
                               weight * np.log((pred + EPS_SYNC) / (sync + EPS_SYNC))])

    start = ClusterParams(**{**START.as_dict(), **{k: v for k, v in LATENCY_START.items() if k not in hold}})
    result = least_squares(residuals, _to_theta(start, hold), loss="soft_l1", f_scale=0.3, x_scale=1.0,
                           xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=5000)
    return _to_params(result.x, hold)


def leave_one_model_out(steps: pd.DataFrame, hold: tuple[str, ...] = HELD) -> pd.DataFrame:
    """Each model's rows predicted by parameters fitted on the other models: ``steps`` with ``pred_sync``,
    ``pred_step`` (its own one-GPU step time plus the predicted sync, as a user with ``--step-time`` has);
    ``hold``: as in :func:`fit_params`."""
    out = steps.copy()
    out["pred_sync"] = np.nan
    for model in sorted(steps.model.unique()):
        held = (steps.model == model).to_numpy()
        params = fit_params(steps[~held], hold)
        out.loc[held, "pred_sync"] = predict_sync(params, steps[held])
    out["pred_step"] = out.single_step + out.pred_sync
    return out


def p90_factors(scored: pd.DataFrame) -> dict[str, float]:
    """Split-conformal p90 of held-out models: the factor on a p50 that covers 90 % of their rows."""
    return {"step": math.exp(conformal_shift(np.log(scored.step_time / scored.pred_step).to_numpy(), LEVEL)),
            "sync": math.exp(conformal_shift(np.log((scored.sync_time + EPS_SYNC) / (scored.pred_sync + EPS_SYNC))
                                             .to_numpy(), LEVEL))}


def fitted(root: str | Path | None = None, param_counts: dict[str, int] | None = None) -> dict[str, Any]:
    """What ships: the parameters fitted on every model of ``root``, and p90 factors from leave-one-model-out."""
    steps = load_steps(root, param_counts)
    factors = p90_factors(leave_one_model_out(steps))
    return {"params": {k: float(f"{v:.6g}") for k, v in fit_params(steps).as_dict().items()},
            "p90_step_factor": round(factors["step"], 4), "p90_sync_factor": round(factors["sync"], 4),
            "models": sorted(steps.model.unique()), "rows": len(steps)}


def write_fitted(values: dict[str, Any], path: Path = FITTED_MODULE) -> None:
    """Write ``values`` as the module ``dprobe predict`` reads (no data set needed at run time)."""
    path.write_text('"""Data-parallel parameters fitted on datasets/pollux-placements; written by\n'
                    '``python -m dprobe.profiling.dataparallel.fit --write`` (do not edit)."""\n\n'
                    f"FITTED = {pprint.pformat(values, sort_dicts=True, width=100)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dprobe.profiling.dataparallel.fit", description=__doc__)
    ap.add_argument("--data", default=None, help="directory laid out like datasets/pollux-placements")
    ap.add_argument("--write", action="store_true", help=f"replace {FITTED_MODULE.name} with the refit")
    args = ap.parse_args(argv)
    values = fitted(args.data)
    print(json.dumps(values, indent=2))
    if args.write:
        write_fitted(values)
        print(f"wrote {FITTED_MODULE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
