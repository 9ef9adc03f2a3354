"""How a fixed number of GPUs is split into VC quotas (:mod:`dprobe.sim.fixed`): static shares, lending,
or the scaler's per-VC targets on a demand forecast normalised to the total.

The forecast policy reuses :class:`dprobe.sim.policies.ForecastQuota`, so its targets come from the
scaler's own :class:`~dprobe.scaling.policy.Recommender` per VC, as in the elastic simulation.
"""

from __future__ import annotations

import numpy as np

from dprobe.sim.jobs import JobTable
from dprobe.sim.policies import RecommenderQuota
from dprobe.sim.view import ClusterView


def split_total(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` GPUs in proportion to ``weights`` (largest remainders; equal shares if all are 0)."""
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    if not len(w):
        return np.zeros(0, dtype=np.int64)
    if w.sum() <= 0:
        w = np.ones_like(w)
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    left = int(total - out.sum())
    if left > 0:
        order = np.lexsort((np.arange(len(w)), -(exact - out)))  # largest remainder, then first VC
        out[order[:left]] += 1
    return out


def first_half_gpu_time(jobs: JobTable, warmup_fraction: float = 0.5) -> np.ndarray:
    """Per VC, the GPU-seconds its jobs would use in the first ``warmup_fraction`` of the log's span of
    submissions, were each started at submission."""
    n_vcs = len(jobs.vc_names)
    if not len(jobs):
        return np.zeros(n_vcs)
    start, end = float(jobs.submit[0]), float(jobs.submit[-1])
    cut = start + warmup_fraction * max(end - start, 1.0)
    overlap = np.clip(np.minimum(jobs.submit + jobs.duration, cut) - jobs.submit, 0.0, None)
    return np.bincount(jobs.vc, weights=overlap * jobs.gpus, minlength=n_vcs)


def static_shares(jobs: JobTable, total: int, warmup_fraction: float = 0.5) -> np.ndarray:
    """The static quotas: ``total`` split in proportion to :func:`first_half_gpu_time`."""
    return split_total(total, first_half_gpu_time(jobs, warmup_fraction))


class FixedQuotaPolicy:
    """Sets the VC quotas of a fixed cluster; they always sum to ``total``."""

    name = "policy"
    lending = False  # idle GPUs may be lent to other VCs
    history_step: float | None = None  # set: the simulator records a DemandHistory at this step

    def __init__(self, shares: np.ndarray) -> None:
        self.shares = np.asarray(shares, dtype=np.int64)
        self.total = int(self.shares.sum())

    def initial_quota(self) -> np.ndarray:
        return self.shares.copy()

    def most_gpus(self) -> np.ndarray:
        """The most GPUs each VC's jobs can ever hold (its quota, or with lending the whole cluster)."""
        return self.shares.copy()

    def decide(self, view: ClusterView) -> np.ndarray | None:
        """New quotas (summing to the total), or None to keep them."""
        return None


class StaticShares(FixedQuotaPolicy):
    """Fixed quotas, never lent: each VC runs on its own share."""

    name = "static"


class Lending(FixedQuotaPolicy):
    """Fixed quotas, but GPUs a VC leaves idle (after the lending delay) run other VCs' jobs."""

    name = "reactive"
    lending = True

    def most_gpus(self) -> np.ndarray:
        return np.full(len(self.shares), self.total, dtype=np.int64)


class ForecastShares(Lending):
    """Quotas moved every decision: per VC, the scaler's target on the forecast demand (``inner``), and never
    less than the VC asks now (GPUs held + queued, up to its ``max_gpus``), normalised to the total. Spare GPUs
    (wants summing to less) go out in proportion to the static shares; wants summing to more are scaled down
    in proportion. Each VC's recommender is told the quota actually set."""

    name = "forecast"

    def __init__(self, shares: np.ndarray, inner: RecommenderQuota) -> None:
        super().__init__(shares)
        self.inner = inner
        self.history_step = inner.history_step

    def decide(self, view: ClusterView) -> np.ndarray:
        targets = np.asarray(self.inner.decide(view), dtype=np.int64)
        quota = normalise(wants(targets, view.demand, self.inner.max_gpus), self.total, self.shares)
        for v, rec in enumerate(self.inner.recommenders):
            rec.applied(view.now, int(targets[v]), int(quota[v]))
        return quota


def wants(targets: np.ndarray, demand_now: np.ndarray, max_gpus: np.ndarray) -> np.ndarray:
    """What each VC is planned for: the forecast target, or what it asks now if more (queued jobs are certain
    demand; the scaler's step limits are for GPUs that take time to come up, not for GPUs that exist), at most
    its ``max_gpus``; never below the target."""
    now = np.minimum(np.asarray(demand_now, dtype=np.int64), max_gpus)
    return np.maximum(np.asarray(targets, dtype=np.int64), now)


def normalise(targets: np.ndarray, total: int, shares: np.ndarray) -> np.ndarray:
    """Per-VC targets made to sum to ``total``: scaled down in proportion when they ask for more, topped up
    with the spare GPUs split as ``shares`` when they ask for less."""
    targets = np.clip(np.asarray(targets, dtype=np.int64), 0, None)
    asked = int(targets.sum())
    if asked >= total:
        return split_total(total, targets)
    return targets + split_total(total - asked, shares)
