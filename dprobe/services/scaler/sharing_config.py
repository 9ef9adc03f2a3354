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
from dprobe.core.options import Check, between, check_options, comma_list, one_of, option, zero_means
from dprobe.sharing.mig import GPU_MODELS, GpuModel, MigProfile, gpu_model
from dprobe.sharing.planner import PLANNER_POLICIES

SHARING_MODES = ("time-slicing", "mps", "mig")
EXPORTED = one_of(QUANTILES, "one the sidecars export")
STABILIZATION = Check("must be >= 0", lambda v: 0 <= v < math.inf)


@dataclass
class SharingOptions:
    """The scaler's ``sharing_*`` options (YAML: a ``sharing:`` section), checked only while ``enabled``."""

    enabled: bool = option(False, "recommend GPU shares: a memory limit and a GPU fraction or MIG profile per "
                                  "workload, the co-location plan, GPUs per virtual cluster with and without "
                                  "sharing")
    mode: str = option("time-slicing", "how GPUs are shared: time-slicing, mps or mig", choices=SHARING_MODES)
    gpu_model: str = option("", "the GPUs' model (its memory and MIG profiles): " + ", ".join(GPU_MODELS)
                                + " or an alias such as h100 ('' = give sharing_gpu_memory_bytes)")
    gpu_memory_bytes: float = option(0.0, "memory of one GPU in bytes (0 = the sharing_gpu_model's)",
                                     check=zero_means("the sharing_gpu_model's"))
    gpu_spec_file: str = option("", "the GPUs' spec file (dprobe gpu calibrate's, or a spec sheet as dprobe predict "
                                    "--gpu-spec reads it): their name and memory, in place of sharing_gpu_model "
                                    "and sharing_gpu_memory_bytes")
    memory_quantile: float = option(0.99, "memory forecast quantile a share must hold (hard: 0.5, 0.9 or 0.99)",
                                    check=EXPORTED)
    memory_margin: float = option(0.15, "safety margin added to the memory forecast (VPA's is 0.15)",
                                  check=between(0, 1))
    utilization_quantile: float = option(0.9, "utilisation forecast quantile packed (soft: 0.5, 0.9 or 0.99)",
                                         check=EXPORTED)
    utilization_target: float = option(0.9, "most summed utilisation (0-1) packed onto one GPU",
                                       check=Check("must be in (0, 1]", lambda v: 0 < v <= 1))
    policy: str = option("best-fit", "packing policy: " + ", ".join(PLANNER_POLICIES), choices=PLANNER_POLICIES)
    mig_profiles: str = option("", "mode mig: the MIG profiles a workload may get, comma-separated "
                                   "(e.g. 1g.10gb,3g.40gb; '' = all of the GPU's)")
    stabilization_seconds: float = option(300.0, "a memory limit is lowered only to the highest limit of this "
                                                 "window", check=STABILIZATION)


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
        """The ``sharing_*`` options of a :class:`~dprobe.services.scaler.config.ScalerConfig` (its ``sharing``
        group), checked: see :meth:`from_options`."""
        return SharingSettings.from_options(config.sharing)

    @staticmethod
    def from_options(options: SharingOptions) -> SharingSettings:
        """The settings of the ``sharing_*`` options; a :class:`ValueError` naming the option for anything
        missing or wrong."""
        for name, allowed in (("mode", SHARING_MODES), ("policy", PLANNER_POLICIES)):
            if getattr(options, name) not in allowed:
                raise ValueError(f"sharing_{name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(options, name)!r}")
        check_options(options, prefix="sharing_")
        memory = options.gpu_memory_bytes
        if options.gpu_spec_file:  # name and memory from the file; MIG profiles where it is a MIG-capable model
            from dprobe.services.scaler.sharing_gpu import gpu_from_spec_file

            model = gpu_from_spec_file(options.gpu_spec_file, options.gpu_model, memory)
        elif options.gpu_model:
            try:
                model = gpu_model(options.gpu_model)
            except ValueError as exc:
                raise ValueError(f"sharing_gpu_model: {exc}") from None
            if memory and abs(memory - model.memory_bytes) > 0.01 * model.memory_bytes:
                raise ValueError(f"sharing_gpu_memory_bytes {memory:g} contradicts sharing_gpu_model "
                                 f"{model.name} ({model.memory_bytes:g} bytes): give one of them")
        elif memory > 0:
            model = GpuModel(f"{memory / 1e9:g}GB", float(memory))
        else:
            raise ValueError("sharing is enabled without the GPUs' memory: set sharing_gpu_model (e.g. H100-80GB), "
                             "sharing_gpu_memory_bytes or sharing_gpu_spec_file")
        names = comma_list(options.mig_profiles)
        if names and options.mode != "mig":
            raise ValueError(f"sharing_mig_profiles needs sharing_mode mig, got {options.mode!r}")
        profiles: tuple[MigProfile, ...] = ()
        if options.mode == "mig":
            if not model.mig_profiles:
                given = model.name if options.gpu_spec_file else options.gpu_model or "only sharing_gpu_memory_bytes"
                raise ValueError(f"sharing_mode mig needs a MIG-capable sharing_gpu_model, got {given!r}")
            try:
                chosen = [model.profile(n) for n in names] if names else list(model.mig_profiles)
            except ValueError as exc:
                raise ValueError(f"sharing_mig_profiles: {exc}") from None
            profiles = tuple(sorted(set(chosen), key=lambda p: (p.memory_slices, p.compute_slices)))
        return SharingSettings(options.mode, model, float(options.memory_quantile), float(options.memory_margin),
                               float(options.utilization_quantile), float(options.utilization_target),
                               options.policy, profiles, float(options.stabilization_seconds))
