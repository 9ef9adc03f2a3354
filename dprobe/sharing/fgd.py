"""Fragmentation of shared GPUs and FGD (fragmentation gradient descent) scoring.

After Weng et al., *Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent* (USENIX ATC '23). For a task type ``m``, the fragment of a node is the part of its
unallocated GPU capacity that ``m`` cannot use: all of it when ``m`` does not fit on the node at all
(too little CPU, memory or GPU), otherwise the free share of each GPU too small for ``m`` (a fractional
task needs one GPU with at least its share free; a task of whole GPUs can use only fully free GPUs).
The expected fragmentation of a node under a workload, ``F_n(M) = sum_m p_m F_n(m)``, weighs the task
types by their popularity ``p_m``; FGD places each task where ``F`` grows least.

Tasks that ask for no GPU cannot use any GPU capacity whatever the placement: they add the same amount
to every candidate's score and are left out of the workload distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskTypes:
    """The workload distribution: ``gpus`` (whole GPUs, 0 for a fractional task), ``share`` (the share of
    one GPU a fractional task needs, 1 for a whole-GPU task), ``cpu`` (what it needs of the node's other
    resource, 0 if none) and popularity ``weight`` (summing to 1)."""

    gpus: np.ndarray
    share: np.ndarray
    cpu: np.ndarray
    weight: np.ndarray

    @classmethod
    def from_requests(cls, gpus: np.ndarray, share: np.ndarray, cpu: np.ndarray | None = None,
                      max_types: int = 64) -> TaskTypes:
        """The distribution of the requests (one row per task): types are distinct (``gpus``, ``share``)
        pairs, each with the median ``cpu`` of its tasks; tasks without GPUs are left out; the
        ``max_types`` most popular types are kept (weights renormalised)."""
        gpus = np.asarray(gpus, dtype=np.int64)
        share = np.asarray(share, dtype=np.float64)
        cpu = np.zeros(len(gpus)) if cpu is None else np.asarray(cpu, dtype=np.float64)
        keep = (gpus > 0) | ((share > 0) & (share < 1))
        if not keep.any():
            raise ValueError("the workload distribution needs at least one task that asks for GPU capacity")
        whole = (gpus[keep] > 1) | (share[keep] >= 1 - 1e-9)
        g = np.where(whole, gpus[keep], 0)
        s = np.where(whole, 1.0, share[keep])
        keys, inverse, counts = np.unique(np.stack([g, np.round(s * 1e6)], 1), axis=0, return_inverse=True,
                                          return_counts=True)
        inverse = inverse.ravel()
        order = np.argsort(-counts, kind="stable")[:max_types]
        kept_cpu = cpu[keep]
        med = np.array([np.median(kept_cpu[inverse == k]) for k in order])
        w = counts[order].astype(np.float64)
        return cls(gpus=keys[order, 0].astype(np.int64), share=keys[order, 1] / 1e6, cpu=med,
                   weight=w / w.sum())


def gpu_fragment_table(shares: np.ndarray, weights: np.ndarray | None = None, resolution: int = 1000) -> np.ndarray:
    """``table[r]``: the expected fragment of one GPU with ``r / resolution`` of it free when each GPU is its
    own node (no CPU, no multi-GPU tasks): ``r`` times the weight of the task shares above ``r``."""
    shares = np.asarray(shares, dtype=np.float64)
    w = np.ones(len(shares)) if weights is None else np.asarray(weights, dtype=np.float64)
    if not len(shares) or w.sum() <= 0:
        raise ValueError("the workload distribution needs at least one task share")
    order = np.argsort(shares)
    cum_above = w[order][::-1].cumsum()[::-1] / w.sum()  # weight of shares >= shares[order][k]
    r = np.arange(resolution + 1) / resolution
    k = np.searchsorted(shares[order], r + 1e-9, side="left")  # first share >= r (+eps): shares > r
    above = np.where(k < len(shares), cum_above[np.minimum(k, len(shares) - 1)], 0.0)
    return r * above


def node_fragmentation(free: np.ndarray, cpu_free: np.ndarray, types: TaskTypes) -> np.ndarray:
    """``F_n(M)`` of every node: ``free`` ``(N, G)`` free share of each GPU (NaN or 0 where the node has
    no such GPU), ``cpu_free`` ``(N,)``."""
    free = np.nan_to_num(np.asarray(free, dtype=np.float64))
    total = free.sum(1)
    out = np.zeros(len(free))
    for g, s, c, w in zip(types.gpus, types.share, types.cpu, types.weight, strict=True):
        cpu_ok = cpu_free + 1e-9 >= c
        if g == 0:
            fits = (free + 1e-9 >= s).any(1) & cpu_ok
            frag = np.where(free + 1e-9 < s, free, 0.0).sum(1)
        else:
            full = free >= 1 - 1e-9
            fits = (full.sum(1) >= g) & cpu_ok
            frag = np.where(full, 0.0, free).sum(1)
        out += w * np.where(fits, frag, total)
    return out


def placement_delta(free: np.ndarray, cpu_free: np.ndarray, nodes: np.ndarray, gpus: np.ndarray,
                    share: float, cpu: float, types: TaskTypes) -> np.ndarray:
    """The growth of ``F_n(M)`` if a fractional task (``share`` of one GPU, ``cpu``) went to GPU ``gpus[i]``
    of node ``nodes[i]``, for each candidate ``i`` (vectorised over candidates and types)."""
    f = np.nan_to_num(free[nodes])  # (C, G)
    before = node_fragmentation(f, cpu_free[nodes], types)
    after_free = f.copy()
    after_free[np.arange(len(nodes)), gpus] -= share
    after = node_fragmentation(np.maximum(after_free, 0.0), cpu_free[nodes] - cpu, types)
    return after - before
