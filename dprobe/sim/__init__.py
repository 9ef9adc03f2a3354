"""Trace-driven cluster simulation: replay job logs through per-VC GPU quota policies.

:mod:`~dprobe.sim.jobs` loads a job log, :mod:`~dprobe.sim.policies` sets each virtual cluster's
quota (fixed, or through the scaler's policy on the load now or on a forecast),
:mod:`~dprobe.sim.cluster` runs the event simulation and :mod:`~dprobe.sim.report` sums it up.
With the cluster's GPUs fixed, :mod:`~dprobe.sim.fixed` moves quota between VCs
(:mod:`~dprobe.sim.quota_split`) under a scheduling policy within each VC (:mod:`~dprobe.sim.scheduling`),
summed up by :mod:`~dprobe.sim.fixed_report`.
"""

from dprobe.sim.cluster import SimConfig, SimResult, simulate
from dprobe.sim.fixed import FixedConfig, FixedResult, simulate_fixed
from dprobe.sim.jobs import JobTable, load_jobs
from dprobe.sim.policies import ForecastQuota, QuotaPolicy, ReactiveQuota, ScalerSettings, StaticQuota
from dprobe.sim.scheduling import Scheduling

__all__ = [
    "FixedConfig",
    "FixedResult",
    "ForecastQuota",
    "JobTable",
    "QuotaPolicy",
    "ReactiveQuota",
    "ScalerSettings",
    "Scheduling",
    "SimConfig",
    "SimResult",
    "StaticQuota",
    "load_jobs",
    "simulate",
    "simulate_fixed",
]
