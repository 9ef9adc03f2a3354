"""What the learned model corrects and how: the analytical targets of a job, the residuals the network
predicts against them, and the host stalls that prediction puts back (used by training and inference)."""

from __future__ import annotations

import numpy as np
import torch

from dprobe.profiling.coldstart.features import FEATURES
from dprobe.profiling.coldstart.model import TARGETS, ColdStartEnsemble, ColdStartModel
from dprobe.profiling.coldstart.replay import ReplayEstimate


def baseline(est: ReplayEstimate, feats: list[float] | np.ndarray) -> np.ndarray:
    """Analytical predictions: peak, NVML, utilisation (GPU busy share of the roofline step), step time."""
    return np.array([est.peak_bytes, est.device_bytes, *roofline_targets(np.asarray(feats, dtype=np.float64))])


def roofline_targets(feats: np.ndarray) -> np.ndarray:
    """Utilisation (GPU busy share of the roofline step, within 5-95 %) and step time from feature rows."""
    log_roof = feats[..., FEATURES.index("log_t_roof")]
    busy = np.clip(np.exp(feats[..., FEATURES.index("log_t_gpu")] - log_roof), 0.05, 0.95)
    return np.stack([busy, np.exp(log_roof)], axis=-1)


def to_residual(y: np.ndarray, base: np.ndarray) -> np.ndarray:
    r = np.log(y / base)
    u = np.clip(y[..., 2], 0.01, 0.99)
    r[..., 2] = np.log(u / (1 - u))
    return r


def from_residual(r: np.ndarray, base: np.ndarray) -> np.ndarray:
    y = base * np.exp(r)
    y[..., 2] = 1 / (1 + np.exp(-r[..., 2]))
    return y


def busy_utilisation(util: np.ndarray, step: np.ndarray, stall: np.ndarray) -> np.ndarray:
    """Utilisation while the job runs steps, from utilisation measured over steps and host stalls."""
    return np.clip(util * (step + stall) / step, 0.01, 0.99)


def with_stall(busy: np.ndarray | float, step: np.ndarray | float,
               stall: np.ndarray | float) -> np.ndarray | float:
    """Utilisation over steps and host stalls (``stall`` seconds per step, GPU idle) from the busy share
    (arrays of jobs, or one job's figures)."""
    return busy * step / (step + stall)


def apply_stall(p50: np.ndarray, p90: np.ndarray, stall: np.ndarray | float) -> None:
    """In place: turn predicted busy utilisation into utilisation with stalls (both with the p50 step)."""
    ui, si = TARGETS.index("gpu_utilization"), TARGETS.index("step_time_seconds")
    step = p50[..., si].copy()
    p50[..., ui] = with_stall(p50[..., ui], step, stall)
    p90[..., ui] = with_stall(p90[..., ui], step, stall)


def uses_graphs(model: ColdStartModel | ColdStartEnsemble) -> bool:
    """Whether the model reads the jobs' graphs (a graph encoder: the shipped model has none, and then
    neither PyG nor the graphs' conversion is needed)."""
    return model.encoder is not None


@torch.no_grad()
def predict_residuals(model: ColdStartModel | ColdStartEnsemble, graphs: list, feats: np.ndarray) -> np.ndarray:
    """The model's residuals ``[n, 4, 2]`` (p50, p90) for the runs' graphs and feature rows."""
    graph_batch = None
    if uses_graphs(model):
        from torch_geometric.data import Batch

        graph_batch = Batch.from_data_list(graphs)
    out = model(graph_batch, torch.tensor(feats, dtype=torch.float32))
    return out.numpy().astype(np.float64)


def predict_targets(model: ColdStartModel | ColdStartEnsemble, graphs: list, feats: np.ndarray, base: np.ndarray,
                    p90_shift: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The learned p50 and p90 ``[n, 4]`` of the jobs' targets from their feature rows and analytical
    estimates (``p90_shift``: added to the p90 residual of each target); utilisation is the busy share,
    before the host stalls are put back (:func:`apply_stall`)."""
    res = predict_residuals(model, graphs, feats)
    if p90_shift is not None:
        res[..., 1] += p90_shift
    return from_residual(res[..., 0], base), from_residual(res[..., 1], base)
