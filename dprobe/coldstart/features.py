"""Static + analytical features of a training job, with a disk cache of the meta replay."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dprobe.coldstart.replay import ReplayEstimate, replay_training_step
from dprobe.graph.encoder import spec_key
from dprobe.graph.zoo import parse_spec


@dataclass(frozen=True)
class GPUSpec:
    """Device memory, dense peak FLOP/s (low precision, fp32) and memory bandwidth."""

    memory_bytes: float
    peak_flops_bf16: float
    peak_flops_fp32: float
    bandwidth: float


GPUS = {
    "h200": GPUSpec(150109880320, 989e12, 67e12, 4.8e12),
    "h100": GPUSpec(85520809984, 989e12, 67e12, 3.35e12),
    "a100": GPUSpec(85899345920, 312e12, 19.5e12, 2.0e12),
}
LAUNCH_S = 4e-6
FEATURES = ["log_peak", "log_reserved", "log_params", "log_state", "log_act", "log_batch", "bf16", "fp16",
            "adamw", "cudnn_benchmark", "log_flops", "log_t_compute", "log_t_memory", "log_t_launch",
            "log_t_roof", "log_kernels", "act_share", "log_gpu_mem", "log_peak_flops"]


def roofline_seconds(est: ReplayEstimate, precision: str, gpu: GPUSpec) -> dict[str, float]:
    peak = gpu.peak_flops_fp32 if precision == "fp32" else gpu.peak_flops_bf16
    t_compute = est.matmul_flops / peak + (est.flops - est.matmul_flops) / gpu.peak_flops_fp32
    t_memory = est.bytes_moved / gpu.bandwidth
    t_launch = est.kernels * LAUNCH_S
    return {"compute": t_compute, "memory": t_memory, "launch": t_launch,
            "roof": max(t_compute + t_memory, t_launch)}


def job_features(est: ReplayEstimate, batch: int, precision: str, optimizer: str, gpu: GPUSpec,
                 cudnn_benchmark: bool = False) -> list[float]:
    """The feature vector (order of FEATURES)."""
    t = roofline_seconds(est, precision, gpu)
    lg = math.log
    return [lg(est.peak_bytes), lg(est.reserved_bytes), lg(est.param_bytes), lg(max(est.state_bytes, 1.0)),
            lg(max(est.activation_bytes, 1.0)), lg(batch), float(precision == "bf16"), float(precision == "fp16"),
            float(optimizer == "adamw"), float(cudnn_benchmark), lg(max(est.flops, 1.0)),
            lg(max(t["compute"], 1e-7)), lg(max(t["memory"], 1e-7)), lg(max(t["launch"], 1e-7)),
            lg(max(t["roof"], 1e-7)), lg(max(est.kernels, 1.0)), est.activation_bytes / max(est.peak_bytes, 1.0),
            lg(gpu.memory_bytes), lg(gpu.peak_flops_bf16)]


def analytical_for(model: str, batch: int, precision: str, optimizer: str, image: int | None = None,
                   seq: int | None = None, config_kwargs: dict | str | None = None,
                   cache_dir: str | Path | None = None) -> ReplayEstimate:
    """The replay estimate, cached as JSON under ``cache_dir`` keyed by the job's spec hash."""
    spec = parse_spec(model, config_kwargs)
    key = spec_key({"model": model, "kw": spec.config_kwargs, "batch": batch, "precision": precision,
                    "optimizer": optimizer, "image": image, "seq": seq}, extra="replay-v2")
    path = Path(cache_dir) / f"replay-{key}.json" if cache_dir else None
    if path is not None and path.is_file():
        return ReplayEstimate(**json.loads(path.read_text()))
    est = replay_training_step(spec, batch, precision, optimizer, image=image, seq=seq)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(est.to_dict()))
    return est


def family_of(model: str) -> str:
    """Model family by a generic rule: lower-case, cut at the first digit, size word or separator."""
    import re

    name = model.lower().split(":")[-1].split("/")[-1]
    name = re.sub(r"(config|for[a-z]+|lmheadmodel|model)$", "", name)
    stem = re.split(r"[\d_\-.]|(?<=[a-z])(?:tiny|small|base|large|medium|wide|xl)\b", name)[0]
    return stem or name
