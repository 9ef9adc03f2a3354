"""The GPUs dprobe has figures for: memory, peak FLOP/s and bandwidth, and how NVML names them.

Plain data without torch, so that a sidecar installed without it (deploy/requirements-services.txt)
still checks the ``gpu=`` of a job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GPUSpec:
    """Device memory, dense peak FLOP/s (bf16 / fp16, TF32, fp32 vector) and memory bandwidth."""

    memory_bytes: float
    peak_flops_bf16: float
    peak_flops_tf32: float
    peak_flops_fp32: float
    bandwidth: float


# memory as NVML reports it (the measured figure replaces it for a collection's runs); dense tensor-core
# FLOP/s (no sparsity) and bandwidth from the vendor's data sheets. Only H200 runs are bundled: the others
# change the roofline, not the learned corrections (see docs/graph-and-coldstart.md, Known gaps).
GPUS = {
    "h200": GPUSpec(150109880320, 989e12, 494e12, 67e12, 4.8e12),
    "h100": GPUSpec(85520809984, 989e12, 494e12, 67e12, 3.35e12),
    "a100": GPUSpec(85899345920, 312e12, 156e12, 19.5e12, 2.0e12),
    "l40s": GPUSpec(48305799168, 362e12, 183e12, 91.6e12, 864e9),
    "a10": GPUSpec(24146608128, 125e12, 62.5e12, 31.2e12, 600e9),
    "l4": GPUSpec(24152899584, 121e12, 60e12, 30.3e12, 300e9),
}


def gpu_key(device_name: str) -> str:
    """The ``GPUS`` key of a device as CUDA / NVML names it ("NVIDIA H100 80GB HBM3" -> "h100")."""
    name = device_name.lower()
    for key in GPUS:
        if key in name.replace("-", " ").split():
            return key
    raise ValueError(f"dprobe has no peak FLOP/s and bandwidth for the GPU {device_name!r} (it knows "
                     f"{', '.join(k.upper() for k in GPUS)}); add a GPUSpec for it to "
                     "dprobe.profiling.coldstart.gpus.GPUS")


def gpu_spec(device_name: str, memory_bytes: float | None = None) -> GPUSpec:
    """The spec of a device by name; ``memory_bytes`` (as measured) replaces the model's nominal memory."""
    spec = GPUS[gpu_key(device_name)]
    if memory_bytes is not None and math.isfinite(memory_bytes) and memory_bytes > 0:
        spec = replace(spec, memory_bytes=float(memory_bytes))
    return spec
