"""Trace-driven cluster simulation: replay job logs through per-VC GPU quota policies.

:mod:`~dprobe.sim.jobs` loads a job log, :mod:`~dprobe.sim.policies` sets each virtual cluster's
quota (fixed, or through the scaler's policy on the load now or on a forecast),
:mod:`~dprobe.sim.cluster` runs the event simulation and :mod:`~dprobe.sim.report` sums it up.
"""

from dprobe.sim.cluster import SimConfig, SimResult, simulate
from dprobe.sim.jobs import JobTable, load_jobs
from dprobe.sim.policies import ForecastQuota, QuotaPolicy, ReactiveQuota, ScalerSettings, StaticQuota

__all__ = [
    "ForecastQuota",
    "JobTable",
    "QuotaPolicy",
    "ReactiveQuota",
    "ScalerSettings",
    "SimConfig",
    "SimResult",
    "StaticQuota",
    "load_jobs",
    "simulate",
]
