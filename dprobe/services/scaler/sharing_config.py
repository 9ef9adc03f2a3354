"""The scaler's ``sharing:`` options, checked: the GPUs shared (memory, MIG profiles), how a workload's
memory and utilisation forecasts become its share, and the packing policy.

In a config file::

    sharing:
      enabled: true
      mode: mig                    # time-slicing | mps | mig
      gpu_model: H100-80GB         # or gpu_memory_bytes: 80e9 (time-slicing, mps)
      memory_quantile: 0.99        # hard: the share holds this quantile of the memory forecast ...
      memory_margin: 0.15          # ... plus this margin
      utilization_quantile: 0.9    # soft: packed so that a GPU's summed utilisation stays under the target
      utilization_target: 0.9
      mig_profiles: 1g.10gb,3g.40gb,7g.80gb
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dprobe.core.names import QUANTILES
from dprobe.sharing.mig import GpuModel, MigProfile, gpu_model
from dprobe.sharing.planner import PLANNER_POLICIES

SHARING_MODES = ("time-slicing", "mps", "mig")


@dataclass(frozen=True)
class SharingSettings:
    """What the share computation needs, from the ``sharing_*`` options."""

    mode: str
    gpu: GpuModel  # memory of one GPU and, for mode mig, its profiles
    memory_quantile: float
    memory_margin: float
    utilization_quantile: float
    utilization_target: float
    policy: str
    mig_profiles: tuple[MigProfile, ...]  # mode mig: the profiles a workload may get, smallest first
    stabilization_seconds: float

    @property
    def capacity(self) -> float:
        """Memory of one GPU (bytes)."""
        return self.gpu.memory_bytes

    @staticmethod
    def from_config(config: Any) -> SharingSettings:
        """The ``sharing_*`` options of a :class:`~dprobe.services.scaler.config.ScalerConfig`; a
        :class:`ValueError` naming the option for anything missing or wrong."""
        if config.sharing_mode not in SHARING_MODES:
            raise ValueError(f"sharing_mode must be one of {', '.join(SHARING_MODES)}, got {config.sharing_mode!r}")
        if config.sharing_policy not in PLANNER_POLICIES:
            raise ValueError(f"sharing_policy must be one of {', '.join(PLANNER_POLICIES)}, "
                             f"got {config.sharing_policy!r}")
        memory = config.sharing_gpu_memory_bytes
        if not (math.isfinite(memory) and memory >= 0):
            raise ValueError(f"sharing_gpu_memory_bytes must be a positive number of bytes, got {memory!r}")
        if config.sharing_gpu_model:
            try:
                model = gpu_model(config.sharing_gpu_model)
            except ValueError as exc:
                raise ValueError(f"sharing_gpu_model: {exc}") from None
            if memory and abs(memory - model.memory_bytes) > 0.01 * model.memory_bytes:
                raise ValueError(f"sharing_gpu_memory_bytes {memory:g} contradicts sharing_gpu_model "
                                 f"{model.name} ({model.memory_bytes:g} bytes): give one of them")
        elif memory > 0:
            model = GpuModel(f"{memory / 1e9:g}GB", float(memory))
        else:
            raise ValueError("sharing is enabled without the GPUs' memory: set sharing_gpu_model (e.g. H100-80GB) "
                             "or sharing_gpu_memory_bytes")
        for name in ("sharing_memory_quantile", "sharing_utilization_quantile"):
            if getattr(config, name) not in QUANTILES:
                raise ValueError(f"{name} must be one the sidecars export ({', '.join(f'{q:g}' for q in QUANTILES)}), "
                                 f"got {getattr(config, name)!r}")
        if not (math.isfinite(config.sharing_memory_margin) and 0 <= config.sharing_memory_margin <= 1):
            raise ValueError(f"sharing_memory_margin must be between 0 and 1, got {config.sharing_memory_margin!r}")
        if not 0 < config.sharing_utilization_target <= 1:
            raise ValueError(f"sharing_utilization_target must be in (0, 1], got {config.sharing_utilization_target!r}")
        if not (math.isfinite(config.sharing_stabilization_seconds) and config.sharing_stabilization_seconds >= 0):
            raise ValueError(f"sharing_stabilization_seconds must be >= 0, got {config.sharing_stabilization_seconds!r}")
        names = [n.strip() for n in config.sharing_mig_profiles.split(",") if n.strip()]
        if names and config.sharing_mode != "mig":
            raise ValueError(f"sharing_mig_profiles needs sharing_mode mig, got {config.sharing_mode!r}")
        profiles: tuple[MigProfile, ...] = ()
        if config.sharing_mode == "mig":
            if not model.mig_profiles:
                raise ValueError(f"sharing_mode mig needs a MIG-capable sharing_gpu_model, got "
                                 f"{config.sharing_gpu_model or 'only sharing_gpu_memory_bytes'!r}")
            try:
                chosen = [model.profile(n) for n in names] if names else list(model.mig_profiles)
            except ValueError as exc:
                raise ValueError(f"sharing_mig_profiles: {exc}") from None
            profiles = tuple(sorted(set(chosen), key=lambda p: (p.memory_slices, p.compute_slices)))
        return SharingSettings(config.sharing_mode, model, float(config.sharing_memory_quantile),
                               float(config.sharing_memory_margin), float(config.sharing_utilization_quantile),
                               float(config.sharing_utilization_target), config.sharing_policy, profiles,
                               float(config.sharing_stabilization_seconds))
