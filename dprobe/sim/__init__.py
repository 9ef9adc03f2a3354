"""Trace-driven cluster simulation (``dprobe simulate``): one subpackage per simulator.

- :mod:`~dprobe.sim.quota`: a job log replayed through per-VC GPU quotas a policy resets every interval
  (``dprobe simulate quota``): :mod:`~dprobe.sim.quota.cluster` runs the event simulation,
  :mod:`~dprobe.sim.quota.report` sums it up.
- :mod:`~dprobe.sim.fixed`: the same logs on a cluster of fixed size (``dprobe simulate fixed``):
  :mod:`~dprobe.sim.fixed.cluster` moves quota between VCs (:mod:`~dprobe.sim.fixed.quota_split`) under a
  scheduling policy within each VC (:mod:`~dprobe.sim.fixed.scheduling`), summed up by
  :mod:`~dprobe.sim.fixed.report`.
- :mod:`~dprobe.sim.sharing`: serving pods packed onto shared GPUs by policy (``dprobe simulate sharing``):
  :mod:`~dprobe.sim.sharing.packing`, its cross-validation (:mod:`~dprobe.sim.sharing.cv`) and report.

What they share sits here: :mod:`~dprobe.sim.jobs` loads a job log (:mod:`~dprobe.sim.helios_jobs` derives
one from per-minute counts), :mod:`~dprobe.sim.policies` sets quotas through the scaler's policy on the load
now or on a forecast, :mod:`~dprobe.sim.view` is what a policy sees, :mod:`~dprobe.sim.replay` the span
check and progress bar of the replays, :mod:`~dprobe.sim.report` and :mod:`~dprobe.sim.options` the report
and option helpers, and :mod:`~dprobe.sim.cli` the ``dprobe simulate`` command.
"""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "FixedConfig": "dprobe.sim.fixed.cluster",
    "FixedResult": "dprobe.sim.fixed.cluster",
    "ForecastQuota": "dprobe.sim.policies",
    "JobTable": "dprobe.sim.jobs",
    "QuotaPolicy": "dprobe.sim.policies",
    "ReactiveQuota": "dprobe.sim.policies",
    "ScalerSettings": "dprobe.sim.policies",
    "Scheduling": "dprobe.sim.fixed.scheduling",
    "SimConfig": "dprobe.sim.quota.cluster",
    "SimResult": "dprobe.sim.quota.cluster",
    "StaticQuota": "dprobe.sim.policies",
    "load_jobs": "dprobe.sim.jobs",
    "simulate": "dprobe.sim.quota.cluster",
    "simulate_fixed": "dprobe.sim.fixed.cluster",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "FixedConfig", "FixedResult", "ForecastQuota", "JobTable", "QuotaPolicy", "ReactiveQuota",
    "ScalerSettings", "Scheduling", "SimConfig", "SimResult", "StaticQuota", "load_jobs", "simulate",
    "simulate_fixed",
]

if TYPE_CHECKING:
    from dprobe.sim.fixed.cluster import FixedConfig, FixedResult, simulate_fixed
    from dprobe.sim.fixed.scheduling import Scheduling
    from dprobe.sim.jobs import JobTable, load_jobs
    from dprobe.sim.policies import ForecastQuota, QuotaPolicy, ReactiveQuota, ScalerSettings, StaticQuota
    from dprobe.sim.quota.cluster import SimConfig, SimResult, simulate
