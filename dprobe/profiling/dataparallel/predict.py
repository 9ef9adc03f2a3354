"""A data-parallel job's step time, throughput and scaling efficiency (p50 and p90), from its one-GPU step
time at the per-GPU batch, its gradient bytes and its backward window, with the shipped cluster parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dprobe.profiling.dataparallel._fitted import FITTED
from dprobe.profiling.dataparallel.model import ClusterParams, step_seconds
from dprobe.profiling.dataparallel.placement import Placement, packed
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW, check_window

DEFAULT_MIN_EFFICIENCY = 0.8
MAX_SEARCH_GPUS = 1024


# where the link parameters come from: every prediction says so, since another cluster's links differ
INTERCONNECT = ("fitted on pollux-placements (NVIDIA T4, 4-GPU nodes, PCIe within a node, 50 Gb/s Ethernet across); "
                "refit on your cluster: tools/collect_ddp_steps.py, then python -m dprobe.profiling.dataparallel.fit")


def shipped_params() -> ClusterParams:
    """The parameters fitted on ``datasets/pollux-placements`` (:mod:`.fit`)."""
    return ClusterParams.from_dict(FITTED["params"])


@dataclass(frozen=True)
class DataParallelPrediction:
    """``dprobe predict --gpus``'s ``data_parallel`` object."""

    placement: Placement
    global_batch: int
    local_batch: int
    grad_bytes: float
    grad_bytes_from: str  # "graph" or "--params"
    single_step_from: str  # "cold start" or "--step-time"
    single_step_seconds: tuple[float, float]  # one GPU at the local batch, p50 and p90
    step_time_seconds: tuple[float, float]
    sync_time_seconds: tuple[float, float]
    min_efficiency: float
    scaling_limit_gpus: int | None  # most GPUs (packed) with efficiency >= min_efficiency; None: beyond the search
    gpus_per_node: int
    backward_window: float = UNIFORM_WINDOW  # share of backward left to hide a gradient byte (.timeline)
    backward_window_from: str = "uniform"  # "graph", or "uniform" (no graph: gradients spread evenly)

    @property
    def throughput(self) -> tuple[float, float]:
        """Samples per second, p50 and the low end (at the step time's p90)."""
        return self.global_batch / self.step_time_seconds[0], self.global_batch / self.step_time_seconds[1]

    @property
    def scaling_efficiency(self) -> float:
        """Throughput over ``N`` times one GPU's at the same per-GPU batch (p50s)."""
        return self.single_step_seconds[0] / self.step_time_seconds[0]

    def as_dict(self) -> dict[str, Any]:
        band = lambda v: {"p50": v[0], "p90": v[1]}  # noqa: E731
        tp = self.throughput
        return {"gpus": self.placement.gpus, "nodes": self.placement.nodes, "placement": str(self.placement),
                "global_batch": self.global_batch, "local_batch": self.local_batch,
                "grad_bytes": int(self.grad_bytes), "grad_bytes_from": self.grad_bytes_from,
                "backward_window": round(self.backward_window, 4), "backward_window_from": self.backward_window_from,
                "single_gpu_step_time_seconds": band(self.single_step_seconds),
                "single_gpu_step_time_from": self.single_step_from,
                "step_time_seconds": band(self.step_time_seconds),
                "sync_time_seconds": band(self.sync_time_seconds),
                "throughput_samples_per_second": {"p50": tp[0], "p90": tp[1]},
                "scaling_efficiency": round(self.scaling_efficiency, 4),
                "scaling_limit": {"min_efficiency": self.min_efficiency, "gpus_per_node": self.gpus_per_node,
                                  "max_gpus": self.scaling_limit_gpus},
                "interconnect": INTERCONNECT}


def scaling_limit(single_step: float, grad_bytes: float, gpus_per_node: int, min_efficiency: float,
                  params: ClusterParams | None = None, max_gpus: int = MAX_SEARCH_GPUS,
                  window: float = UNIFORM_WINDOW) -> int | None:
    """The number of GPUs (packed onto nodes of ``gpus_per_node``, per-GPU batch held) beyond which the
    throughput per GPU first drops under ``min_efficiency`` of one GPU's; None when it never does up to
    ``max_gpus``."""
    params = params or shipped_params()
    for n in range(2, max_gpus + 1):
        step, _ = step_seconds(params, single_step, grad_bytes, packed(n, gpus_per_node), window)
        if single_step / step < min_efficiency:
            return n - 1
    return None


def predict_data_parallel(single_step: tuple[float, float], grad_bytes: float, global_batch: int, where: Placement,
                          gpus_per_node: int, single_step_from: str, grad_bytes_from: str,
                          min_efficiency: float = DEFAULT_MIN_EFFICIENCY,
                          params: ClusterParams | None = None, window: float | None = None) -> DataParallelPrediction:
    """The job's data-parallel prediction; ``single_step``: one GPU's step at the local batch (p50, p90);
    ``window``: the model's backward window (:func:`~.timeline.backward_window` of its graph; None: no
    graph, :data:`~.timeline.UNIFORM_WINDOW`). The p90 is the step at the one-GPU p90 times the
    leave-one-model-out conformal factor."""
    if not 0 < min_efficiency <= 1:
        raise ValueError(f"--min-efficiency must be in (0, 1], not {min_efficiency}")
    if not (single_step[0] > 0 and single_step[1] >= single_step[0]):
        raise ValueError(f"--step-time must be a positive number of seconds, not {single_step[0]}")
    if not grad_bytes > 0:
        raise ValueError(f"--params must be >= 1 (gradient bytes {grad_bytes})")
    window_from = "uniform" if window is None else "graph"
    window = UNIFORM_WINDOW if window is None else check_window(window, "backward window of the graph")
    params = params or shipped_params()
    step50, sync50 = step_seconds(params, single_step[0], grad_bytes, where, window)
    step_hi, sync_hi = step_seconds(params, single_step[1], grad_bytes, where, window)
    step90 = max(step50, step_hi * FITTED["p90_step_factor"]) if where.gpus > 1 else step_hi
    sync90 = max(sync50, sync_hi * FITTED["p90_sync_factor"])
    return DataParallelPrediction(
        placement=where, global_batch=global_batch, local_batch=global_batch // where.gpus, grad_bytes=grad_bytes,
        grad_bytes_from=grad_bytes_from, single_step_from=single_step_from, single_step_seconds=single_step,
        step_time_seconds=(step50, step90), sync_time_seconds=(sync50, sync90), min_efficiency=min_efficiency,
        scaling_limit_gpus=scaling_limit(single_step[0], grad_bytes, gpus_per_node, min_efficiency, params,
                                         window=window),
        gpus_per_node=gpus_per_node, backward_window=window, backward_window_from=window_from)
