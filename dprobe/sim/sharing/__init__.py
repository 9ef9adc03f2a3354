"""``dprobe simulate sharing``: serving pods packed onto shared GPUs by policy and scored against what they
did afterwards (:mod:`~dprobe.sim.sharing.packing`, its settings in :mod:`~dprobe.sim.sharing.settings`), the
policy's settings chosen by cross-validation (:mod:`~dprobe.sim.sharing.cv`); tables and plots in
:mod:`~dprobe.sim.sharing.report`, the command in :mod:`~dprobe.sim.sharing.cli`. The planner itself is
:mod:`dprobe.sharing`."""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "SharingSettings": "dprobe.sim.sharing.settings",
    "load_forecaster": "dprobe.sim.sharing.packing",
    "pod_series": "dprobe.sim.sharing.packing",
    "simulate_policies": "dprobe.sim.sharing.packing",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["SharingSettings", "load_forecaster", "pod_series", "simulate_policies"]

if TYPE_CHECKING:
    from dprobe.sim.sharing.packing import load_forecaster, pod_series, simulate_policies
    from dprobe.sim.sharing.settings import SharingSettings
