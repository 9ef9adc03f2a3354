"""How each virtual cluster's GPU quota is set: fixed, reactive, or from a demand forecast.

``reactive`` and ``forecast`` run the scaler's own code (:mod:`dprobe.scaling.policy`): one
:class:`~dprobe.scaling.policy.Recommender` per VC, where a replica is one GPU of the VC's quota
and the demand is in GPUs (``target=1.0``). They differ only in the demand they feed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from dprobe.forecaster.base import QUANTILES, Forecaster, ForecastInput
from dprobe.forecaster.tasks import TaskSpec
from dprobe.scaling.policy import (
    DEFAULT_POLICY,
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    MIN_GPUS,
    SCALE_UP_PODS,
    Policy,
    Recommender,
)
from dprobe.sim.jobs import JobTable, sample_step_function, unconstrained_demand
from dprobe.sim.view import ClusterView

POLICY_NAMES: tuple[str, ...] = ("static", "reactive", "forecast")
BASELINE_NAME = "last_value"  # the forecaster without a checkpoint (conformal quantiles of its own errors)
BASELINE_RESIDUAL_DAYS = 2.0  # the baseline's quantiles come from its errors over this many trailing days


class QuotaPolicy:
    """Sets every VC's quota at each decision; ``max_gpus`` is the most it can ever set per VC."""

    name: str = "policy"
    history_step: float | None = None  # set: the simulator records a DemandHistory at this step
    max_gpus: np.ndarray

    def initial_quota(self) -> np.ndarray:
        raise NotImplementedError

    def decide(self, view: ClusterView) -> np.ndarray:
        """The quota each VC should have from now on (ints)."""
        raise NotImplementedError


class StaticQuota(QuotaPolicy):
    """A fixed quota per VC, never changed."""

    name = "static"

    def __init__(self, quota: np.ndarray) -> None:
        self.quota = np.asarray(quota, dtype=np.int64)
        self.max_gpus = self.quota

    def initial_quota(self) -> np.ndarray:
        return self.quota.copy()

    def decide(self, view: ClusterView) -> np.ndarray:
        return self.quota.copy()


def static_quotas(jobs: JobTable, percentile: float = 95.0, warmup_fraction: float = 0.25,
                  step_seconds: float = 600.0) -> np.ndarray:
    """Per VC, the ``percentile`` of its unconstrained demand (every job started at submission) over
    the first ``warmup_fraction`` of the log, sampled every ``step_seconds``, and at least the largest
    job submitted in that prefix: a quota chosen with hindsight on a warm-up prefix."""
    n_vcs = len(jobs.vc_names)
    quota = np.zeros(n_vcs, dtype=np.int64)
    if not len(jobs):
        return quota
    start, end = jobs.submit.min(), jobs.submit.max()
    warm_end = start + warmup_fraction * (end - start)
    grid = np.arange(start, max(warm_end, start + step_seconds), step_seconds)
    times, values = unconstrained_demand(jobs, n_vcs)
    for v in range(n_vcs):
        demand = sample_step_function(times[v], values[v], grid)
        in_warmup = (jobs.vc == v) & (jobs.submit <= warm_end)
        largest = int(jobs.gpus[in_warmup].max()) if in_warmup.any() else 0
        quota[v] = max(int(math.ceil(np.percentile(demand, percentile))), largest)
    return quota


@dataclass(frozen=True)
class ScalerSettings:
    """The scaler settings the simulation exposes; the rest are :class:`Policy`'s defaults."""

    margin: float = DEFAULT_POLICY.margin
    tolerance: float = DEFAULT_POLICY.tolerance
    min_gpus: int = MIN_GPUS
    scale_up_tolerance: float | None = DEFAULT_SCALE_UP.tolerance  # None: tolerance
    scale_down_tolerance: float | None = DEFAULT_SCALE_DOWN.tolerance
    scale_up_gpus: int = SCALE_UP_PODS  # a scale-up may add this many GPUs or double the quota, whichever is more
    configured: Policy | None = None  # a scaler config's GPU policy: replaces all of the above

    def base(self) -> Policy:
        """The policy before the per-VC cap: demand counted in GPUs, as jobs ask them (``target`` 1)."""
        if self.configured is not None:  # its rules as they are
            return replace(self.configured, target=1.0, fallback_replicas=None)
        up = tuple(replace(r, value=self.scale_up_gpus) if r.type == "pods" else r for r in DEFAULT_SCALE_UP.policies)
        return Policy(target=1.0, margin=self.margin, tolerance=self.tolerance, min_replicas=self.min_gpus,
                      max_replicas=max(self.min_gpus, 1 << 30),
                      scale_up=replace(DEFAULT_SCALE_UP, tolerance=self.scale_up_tolerance, policies=up),
                      scale_down=replace(DEFAULT_SCALE_DOWN, tolerance=self.scale_down_tolerance))

    def policy(self, max_gpus: int) -> Policy:
        """One VC's policy: at most ``max_gpus`` (and the base's own most)."""
        base = self.base()
        cap = min(base.max_replicas, max_gpus)
        return replace(base, min_replicas=min(base.min_replicas, cap), max_replicas=cap)


class RecommenderQuota(QuotaPolicy):
    """A quota per VC from the scaler's :class:`Recommender`, fed by :meth:`demand`."""

    def __init__(self, max_gpus: np.ndarray, settings: ScalerSettings) -> None:
        self.max_gpus = np.asarray(max_gpus, dtype=np.int64)
        self.policies = [settings.policy(int(m)) for m in self.max_gpus]
        self.recommenders = [Recommender(p) for p in self.policies]

    def initial_quota(self) -> np.ndarray:
        return np.array([p.min_replicas for p in self.policies], dtype=np.int64)

    def demand(self, view: ClusterView) -> np.ndarray:
        """GPUs per VC to provision for; NaN where there is none this time (the scaler holds)."""
        raise NotImplementedError

    def decide(self, view: ClusterView) -> np.ndarray:
        demand = self.demand(view)
        quota = np.empty(len(self.recommenders), dtype=np.int64)
        for v, rec in enumerate(self.recommenders):
            d = float(demand[v])
            quota[v] = rec.decide(view.now, d if math.isfinite(d) else None, int(view.quota[v])).replicas
        return quota


class ReactiveQuota(RecommenderQuota):
    """Demand is the load now: GPUs held by running jobs plus GPUs asked by queued ones (as the HPA)."""

    name = "reactive"

    def demand(self, view: ClusterView) -> np.ndarray:
        return view.demand.astype(np.float64)


class ForecastQuota(RecommenderQuota):
    """Demand is a quantile of the forecast ``lead_steps`` history steps ahead, all VCs in one batch."""

    name = "forecast"
    history_step: float  # always set

    def __init__(self, max_gpus: np.ndarray, settings: ScalerSettings, forecaster: Forecaster,
                 history_step: float, lead_steps: int, quantile: float, context_steps: int,
                 covariates: tuple[str, ...] = ()) -> None:
        super().__init__(max_gpus, settings)
        self.forecaster = forecaster
        self.history_step = float(history_step)
        self.lead_steps = int(lead_steps)
        self.quantile = quantile
        self.context_steps = int(context_steps)
        self.covariates = covariates  # history series the forecaster takes as covariates, in its order

    def demand(self, view: ClusterView) -> np.ndarray:
        if view.history is None or view.history.length == 0:
            return view.demand.astype(np.float64)  # nothing recorded yet: the load now
        window = view.history.window(self.context_steps)
        gaps = np.full_like(window["gpu_demand"], np.nan)  # a covariate the simulation does not record
        cov = np.stack([window.get(c, gaps) for c in self.covariates], axis=-1) if self.covariates else None
        batch = ForecastInput(values=window["gpu_demand"], metric="gpu_demand", leads=(self.lead_steps,),
                              step_seconds=self.history_step, covariates=cov)
        forecast = self.forecaster.predict(batch)
        levels = np.asarray(forecast.quantile_levels)
        k = int(np.argmin(np.abs(levels - self.quantile)))
        return np.clip(forecast.quantiles[:, 0, k], 0.0, None)


@runtime_checkable
class TaskForecaster(Protocol):
    """A trained forecaster: its tasks' steps, windows and leads (those of a checkpoint)."""

    def task_for(self, metric: str, step_seconds: float | None = None) -> tuple[int, TaskSpec, float]: ...

    def window_seconds(self, metric: str) -> float: ...

    def max_horizon_seconds(self, metric: str) -> float: ...


@dataclass
class ForecastSetup:
    """A forecaster and the sampling it needs: history step, lead (in history steps), context and covariates."""

    forecaster: Forecaster
    name: str
    history_step: float
    lead_steps: int
    context_steps: int
    covariates: tuple[str, ...]


def forecast_setup(checkpoint: str | Path | None, interval: float, horizon_seconds: float,
                   quantile: float) -> ForecastSetup:
    """The checkpoint's ``gpu_demand`` forecaster ``horizon_seconds`` ahead, sampled at its own step (or the
    decision interval, if finer), or without a checkpoint the last-value baseline with conformal quantiles."""
    from dprobe.forecaster.baselines import make_baseline
    from dprobe.forecaster.loading import open_forecaster

    levels = QUANTILES
    residual_window = 0  # the baseline's
    model: Forecaster
    if checkpoint:
        loaded = open_forecaster(checkpoint, metrics=("gpu_demand",))
        model = loaded.forecaster
        if not isinstance(model, TaskForecaster):
            raise ValueError(f"checkpoint {checkpoint}: a {loaded.kind} model, which has no tasks to sample "
                             "gpu_demand at")
        _, spec, _ = model.task_for("gpu_demand")
        levels = tuple(getattr(model, "quantile_levels", QUANTILES))
        step = min(interval, spec.step_seconds)
        longest = model.max_horizon_seconds("gpu_demand")
        if horizon_seconds > longest * 1.0001:
            raise ValueError(f"--horizon-seconds {horizon_seconds:g} is beyond the checkpoint's longest gpu_demand horizon "
                             f"({longest:g} s)")
        context = int(math.ceil(model.window_seconds("gpu_demand") / step))
        name, covariates = f"{loaded.kind} ({checkpoint})", tuple(spec.covariates)
    else:
        baseline = make_baseline(BASELINE_NAME)
        step = interval
        residual_window = max(10, int(round(BASELINE_RESIDUAL_DAYS * 86400 / step)))
        baseline.residual_window = residual_window
        model = baseline
        context = 0  # set below, once the lead in steps is known
        name, covariates = f"baseline:{BASELINE_NAME} (conformal quantiles)", ()
    if not any(math.isclose(quantile, q) for q in levels):
        raise ValueError(f"--quantile must be one of the forecast's levels {', '.join(map(str, levels))}, "
                         f"got {quantile:g}")
    lead_steps = max(1, int(math.ceil(horizon_seconds / step - 1e-9)))
    if not checkpoint:
        context = residual_window + lead_steps
    return ForecastSetup(model, name, step, lead_steps, context, covariates)
