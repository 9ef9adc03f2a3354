"""Step time of synchronous data-parallel training (DistributedDataParallel, NCCL ring all-reduce).

A step is the single-GPU step at the per-GPU batch, ``S``, plus the part of the gradient all-reduce that
backward does not hide, plus the wait for the slowest replica:

- ring all-reduce of ``G`` gradient bytes over ``N`` GPUs moves ``2 (N - 1) / N * G`` bytes over the
  slowest link: inside the node on one node (``intra_bandwidth``), the network between nodes otherwise
  (``inter_bandwidth``), which the GPUs of the busiest node share (``per_gpu_on_node`` for each GPU beyond
  the first); a ring over exactly two nodes is ``two_node_penalty`` slower (measured on one cluster, see
  docs/graph-and-coldstart.md); that is ``T``;
- gradient buckets are reduced while backward still runs: of ``T``, ``T * (tail + (1 - tail) *
  exp(-overlap * W * S / T))`` is exposed, where ``W`` is the model's backward window (:mod:`.timeline`:
  the share of backward left to run once a gradient byte is ready; 0.5 when gradients spread evenly);
- replicas finish backward at different times: ``straggler * S * ln N`` across nodes,
  ``straggler_intra * S * ln N`` on one node.

The bandwidths and stragglers describe one cluster (:mod:`.fit` learns them for each measured cluster and
derives those of others from their links, :mod:`.interconnect`); ``per_gpu_on_node``, ``overlap`` and
``tail`` describe DistributedDataParallel and are shared. The model enters through ``S``, ``G`` and ``W``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from dprobe.profiling.dataparallel.interconnect import MEASURED, measured_links
from dprobe.profiling.dataparallel.placement import Placement
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW


@dataclass(frozen=True)
class ClusterParams:
    """What the model needs of one cluster (bytes per second, fractions)."""

    intra_bandwidth: float  # bytes/s a ring link inside a node reaches
    inter_bandwidth: float  # bytes/s a ring link between nodes reaches
    per_gpu_on_node: float  # slowdown of the inter-node ring per GPU beyond the first on the busiest node
    two_node_penalty: float  # extra slowdown of a ring over exactly two nodes
    overlap: float  # all-reduce seconds hidden, per second of single-GPU step and unit of backward window
    tail: float  # share of the all-reduce never hidden (the last bucket)
    straggler: float  # wait for the slowest replica across nodes, per second of step and unit of ln N
    straggler_intra: float  # the same on one node

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ClusterParams:
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"data-parallel parameters lack {', '.join(missing)}")
        return cls(**{n: float(values[n]) for n in names})


PARAM_NAMES = tuple(f.name for f in fields(ClusterParams))
SHARED = ("per_gpu_on_node", "overlap", "tail")  # how DistributedDataParallel behaves, on any cluster
PER_CLUSTER = tuple(n for n in PARAM_NAMES if n not in SHARED)

# how much of a traced backward window to trust: the window used is WINDOW_BLEND x traced + the rest x 0.5,
# chosen leave-one-model-out over 0, 0.5 and 1 (benchmarks/dataparallel.py --window-blend)
WINDOW_BLEND = 0.5


class Fitted:
    """Fitted parameters: the shared ones, those of each measured cluster, the window blend."""

    def __init__(self, shared: dict[str, float], clusters: dict[str, dict[str, float]],
                 window_blend: float = WINDOW_BLEND) -> None:
        self.shared, self.clusters, self.window_blend = shared, clusters, window_blend

    def params(self, cluster: str) -> ClusterParams:
        """The parameters of a measured cluster."""
        if cluster not in self.clusters:
            raise ValueError(f"no fitted parameters for cluster {cluster!r} (fitted: {', '.join(self.clusters)})")
        return ClusterParams(**self.shared, **self.clusters[cluster])

    def window(self, traced: np.ndarray | float) -> np.ndarray:
        """The backward window the model uses for a traced one."""
        return self.window_blend * np.asarray(traced, dtype=np.float64) + (1.0 - self.window_blend) * UNIFORM_WINDOW

    def as_dict(self) -> dict[str, Any]:
        sig = lambda v: float(f"{v:.6g}")  # noqa: E731
        return {"shared": {k: sig(v) for k, v in self.shared.items()},
                "clusters": {c: {k: sig(v) for k, v in p.items()} for c, p in self.clusters.items()},
                "window_blend": self.window_blend}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Fitted:
        return cls(dict(values["shared"]), {c: dict(p) for c, p in values["clusters"].items()},
                   float(values["window_blend"]))


def unseen_cluster(fitted: Fitted) -> dict[str, float]:
    """What a cluster never measured gets: the median efficiency (reached over nominal bandwidth) of the
    measured clusters' intra- and inter-node links, and their median two-node penalty and stragglers."""
    known = [c for c in fitted.clusters if c in MEASURED]
    if not known:
        raise ValueError("no measured cluster with known links to derive an unseen cluster from")
    eff: dict[str, list[float]] = {"intra": [], "inter": []}
    for c in known:
        intra, inter = measured_links(c)
        eff["intra"].append(fitted.clusters[c]["intra_bandwidth"] / intra.bandwidth)
        eff["inter"].append(fitted.clusters[c]["inter_bandwidth"] / inter.bandwidth)
    med = lambda name: float(np.median([fitted.clusters[c][name] for c in known]))  # noqa: E731
    return {"intra_efficiency": float(np.median(eff["intra"])), "inter_efficiency": float(np.median(eff["inter"])),
            "two_node_penalty": med("two_node_penalty"), "straggler": med("straggler"),
            "straggler_intra": med("straggler_intra")}


def comm_seconds(params: ClusterParams, grad_bytes: np.ndarray, gpus: np.ndarray, nodes: np.ndarray,
                 busiest: np.ndarray) -> np.ndarray:
    """Seconds of one ring all-reduce of ``grad_bytes`` (0 on one GPU)."""
    g, n, m, k = (np.asarray(a, dtype=np.float64) for a in (grad_bytes, gpus, nodes, busiest))
    moved = 2.0 * (n - 1.0) / np.maximum(n, 1.0) * g
    intra = moved / params.intra_bandwidth
    share = (1.0 + params.per_gpu_on_node * (k - 1.0)) * (1.0 + params.two_node_penalty * (m == 2))
    inter = moved / params.inter_bandwidth * share
    return np.where(n <= 1, 0.0, np.where(m > 1, inter, intra))


def sync_seconds(params: ClusterParams, single_step: np.ndarray, grad_bytes: np.ndarray, gpus: np.ndarray,
                 nodes: np.ndarray, busiest: np.ndarray, window: np.ndarray | float = UNIFORM_WINDOW) -> np.ndarray:
    """Seconds a step waits on the gradient all-reduce after its own backward ends (what PyTorch's
    profiler and Pollux's ``sync_time`` call synchronisation), on top of ``single_step``; ``window``: the
    model's backward window (:func:`~.timeline.backward_window`)."""
    s = np.asarray(single_step, dtype=np.float64)
    w = np.asarray(window, dtype=np.float64)
    t = comm_seconds(params, grad_bytes, gpus, nodes, busiest)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        hidden = np.where(t > 0, np.exp(-params.overlap * w * s / np.where(t > 0, t, 1.0)), 0.0)
    exposed = t * (params.tail + (1.0 - params.tail) * hidden)
    n = np.asarray(gpus, dtype=np.float64)
    straggler = np.where(np.asarray(nodes) > 1, params.straggler, params.straggler_intra)
    return exposed + straggler * s * np.log(np.maximum(n, 1.0))


def step_seconds(params: ClusterParams, single_step: float, grad_bytes: float, where: Placement,
                 window: float = UNIFORM_WINDOW) -> tuple[float, float]:
    """(step seconds, of which synchronisation) of one data-parallel step at ``where``."""
    sync = float(sync_seconds(params, np.array([single_step]), np.array([grad_bytes]), np.array([where.gpus]),
                              np.array([where.nodes]), np.array([where.busiest]), window)[0])
    if not math.isfinite(sync):
        raise ValueError("data-parallel step time is not finite: check --step-time and --params")
    return single_step + sync, sync
