"""``dprobe simulate quota``: a cluster job log replayed through per-VC GPU quotas that a policy resets every
interval (:mod:`~dprobe.sim.quota.cluster`), summed up by :mod:`~dprobe.sim.quota.report`; the command in
:mod:`~dprobe.sim.quota.cli`. The policies are :mod:`dprobe.sim.policies`."""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "SimConfig": "dprobe.sim.quota.cluster",
    "SimResult": "dprobe.sim.quota.cluster",
    "simulate": "dprobe.sim.quota.cluster",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["SimConfig", "SimResult", "simulate"]

if TYPE_CHECKING:
    from dprobe.sim.quota.cluster import SimConfig, SimResult, simulate
