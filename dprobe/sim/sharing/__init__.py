"""``dprobe simulate sharing``: serving pods packed onto shared GPUs by policy and scored against what they
did afterwards (:mod:`~dprobe.sim.sharing.packing`), the policy's settings chosen by cross-validation
(:mod:`~dprobe.sim.sharing.cv`); tables and plots in :mod:`~dprobe.sim.sharing.report`, the command in
:mod:`~dprobe.sim.sharing.cli`. The planner itself is :mod:`dprobe.sharing`."""

from dprobe.sim.sharing.packing import SharingSettings, load_forecaster, pod_series, simulate_policies

__all__ = ["SharingSettings", "load_forecaster", "pod_series", "simulate_policies"]
