"""``dprobe simulate quota``: a cluster job log replayed through per-VC GPU quotas that a policy resets every
interval (:mod:`~dprobe.sim.quota.cluster`), summed up by :mod:`~dprobe.sim.quota.report`; the command in
:mod:`~dprobe.sim.quota.cli`. The policies are :mod:`dprobe.sim.policies`."""

from dprobe.sim.quota.cluster import SimConfig, SimResult, simulate

__all__ = ["SimConfig", "SimResult", "simulate"]
