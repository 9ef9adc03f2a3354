"""What the job-scale model sees of a job: its first second of GPU samples as features, what the graph
variant takes from the cold-start prediction, and the record of the jobs it learns from or predicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dprobe.profiling.coldstart.features import BF16
from dprobe.profiling.coldstart.replay import TWO_STATE_OPTIMIZERS

if TYPE_CHECKING:
    from dprobe.profiling.coldstart.predict import JobPrediction

FIRST_SECONDS = 1.0
HORIZON_SECONDS = 10.0
OBS_FEATURES = ["log_mem_last", "log_mem_max", "util_mean", "util_last", "util_busy_share", "log_mem_total",
                "log_batch", "bf16", "fp16", "adamw", "util_max", "util_recent", "util_trend", "busy_onset",
                "host_stall_ms"]
# the cold-start profiler's graph-derived features used for utilisation: the per-kernel roofline's GPU
# busy time and host issue time of one step (more overfit on the few runs there are); the graph
# variant's inputs add the logit of the cold-start utilisation prediction (COLDSTART_FEATURE)
GRAPH_FEATURES = ["log_t_gpu", "log_t_host"]
COLDSTART_FEATURE = "logit_coldstart_util"


@dataclass
class JobScaleDataset:
    """Jobs as the job-scale model takes them, one row each: their first second and, for training, what
    the horizon after it brought. The graph variant's fields are None without graphs."""

    obs: np.ndarray  # [n, len(OBS_FEATURES)] (:func:`first_second_features`)
    y: np.ndarray | None = None  # [n, 2]: memory plateau (bytes), mean utilisation (0-1) over the horizon
    families: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    graphs: list | None = None  # the model graphs as PyG ``Data`` (for a GNN embedding)
    graph_feats: np.ndarray | None = None  # [n, len(GRAPH_FEATURES) + 1]: with the cold-start utilisation's logit
    device_estimate: np.ndarray | None = None  # the cold-start replay's device memory (reserved + CUDA context)
    coldstart_util: np.ndarray | None = None  # the cold-start prediction of the job's utilisation

    @property
    def measured(self) -> np.ndarray:
        """``y``; a ValueError for jobs without it (those of a prediction: fitting and scoring need it)."""
        if self.y is None:
            raise ValueError("the job-scale rows have no measured horizon (y): fitting and scoring need one")
        return self.y

    @property
    def graph_list(self) -> list:
        """``graphs``; a ValueError without them (:meth:`_no_graphs`)."""
        if self.graphs is None:
            raise self._no_graphs("graphs")
        return self.graphs

    @property
    def graph_rows(self) -> np.ndarray:
        """``graph_feats``; a ValueError without graphs."""
        if self.graph_feats is None:
            raise self._no_graphs("graph_feats")
        return self.graph_feats

    @property
    def replayed_memory(self) -> np.ndarray:
        """``device_estimate``; a ValueError without graphs."""
        if self.device_estimate is None:
            raise self._no_graphs("device_estimate")
        return self.device_estimate

    @staticmethod
    def _no_graphs(name: str) -> ValueError:
        return ValueError(f"the job-scale rows have no {name}: the graph variant needs the jobs' model "
                          "graphs")


@dataclass(frozen=True)
class ColdStartInputs:
    """What the graph variant takes from the cold-start profiler's prediction of the job."""

    gpu_seconds: float  # the roofline's GPU busy time of a step
    host_seconds: float  # the roofline's host issue time of a step
    gpu_utilization: float  # the p50
    device_memory_bytes: float  # the replayed estimate

    @staticmethod
    def from_prediction(prediction: JobPrediction) -> ColdStartInputs:
        """What the cold-start profiler predicted of the job (its replay's roofline and memory, its p50)."""
        analytical = prediction.analytical
        return ColdStartInputs(gpu_seconds=analytical.gpu_seconds_per_step,
                               host_seconds=analytical.host_seconds_per_step,
                               gpu_utilization=prediction.gpu_utilization.p50,
                               device_memory_bytes=analytical.device_memory_bytes)


def logit(u: np.ndarray) -> np.ndarray:
    """The logit of utilisation ``u`` (0-1), taken within 1-99 %."""
    u = np.clip(u, 0.01, 0.99)
    return np.log(u / (1 - u))


def first_second_features(first: Any, batch: int, precision: str, optimizer: str, host_stall_s: float = 0.0
                          ) -> list[float]:
    """The ``OBS_FEATURES`` of a job's NVML samples from its first second (``mem_used_bytes``,
    ``mem_total_bytes``, ``gpu_util_pct``; at least one row).

    ``host_stall_s``: seconds per step the job waits on the host (data loading, evaluation), as known.
    """
    mem = first["mem_used_bytes"].to_numpy(dtype=float)
    util = first["gpu_util_pct"].to_numpy(dtype=float) / 100
    return [np.log(mem[-1]), np.log(mem.max()), util.mean(), util[-1], float((util > 0).mean()),
            np.log(float(first["mem_total_bytes"].iloc[0])), np.log(batch), float(precision in BF16),
            float(precision == "fp16"), float(optimizer in TWO_STATE_OPTIMIZERS),
            # how far the job has got: its busiest sample, the last three, their rise over the earlier
            # ones, and when (share of the second) utilisation first passed 50 %
            util.max(), util[-3:].mean(), util[-3:].mean() - util[:-3].mean(),
            float(np.argmax(util > 0.5)) / len(util) if (util > 0.5).any() else 1.0, 1000.0 * host_stall_s]


def first_second(samples: Any) -> Any:
    """The rows of ``samples`` (``t_rel``: seconds since the job's first sample) in its first second;
    a ValueError if they do not cover it with at least 3 samples."""
    t = samples["t_rel"].to_numpy(dtype=float)
    first = samples[t <= FIRST_SECONDS]
    if len(first) < 3 or t.max() < 0.9 * FIRST_SECONDS:
        span = min(float(t.max()), FIRST_SECONDS) if len(t) else 0.0
        raise ValueError(f"job scale needs the job's first {FIRST_SECONDS:g} s of samples, at least 3 of them "
                         f"(it learnt from one every 0.1 s); got {len(first)} over {span:.2f} s")
    return first
