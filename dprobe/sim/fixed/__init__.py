"""``dprobe simulate fixed``: a cluster of fixed size (:mod:`~dprobe.sim.fixed.cluster`) whose GPUs are split
into VC quotas a policy may move (:mod:`~dprobe.sim.fixed.quota_split`), each VC's queue served by a
scheduling policy (:mod:`~dprobe.sim.fixed.scheduling`: fifo, sjf, qssf, tiresias, easy); summed up by
:mod:`~dprobe.sim.fixed.report`, the command in :mod:`~dprobe.sim.fixed.cli`."""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "FixedConfig": "dprobe.sim.fixed.cluster",
    "FixedResult": "dprobe.sim.fixed.cluster",
    "Scheduling": "dprobe.sim.fixed.scheduling",
    "simulate_fixed": "dprobe.sim.fixed.cluster",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["FixedConfig", "FixedResult", "Scheduling", "simulate_fixed"]

if TYPE_CHECKING:
    from dprobe.sim.fixed.cluster import FixedConfig, FixedResult, simulate_fixed
    from dprobe.sim.fixed.scheduling import Scheduling
