"""Static + analytical features of a training job, with a disk cache of the meta replay."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dprobe.core.gpus import GPUSpec
from dprobe.data.common import family_of  # noqa: F401  (where the profiler's callers take it from)
from dprobe.graph.cache import spec_key
from dprobe.graph.schema import write_atomically
from dprobe.graph.zoo import parse_spec
from dprobe.profiling.coldstart.memtrack import BACKWARD, FORWARD, OP_CLASSES, OPTIMIZER, TENSOR_CORE_CLASSES
from dprobe.profiling.coldstart.replay import (
    TWO_STATE_OPTIMIZERS,
    ReplayEstimate,
    replay_inference_step,
    replay_training_step,
)

MODES = ("train", "inference")
# what a replayed kernel's GPU time is (op_seconds): "plain", max(FLOPs / peak, bytes / bandwidth);
# "kernel-model", the vector-unit kernels' (element-wise, norm, optimizer; fp32 matmuls and convolutions
# without TF32) fp32 roofline times the shape-free kernel model's efficiency, tensor-core kernels on the
# plain roofline; "kernel-model-all", that efficiency on every kernel, the tensor-core roofline's too
ROOFLINES = ("plain", "kernel-model", "kernel-model-all")  # what a predicted step runs: a training step, or a forward pass in eval mode

BF16 = ("bf16", "bf16-pure")  # bf16 kernels (the job-scale features mark them)
HALF = ("bf16", "fp16", "bf16-pure")  # the precisions the "half" feature marks: autocast's tensor-core kernels
LAUNCH_S = 4e-6  # GPU-side cost of one kernel (launch latency, tail)
# host time to issue one op from eager PyTorch: forward ops (Python, autograd recording), backward ops
# (C++ autograd engine), optimizer ops (foreach)
HOST_S = {FORWARD: 15e-6, BACKWARD: 8e-6, OPTIMIZER: 10e-6}
# No feature names the GPU: it enters through the roofline (FLOPs over its peaks, bytes over its bandwidth,
# per kernel), so that one learnt correction serves every GPU, those no training run was on included.
# fp16 and bf16 are one feature ("half"): the same autocast rules and tensor cores, each at its own peak.
FEATURES = ["log_peak", "log_reserved", "log_params", "log_state", "log_act", "log_batch", "half",
            "adamw", "cudnn_benchmark", "log_flops", "log_t_compute", "log_t_memory", "log_t_gpu",
            "log_t_host", "log_t_roof", "log_kernels", "act_share",
            "share_conv", "share_conv_grouped", "share_matmul", "share_norm",
            "log_kernels_forward", "log_kernels_backward", "log_kernels_optimizer"]

# what the memory residuals may depend on: the job's shape and its op mix (the roofline's GPU-time shares
# of convolutions and matmuls, whose libraries keep workspaces of their own), not its host timing
MEMORY_FEATURES = ["log_peak", "log_reserved", "log_params", "log_state", "log_act", "log_batch", "half",
                   "adamw", "cudnn_benchmark", "log_kernels", "act_share",
                   "share_conv", "share_conv_grouped", "share_matmul"]


def op_peaks(ops: np.ndarray, precision: str, gpu: GPUSpec, tf32: bool = True,
             grouped_tensor: bool = True) -> np.ndarray:
    """The peak FLOP/s each replayed kernel (rows of :class:`ReplayOp`) runs at: bf16 / fp16 matmuls and
    convolutions at the tensor-core peak, fp32 ones at TF32's when ``tf32``, everything else at fp32's.
    ``grouped_tensor=False``: grouped and depthwise convolutions at the fp32 vector peak too (cuDNN runs
    depthwise convolutions on the CUDA cores: a 9x9 depthwise kernel is compute-bound there, not on
    tensor cores); the inference step model's roofline takes it, the training profiler's keeps True."""
    cls, low = ops[:, 1], ops[:, 2]
    tensor = np.isin(cls, TENSOR_CORE_CLASSES)
    if not grouped_tensor:
        tensor &= cls != OP_CLASSES.index("conv_grouped")
    fp32_mm = gpu.peak_flops_tf32 if tf32 else gpu.peak_flops_fp32
    return np.where(tensor, np.where(low > 0, gpu.peak_half(precision), fp32_mm), gpu.peak_flops_fp32)


def op_seconds(ops: np.ndarray, precision: str, gpu: GPUSpec, tf32: bool = True,
               roofline: str = "plain", grouped_tensor: bool = True) -> np.ndarray:
    """GPU time of each replayed kernel (rows of :class:`ReplayOp`), launch cost not included, by
    ``roofline`` (:data:`ROOFLINES`): ``plain``, max(FLOPs / peak, bytes / bandwidth) at the kernel's peak
    (:func:`op_peaks`); ``kernel-model``, the kernels on the vector units (what NeuSight measured, fp32)
    at their fp32 roofline times the shape-free kernel model's efficiency
    (:func:`~dprobe.profiling.kernels.model.replay_efficiency`), tensor-core kernels on the plain roofline
    (the model never saw one); ``kernel-model-all``, that fp32-learnt efficiency on the tensor-core
    roofline too. ``grouped_tensor``: as :func:`op_peaks`'."""
    if roofline not in ROOFLINES:
        raise ValueError(f"unknown roofline {roofline!r} ({', '.join(ROOFLINES)})")
    ops = np.asarray(ops, dtype=np.float64).reshape(-1, 5)
    plain = np.maximum(ops[:, 3] / op_peaks(ops, precision, gpu, tf32, grouped_tensor), ops[:, 4] / gpu.bandwidth)
    if roofline == "plain" or not len(ops):
        return plain
    from dprobe.profiling.kernels.model import replay_efficiency

    efficiency = replay_efficiency(ops, gpu, OP_CLASSES)
    if roofline == "kernel-model-all":
        return plain * efficiency
    tensor = np.isin(ops[:, 1], TENSOR_CORE_CLASSES) & ((ops[:, 2] > 0) | tf32)
    return np.where(tensor, plain, plain * efficiency)


def roofline_seconds(est: ReplayEstimate, precision: str, gpu: GPUSpec, tf32: bool = True,
                     roofline: str = "plain", per_op: np.ndarray | None = None,
                     grouped_tensor: bool = True) -> dict[str, float]:
    """Per-kernel roofline of one step: GPU busy time, host issue time, and the step (the larger of the two).

    Each kernel takes max(FLOPs / peak, bytes / bandwidth) plus a launch cost; bf16 / fp16 kernels run at
    their tensor-core peak (:meth:`GPUSpec.peak_half`), fp32 matmuls and convolutions at the TF32 peak when ``tf32`` (as
    ``torch.backends.cuda.matmul.allow_tf32``), everything else at the fp32 vector peak. ``roofline``: what
    a kernel's time is (:func:`op_seconds`; ``per_op``: those times computed already). ``compute`` and
    ``memory`` are the plain sums of FLOPs over peaks and bytes over the bandwidth whatever ``roofline``.
    ``grouped_tensor``: as :func:`op_peaks`'.
    """
    ops = np.asarray(est.ops, dtype=np.float64).reshape(-1, 5)
    phase, cls, low, flops, moved = ops.T
    peak = op_peaks(ops, precision, gpu, tf32, grouped_tensor)
    fp32_mm = gpu.peak_flops_tf32 if tf32 else gpu.peak_flops_fp32
    half = gpu.peak_half(precision)
    # fused attention kernels do not dispatch on meta: forward + backward ~ 3.5 forwards (an inference
    # step's estimate already holds its one forward)
    attn_peak = fp32_mm if precision == "fp32" else half
    t_attention = (1.0 if est.forward_only else 3.5) * est.attention_flops / attn_peak
    t_compute = float(np.sum(flops / peak)) + t_attention
    t_memory = float(np.sum(moved / gpu.bandwidth))
    if per_op is None:
        per_op = op_seconds(ops, precision, gpu, tf32, roofline, grouped_tensor)
    elif len(per_op) != len(ops):
        raise ValueError(f"{len(per_op)} kernel times for {len(ops)} kernels")
    per_op = per_op + LAUNCH_S
    t_gpu = float(per_op.sum()) + t_attention
    t_host = float(sum(HOST_S[p] * np.count_nonzero(phase == p) for p in HOST_S))
    by_class = np.bincount(cls.astype(int), weights=per_op, minlength=len(OP_CLASSES))
    shares = {f"share_{c}": float(by_class[i]) / max(t_gpu, 1e-12) for i, c in enumerate(OP_CLASSES)}
    kernels = {f"kernels_{name}": float(np.count_nonzero(phase == p))
               for name, p in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER))}
    return {"compute": t_compute, "memory": t_memory, "gpu": t_gpu, "host": t_host, "roof": max(t_gpu, t_host),
            **shares, **kernels}


def job_features(est: ReplayEstimate, batch: int, precision: str, optimizer: str, gpu: GPUSpec,
                 cudnn_benchmark: bool = False, roofline: str = "plain") -> list[float]:
    """The feature vector (order of FEATURES), its times on the replay roofline ``roofline``
    (:func:`op_seconds`; the shipped cold-start profiler's is ``plain``)."""
    t = roofline_seconds(est, precision, gpu, roofline=roofline)
    lg = math.log
    return [lg(est.peak_bytes), lg(est.reserved_bytes), lg(est.param_bytes), lg(max(est.state_bytes, 1.0)),
            lg(max(est.activation_bytes, 1.0)), lg(batch), float(precision in HALF),
            float(optimizer in TWO_STATE_OPTIMIZERS), float(cudnn_benchmark), lg(max(est.flops, 1.0)),
            *(lg(max(t[k], 1e-7)) for k in ("compute", "memory", "gpu", "host", "roof")), lg(max(est.kernels, 1.0)),
            est.activation_bytes / max(est.peak_bytes, 1.0),
            t["share_conv"], t["share_conv_grouped"], t["share_matmul"], t["share_norm"],
            *(lg(max(t[f"kernels_{p}"], 1.0)) for p in ("forward", "backward", "optimizer"))]


def with_host_factor(feats: np.ndarray, log_factor: np.ndarray | float) -> np.ndarray:
    """Feature rows (order of FEATURES) for a machine whose host issues ops ``exp(log_factor)`` times as
    slowly as the typical one: the host time scaled, the roofline step (the larger of GPU and host time)
    taken again. ``log_factor`` is one value, or one per row."""
    f = np.array(feats, dtype=np.float64, copy=True)
    host, gpu, roof = (FEATURES.index(k) for k in ("log_t_host", "log_t_gpu", "log_t_roof"))
    f[..., host] += log_factor
    f[..., roof] = np.maximum(f[..., gpu], f[..., host])
    return f


def analytical_for(model: str, batch: int, precision: str, optimizer: str, image: int | None = None,
                   seq: int | None = None, config_kwargs: dict | str | None = None,
                   cache_dir: str | Path | None = None, grad_checkpointing: bool = False,
                   attention: str = "fused", mode: str = "train", memory_format: str = "nchw",
                   reparameterize: bool = False) -> ReplayEstimate:
    """The replay estimate, cached as JSON under ``cache_dir`` keyed by the job's spec hash (``attention``:
    the stack's attention kernels, :func:`~dprobe.profiling.coldstart.replay.replay_training_step`).
    ``mode``: ``train`` (a training step) or ``inference`` (the forward alone, eval mode, no autograd:
    :func:`~dprobe.profiling.coldstart.replay.replay_inference_step`; ``optimizer`` is not used).
    ``memory_format``: ``nchw``, or ``nhwc`` for the model and its images in ``torch.channels_last``;
    ``reparameterize``: an inference step of the model fused for inference
    (:func:`~dprobe.profiling.coldstart.replay.reparameterized`)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    if mode == "inference" and grad_checkpointing:
        raise ValueError("gradient checkpointing is a training setting: an inference step keeps no activations")
    if reparameterize and mode != "inference":
        raise ValueError("re-parameterisation fuses a model for inference: it needs mode='inference'")
    spec = parse_spec(model, config_kwargs)
    path = replay_cache_path(model, batch, precision, optimizer, image, seq, config_kwargs, cache_dir,
                             grad_checkpointing, attention, mode, memory_format, reparameterize)
    channels_last = memory_format == "nhwc"
    if path is not None and path.is_file():
        return ReplayEstimate.from_dict(json.loads(path.read_text()))
    if mode == "inference":
        est = replay_inference_step(spec, batch, precision, image=image, seq=seq, attention=attention,
                                    channels_last=channels_last, reparameterize=reparameterize)
    else:
        est = replay_training_step(spec, batch, precision, optimizer, image=image, seq=seq,
                                   grad_checkpointing=grad_checkpointing, attention=attention,
                                   channels_last=channels_last)
    if path is not None:
        write_atomically(path, json.dumps(est.to_dict()))
    return est


def replay_cache_path(model: str, batch: int, precision: str, optimizer: str, image: int | None = None,
                      seq: int | None = None, config_kwargs: dict | str | None = None,
                      cache_dir: str | Path | None = None, grad_checkpointing: bool = False,
                      attention: str = "fused", mode: str = "train", memory_format: str = "nchw",
                      reparameterize: bool = False) -> Path | None:
    """Where :func:`analytical_for` caches the job's replay (None without a ``cache_dir``)."""
    if not cache_dir:
        return None
    name = replay_cache_key(model, batch, precision, optimizer, image, seq, config_kwargs, grad_checkpointing,
                            attention, mode, memory_format, reparameterize)
    return Path(cache_dir) / f"{name}.json"


def replay_cache_key(model: str, batch: int, precision: str, optimizer: str, image: int | None = None,
                     seq: int | None = None, config_kwargs: dict | str | None = None,
                     grad_checkpointing: bool = False, attention: str = "fused", mode: str = "train",
                     memory_format: str = "nchw", reparameterize: bool = False) -> str:
    """The name of the job's replay in the cache (:func:`replay_cache_path`, without ``.json``): it changes
    when the replay does (a channels-last or re-parameterised replay ends in ``-nhwc`` / ``-reparam``)."""
    if memory_format not in ("nchw", "nhwc"):
        raise ValueError(f"unknown memory format {memory_format!r} (nchw, nhwc)")
    tail = ("" if memory_format == "nchw" else "-nhwc") + ("-reparam" if reparameterize else "")
    spec = parse_spec(model, config_kwargs)
    job = {"model": model, "kw": spec.config_kwargs, "batch": batch, "precision": precision, "optimizer": optimizer,
           "image": image, "seq": seq}
    if mode == "inference":  # no optimizer; its own replay version
        job = {k: v for k, v in job.items() if k != "optimizer"}
        return f"infer-{spec_key(job, extra='infer-v1')}{'' if attention == 'fused' else '-' + attention}{tail}"
    key = spec_key({**job, "grad_checkpointing": True} if grad_checkpointing else job, extra="replay-v6")
    return f"replay-{key}{'' if attention == 'fused' else '-' + attention}{tail}"
