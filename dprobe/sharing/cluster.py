"""Placing GPU-sharing pods on the nodes of a cluster, one by one as they arrive (the OpenB layout).

A node has GPUs (each with a free share from 0 to 1), CPU and host memory. A pod asks for CPU, memory and
either a share of one GPU (``gpu_milli`` / 1000 of one GPU, ``num_gpu`` 1), several whole GPUs, or none.
Pods never leave (the trace is replayed as an arrival sequence, as in the FGD paper's experiments); a pod
that fits nowhere is counted as not placed and the next one is tried.

Policies: ``first-fit`` (first node in the list, first GPU on it), ``best-fit`` (the node, then the GPU,
left with the least free GPU capacity), ``fgd`` (the paper's node-level fragmentation gradient descent,
:mod:`dprobe.sharing.fgd`: the candidate whose expected fragmentation grows least, the fuller GPU among
equals, then the first node) and ``frag-aware`` (FGD's score, packing among equals: the fuller GPU,
then the fuller node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dprobe.sharing.fgd import TaskTypes, node_fragmentation, placement_delta

CLUSTER_POLICIES = ("first-fit", "best-fit", "frag-aware", "fgd")
EPS = 1e-9


@dataclass
class Nodes:
    """Node capacities: ``gpus`` per node, ``cpu`` and ``memory`` (any unit, the pods' unit), ``model``."""

    names: list[str]
    gpus: np.ndarray
    cpu: np.ndarray
    memory: np.ndarray
    model: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for what in ("gpus", "cpu", "memory"):
            v = np.asarray(getattr(self, what), dtype=np.float64)
            if len(v) != len(self.names) or not np.all(np.isfinite(v)) or (v < 0).any():
                raise ValueError(f"nodes: {what} must be one number >= 0 per node")
        self.gpus = np.asarray(self.gpus, dtype=np.int64)


@dataclass
class Pods:
    """Pod requests in arrival order: ``num_gpu`` (0, 1 with a ``share`` < 1, or whole GPUs), ``share``
    (of one GPU, 0-1), ``cpu``, ``memory``, ``gpu_spec`` (allowed GPU models, empty: any)."""

    names: list[str]
    num_gpu: np.ndarray
    share: np.ndarray
    cpu: np.ndarray
    memory: np.ndarray
    gpu_spec: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_gpu = np.asarray(self.num_gpu, dtype=np.int64)
        self.share = np.asarray(self.share, dtype=np.float64)
        if ((self.share < 0) | (self.share > 1) | ~np.isfinite(self.share)).any():
            raise ValueError("pods: a GPU share (gpu_milli / 1000) must be between 0 and 1")
        if (self.num_gpu < 0).any():
            raise ValueError("pods: num_gpu must be >= 0")
        bad = (self.num_gpu > 1) & (self.share < 1 - EPS)
        if bad.any():
            raise ValueError(f"pods: {self.names[int(np.argmax(bad))]} asks for several GPUs with a share "
                             "below one each; only a single GPU can be shared")

    def __len__(self) -> int:
        return len(self.names)

    def gpu_demand(self) -> np.ndarray:
        """GPUs each pod asks for (a share for a fractional pod)."""
        return np.where(self.num_gpu >= 1, np.where(self.num_gpu == 1, self.share, self.num_gpu), 0.0)


@dataclass
class ClusterResult:
    """What one policy did: per pod the node (-1: not placed) and GPU (-1: whole GPUs or none), and the
    cluster's state after every pod."""

    policy: str
    node: np.ndarray
    gpu: np.ndarray
    allocated: np.ndarray  # GPU capacity allocated after each arrival (GPUs)
    fragmented: np.ndarray  # expected fragmented GPU capacity after each arrival (GPUs)
    capacity: float

    @property
    def placed(self) -> np.ndarray:
        return self.node >= 0


class ClusterState:
    """Free GPU shares ``(N, G)`` (NaN beyond a node's GPUs), free CPU and memory per node."""

    def __init__(self, nodes: Nodes) -> None:
        width = max(1, int(nodes.gpus.max(initial=0)))
        self.free = np.where(np.arange(width)[None, :] < nodes.gpus[:, None], 1.0, np.nan)
        self.cpu = np.asarray(nodes.cpu, dtype=np.float64).copy()
        self.memory = np.asarray(nodes.memory, dtype=np.float64).copy()

    def free_gpu(self) -> np.ndarray:
        return np.nansum(self.free, 1)


def _spec_mask(nodes: Nodes, spec: str) -> np.ndarray | None:
    if not spec:
        return None
    allowed = {s.strip() for s in spec.split("|") if s.strip()}
    return np.array([m in allowed for m in nodes.model])


def place_all(nodes: Nodes, pods: Pods, policy: str, types: TaskTypes | None = None) -> ClusterResult:
    """Place ``pods`` in order under ``policy``; ``types`` (the workload distribution that frag-aware and
    fgd score against) defaults to the pods' own."""
    if policy not in CLUSTER_POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; choose from {', '.join(CLUSTER_POLICIES)}")
    if types is None:
        types = TaskTypes.from_requests(pods.num_gpu, pods.share, pods.cpu)
    state = ClusterState(nodes)
    n = len(pods)
    node_of = np.full(n, -1, dtype=np.int64)
    gpu_of = np.full(n, -1, dtype=np.int64)
    allocated = np.zeros(n)
    fragmented = np.zeros(n)
    capacity = float(nodes.gpus.sum())
    frag_now = node_fragmentation(state.free, state.cpu, types)
    used = 0.0
    specs = pods.gpu_spec or [""] * n
    for i in range(n):
        k, share, cpu, mem = int(pods.num_gpu[i]), float(pods.share[i]), float(pods.cpu[i]), float(pods.memory[i])
        ok = (state.cpu + EPS >= cpu) & (state.memory + EPS >= mem)
        mask = _spec_mask(nodes, specs[i])
        if mask is not None:
            ok &= mask
        choice = _choose(state, ok, k, share, cpu, policy, types)
        if choice is not None:
            nd, g = choice
            state.cpu[nd] -= cpu
            state.memory[nd] -= mem
            if k == 1 and share < 1 - EPS:
                state.free[nd, g] -= share
                used += share
            elif k >= 1:
                full = np.flatnonzero(state.free[nd] >= 1 - EPS)[:k]
                state.free[nd, full] = 0.0
                used += k
                g = -1
            node_of[i], gpu_of[i] = nd, g
            frag_now[nd] = node_fragmentation(state.free[nd:nd + 1], state.cpu[nd:nd + 1], types)[0]
        allocated[i] = used
        fragmented[i] = frag_now.sum()
    return ClusterResult(policy, node_of, gpu_of, allocated, fragmented, capacity)


def _choose(state: ClusterState, ok: np.ndarray, k: int, share: float, cpu: float, policy: str,
            types: TaskTypes) -> tuple[int, int] | None:
    free = state.free
    if k == 0 or (k == 1 and share >= 1 - EPS) or k > 1:
        need = max(k, 0)
        full = (free >= 1 - EPS).sum(1)
        cand = np.flatnonzero(ok & (full >= need))
        if not len(cand):
            return None
        if policy == "first-fit":
            return int(cand[0]), -1
        left = np.nansum(free[cand], 1) - need
        if policy == "best-fit":
            return int(cand[np.lexsort((state.cpu[cand], left))[0]]), -1
        after = np.nan_to_num(free[cand]).copy()
        for row, nd in enumerate(cand):  # the first `need` fully free GPUs of each candidate
            after[row, np.flatnonzero(free[nd] >= 1 - EPS)[:need]] = 0.0
        delta = (node_fragmentation(after, state.cpu[cand] - cpu, types)
                 - node_fragmentation(free[cand], state.cpu[cand], types))
        return int(cand[np.lexsort((left, delta))[0]]), -1
    fits = (np.nan_to_num(free, nan=-1.0) + EPS >= share) & ok[:, None]
    nodes, gpus = np.nonzero(fits)
    if not len(nodes):
        return None
    if policy == "first-fit":
        return int(nodes[0]), int(gpus[0])
    left_gpu = free[nodes, gpus] - share
    left_node = np.nansum(free[nodes], 1) - share
    if policy == "best-fit":
        j = np.lexsort((left_gpu, left_node))[0]
        return int(nodes[j]), int(gpus[j])
    # fgd and frag-aware: one candidate per distinct (node state, free share of the GPU), equal states
    # scoring the same
    key = np.column_stack([np.nan_to_num(free[nodes], nan=-1.0), state.cpu[nodes], free[nodes, gpus]])
    _, first = np.unique(np.round(key, 6), axis=0, return_index=True)
    first = np.sort(first)
    delta = placement_delta(free, state.cpu, nodes[first], gpus[first], share, cpu, types)
    if policy == "frag-aware":  # FGD's score; among equal scores the fuller GPU, then the fuller node
        j = first[np.lexsort((left_node[first], left_gpu[first], np.round(delta, 9)))[0]]
    else:  # fgd: among equal scores the fuller GPU
        j = first[np.lexsort((left_gpu[first], np.round(delta, 9)))[0]]
    return int(nodes[j]), int(gpus[j])


def summary(result: ClusterResult, pods: Pods, checkpoints: tuple[float, ...] = (0.8, 0.9, 1.0)) -> dict:
    """Placement rate and fragmentation: overall, and when the GPU capacity asked by the arrivals so far
    first reaches each share of the cluster's ``checkpoints``."""
    demand = pods.gpu_demand()
    asked = np.cumsum(demand)
    placed = result.placed
    gpu_pods = demand > 0
    row: dict[str, Any] = {
        "policy": result.policy,
        "pods": len(pods),
        "pods_placed": int(placed.sum()),
        "pods_not_placed": int((~placed).sum()),
        "gpu_pods_not_placed": int((~placed & gpu_pods).sum()),
        "gpu_requested": float(demand.sum()),
        "gpu_placed": float(demand[placed].sum()),
        "capacity_gpus": result.capacity,
        "allocated_share": float(result.allocated[-1] / result.capacity) if len(pods) else 0.0,
        "fragmented_gpus": float(result.fragmented[-1]) if len(pods) else 0.0,
        "unallocated_gpus": float(result.capacity - result.allocated[-1]) if len(pods) else result.capacity,
        "first_failure": int(np.argmax(~placed & gpu_pods)) if (~placed & gpu_pods).any() else None,
        "at": [],
    }
    for c in checkpoints:
        i = int(np.searchsorted(asked, c * result.capacity - EPS))
        i = min(i, len(pods) - 1)
        row["at"].append({"asked_share": c, "pod": i, "placed_share": float(demand[: i + 1][placed[: i + 1]].sum()
                                                                            / max(asked[i], EPS)),
                          "allocated_share": float(result.allocated[i] / result.capacity),
                          "fragmented_share": float(result.fragmented[i] / result.capacity)})
    return row
