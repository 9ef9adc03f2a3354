"""Inference step time on a GPU from a meta replay of the forward pass and the GPU's spec sheet.

An inference step (one forward pass of a batch, eval mode, autocast) is replayed on meta tensors
(:func:`~dprobe.profiling.coldstart.replay.replay_inference_step`) and put on the GPU's per-kernel roofline
(:func:`~dprobe.profiling.coldstart.features.roofline_seconds`): every kernel at ``max(FLOPs / peak,
bytes / bandwidth)`` plus a launch cost, the step the larger of GPU and host time; the shipped model's
roofline (:data:`SHIPPED_ROOFLINE`, ``kernel-model``) puts the kernels on the vector units (element-wise,
norm) at their fp32 roofline times the shape-free kernel model's efficiency instead
(:func:`~dprobe.profiling.coldstart.features.op_seconds`; it beat the plain roofline on GPUs left out,
``benchmarks/kernel_roofline.py``). What the spec sheet
does not say (how much of the peak cuDNN's and cuBLAS's kernels reach, how small kernels leave SMs idle,
what a large L2 saves an element-wise kernel) is the log of ``measured / roofline``, learnt from features
that carry over between GPUs: the roofline's times and op-class shares, the kernels' sizes against the
GPU's (per-kernel time against the launch cost, bytes against the L2, arithmetic intensity against the
machine balance, tiles and elements per SM), never a name of a GPU, model or family.

Three predictors are fitted together and scored side by side: the **rule**, the roofline times one
factor (the median ``measured / roofline`` of the fitting rows); the **GPU factor**, the roofline times the
median ratio of the fitting rows of the same GPU (a GPU no row was measured on gets the rule's); and the
**learned** correction (LightGBM). Each p90 is the p50 times a factor from held-out residuals: on a GPU
the model never saw, from leaving each fitting GPU out in turn (one GPU: each fifth of the model
families); the GPU factor's, on a GPU it has, from leaving each fifth of the families out. The shipped
model (``default_inference.json`` beside this module, plain JSON with LightGBM's text format: nothing is
unpickled) decides per case, each against its simple rule, fold by fold on ``datasets/timm-infer-gpus``:
on a GPU it has rows of, the learned correction only if it beat the GPU factor on every fifth of the
families left out (``seen_method``); on any other GPU, only if it beat the rule on every GPU left out
(``method``). A GPU of no row but of the same architecture as a measured one (a spec-sheet sibling, say a
workstation card on the RTX 5090's chip) takes that GPU's factor where the GPU factor runs, its p90 widened
by the spread between the measured GPUs' factors (``sibling-factor``): no fold here has such a pair, so
nothing validates the learned correction there, and the simple rule anchored to the nearest measured GPU
runs. The figures are recorded in it, and a prediction says which ran.

Two more predictors anchor a GPU of no row to the **nearest measured GPU** (:meth:`InferenceStepModel.nearest`:
the same architecture first, then the nearest bandwidth and tensor-core peak): ``nearest-factor``, the roofline
on the spec sheet times that GPU's factor, its p90 widened by the spread between GPUs (left-one-GPU-out over
the fitting GPUs, each predicted by its nearest among the others: ``nearest_p90_factor``), which runs on a
spec-sheet GPU only where it beat the current ``method`` on every GPU left out (:func:`choose`); and
``calibrated``, for a GPU whose spec carries ``dprobe gpu calibrate``'s measured figures: the roofline on the
measured peaks (:func:`roofline_spec`) times the nearest measured GPU's factor.

:func:`predict_inference_step` is the one entry point; :func:`crossval` and
``benchmarks/coldstart_inference.py`` call it. ``python -m dprobe.profiling.coldstart.inference DIR``
refits and writes the shipped model.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dprobe.core.gpus import GPUS, GPUSpec, fractions_of_peak, generation, measured_spec
from dprobe.profiling.coldstart.features import LAUNCH_S, ROOFLINES, op_peaks, op_seconds, roofline_seconds
from dprobe.profiling.coldstart.memtrack import TENSOR_CORE_CLASSES
from dprobe.profiling.coldstart.replay import ReplayEstimate

DEFAULT_MODEL = Path(__file__).with_name("default_inference.json")
# the replay roofline the shipped model is fitted on: the kernel model's, which beat the plain one's mean
# MAPE over GPUs left out (13.6 % against 14.9 %) with families even (11.5 % against 11.4 %)
SHIPPED_ROOFLINE = "kernel-model"
FORMAT = "dprobe-inference/1"
METHODS = ("learned", "rule", "gpu-factor", "sibling-factor", "nearest-factor", "calibrated")
UNSEEN_METHODS = ("learned", "rule", "nearest-factor")  # what ``method`` may be: a spec-sheet GPU of no row
SIBLING_BANDWIDTH = 1.5  # a measured GPU of the same architecture within this ratio of bandwidth: the same memory system
SHARE_CLASSES = ("elementwise", "norm", "matmul", "conv", "conv_grouped")
TILE_FLOPS = 2.0 * 128 * 128 * 64  # one 128x128 output tile over a K of 64: a tensor-core kernel's unit of work
SMALL_KERNEL = 4.0  # a kernel whose roofline time is under this many launch costs leaves SMs idle
# grouped and depthwise convolutions on the tensor cores' peak (False: the fp32 vector peak, as cuDNN runs
# depthwise kernels on the CUDA cores; features.op_peaks). False beat True on families left out (GPU factor
# 13.7 -> 13.0 % mean MAPE) and on GPUs left out: docs/graph-and-coldstart.md, "Far-off families"
GROUPED_TENSOR = False
FEATURES = [
    "log_t_compute", "log_t_memory", "log_t_gpu", "log_t_host", "log_t_roof",
    "log_compute_over_memory", "log_host_over_gpu", "log_launch_share", "log_kernels",
    *(f"share_{c}" for c in SHARE_CLASSES), "share_attention", "share_memory_bound", "share_small",
    "share_in_l2", "log_kernel_over_launch", "log_kernel_over_launch_tw", "log_bytes_over_l2",
    "log_bytes_over_l2_tw", "log_intensity_over_balance", "log_tc_intensity_over_balance",
    "log_waves_tw", "share_tc_under_one_wave", "log_elements_per_sm_tw",
]
BOOST_ROUNDS = 300
PARAMS = {"objective": "huber", "alpha": 0.15, "learning_rate": 0.03, "num_leaves": 15, "min_data_in_leaf": 40,
          "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
          "verbose": -1, "num_threads": 1, "seed": 0, "deterministic": True}
FACTOR_METHODS = ("gpu-factor", "sibling-factor", "nearest-factor", "calibrated")  # roofline x a measured GPU's factor
METHOD_NOTES = {  # why each method ran (InferenceStepModel.explain adds the anchor GPU where there is one)
    "gpu-factor": "step time: the roofline times this GPU's own measured factor (on model families left out, the "
                  "learned correction did not beat it in every fold)",
    "sibling-factor": "step time: the roofline times the factor measured on a GPU of the same architecture, its "
                      "p90 widened by the spread between measured GPUs (no fold validates anything else for a GPU "
                      "whose sibling was measured)",
    "learned": "step time: the learned correction on the roofline (it beat the simple rule on every left-out fold "
               "of its kind)",
    "rule": "step time: the roofline times one factor (on GPUs left out, the learned correction did not beat it in "
            "every fold)",
}
TARGETS = {"gpu": "MAPE <= 12 %, Spearman >= 0.95, p90 covering 80-95 % on every GPU left out",
           "family": "reported (no target)"}


class InferenceModelError(ValueError):
    """A shipped or saved inference model that cannot be read (names the file and what is wrong)."""


def _lg(x: float, floor: float = 1e-30) -> float:
    return math.log(max(float(x), floor))


def inference_features(est: ReplayEstimate, precision: str, gpu: GPUSpec, roofline: str = "plain",
                       per_op: np.ndarray | None = None) -> dict[str, float]:
    """The learned model's inputs (order of :data:`FEATURES`) for one inference replay on ``gpu``, plus
    ``roof`` (the roofline step, seconds: the target is ``log(measured / roof)``). Times in seconds on
    the GPU's spec sheet; every other value a ratio of the job's sizes to the GPU's. No value names a GPU
    or a model. ``roofline``: each kernel's time (:func:`~dprobe.profiling.coldstart.features.op_seconds`;
    ``per_op``: those times computed already)."""
    ops = np.asarray(est.ops, dtype=np.float64).reshape(-1, 5)
    if per_op is None:
        per_op = op_seconds(ops, precision, gpu, roofline=roofline, grouped_tensor=GROUPED_TENSOR)
    t = roofline_seconds(est, precision, gpu, per_op=per_op, grouped_tensor=GROUPED_TENSOR)
    cls, flops, moved = ops[:, 1], ops[:, 3], ops[:, 4]
    peak = op_peaks(ops, precision, gpu, grouped_tensor=GROUPED_TENSOR)
    t_flops, t_bytes = flops / peak, moved / gpu.bandwidth
    n = max(len(ops), 1)
    w = per_op / per_op.sum() if per_op.sum() > 0 else np.full(len(ops), 1.0 / n)
    t_gpu = max(t["gpu"], 1e-12)
    attn_peak = gpu.peak_flops_tf32 if precision == "fp32" else gpu.peak_half(precision)
    t_attention = est.attention_flops / attn_peak
    sms = max(gpu.sm_count, 1)
    l2 = gpu.l2_bytes if gpu.l2_bytes > 0 else 4.0 * 2**20
    balance = gpu.peak_half(precision) / gpu.bandwidth
    tensor = np.isin(cls, TENSOR_CORE_CLASSES)
    memory_bound = t_bytes >= t_flops
    small = per_op < SMALL_KERNEL * LAUNCH_S
    waves = flops / TILE_FLOPS / sms
    elem_bytes = 2.0 if precision != "fp32" else 4.0
    tc_time = per_op[tensor].sum()
    tc_flops, tc_bytes = flops[tensor].sum(), moved[tensor].sum()
    feats = {
        "log_t_compute": _lg(t["compute"]), "log_t_memory": _lg(t["memory"]), "log_t_gpu": _lg(t["gpu"]),
        "log_t_host": _lg(t["host"]), "log_t_roof": _lg(t["roof"]),
        "log_compute_over_memory": _lg(t["compute"]) - _lg(t["memory"]),
        "log_host_over_gpu": _lg(t["host"]) - _lg(t["gpu"]),
        "log_launch_share": _lg(LAUNCH_S * len(ops) / t_gpu),
        "log_kernels": _lg(max(est.kernels, 1.0)),
        **{f"share_{c}": t[f"share_{c}"] for c in SHARE_CLASSES},
        "share_attention": t_attention / t_gpu,
        "share_memory_bound": float(per_op[memory_bound].sum()) / t_gpu,
        "share_small": float((per_op[small] + LAUNCH_S).sum()) / t_gpu,
        "share_in_l2": float(per_op[memory_bound & (moved <= l2)].sum()) / t_gpu,
        "log_kernel_over_launch": _lg(per_op.mean() / LAUNCH_S) if len(ops) else 0.0,
        "log_kernel_over_launch_tw": float(np.sum(w * np.log(np.maximum(per_op, 1e-12) / LAUNCH_S))),
        "log_bytes_over_l2": _lg(moved.mean() / l2) if len(ops) else 0.0,
        "log_bytes_over_l2_tw": float(np.sum(w * np.log(np.maximum(moved, 1.0) / l2))),
        "log_intensity_over_balance": _lg((flops.sum() + 1.0) / max(moved.sum(), 1.0) / balance),
        "log_tc_intensity_over_balance": (_lg((tc_flops + 1.0) / max(tc_bytes, 1.0) / balance)
                                          if tensor.any() else np.nan),
        "log_waves_tw": (float(np.sum(per_op[tensor] * np.log(np.maximum(waves[tensor], 1e-6))) / tc_time)
                         if tc_time > 0 else np.nan),
        "share_tc_under_one_wave": float(per_op[tensor & (waves < 1)].sum()) / t_gpu,
        "log_elements_per_sm_tw": (float(np.sum(per_op[~tensor] * np.log(np.maximum(
            moved[~tensor] / elem_bytes / sms, 1.0))) / per_op[~tensor].sum()) if per_op[~tensor].sum() > 0
            else np.nan),
    }
    return {**{k: float(feats[k]) for k in FEATURES}, "roof": float(t["roof"])}


def _batched_op_seconds(jobs: list[tuple[ReplayEstimate, str, GPUSpec]], roofline: str) -> list[np.ndarray]:
    """:func:`~dprobe.profiling.coldstart.features.op_seconds` of each (replay, precision, GPU), the kernels
    of every replay on one GPU at one precision in one call (one call of the kernel model's booster)."""
    out: list[np.ndarray | None] = [None] * len(jobs)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (_, p, g) in enumerate(jobs):
        groups.setdefault((p, repr(g)), []).append(i)
    for members in groups.values():
        _, p, g = jobs[members[0]]
        ops = [np.asarray(jobs[i][0].ops, dtype=np.float64).reshape(-1, 5) for i in members]
        times = op_seconds(np.concatenate(ops) if ops else np.zeros((0, 5)), p, g, roofline=roofline,
                           grouped_tensor=GROUPED_TENSOR)
        for i, part in zip(members, np.split(times, np.cumsum([len(o) for o in ops])[:-1]), strict=True):
            out[i] = part
    return out  # type: ignore[return-value]


def feature_frame(ests: list[ReplayEstimate], precision: str | list[str],
                  gpus: GPUSpec | list[GPUSpec], roofline: str = "plain") -> pd.DataFrame:
    """:func:`inference_features` of each replay (one precision and GPU, or one per replay) as rows; the
    column ``roof`` is the roofline step. ``roofline``: each kernel's time
    (:func:`~dprobe.profiling.coldstart.features.op_seconds`; the kernel model's predicted for all the
    kernels of one GPU at once)."""
    if roofline not in ROOFLINES:
        raise ValueError(f"unknown roofline {roofline!r} ({', '.join(ROOFLINES)})")
    n = len(ests)
    precisions = [precision] * n if isinstance(precision, str) else list(precision)
    specs = [gpus] * n if isinstance(gpus, GPUSpec) else list(gpus)
    if len(precisions) != n or len(specs) != n:
        raise ValueError(f"{n} replays but {len(precisions)} precisions and {len(specs)} GPUs")
    keys = [(id(est), p, repr(g)) for est, p, g in zip(ests, precisions, specs, strict=True)]
    first = {k: i for i, k in reversed(list(enumerate(keys)))}
    jobs = [(ests[i], precisions[i], specs[i]) for i in first.values()]
    times = _batched_op_seconds(jobs, roofline) if roofline != "plain" else [None] * len(jobs)
    cache = {k: inference_features(*job, roofline=roofline, per_op=t)
             for k, job, t in zip(first, jobs, times, strict=True)}
    frame = pd.DataFrame([cache[k] for k in keys], columns=[*FEATURES, "roof"])
    frame["gpu_name"] = [g.name for g in specs]  # which GPU factor a row takes (not features)
    frame["gpu_bandwidth"] = [g.bandwidth for g in specs]
    frame["gpu_peak"] = [g.peak_half("fp16") for g in specs]
    frame["gpu_calibrated"] = [g.calibration is not None for g in specs]
    frame.attrs["roofline"] = roofline  # predict_frame checks it against the model's
    return frame


@dataclass
class InferenceStepModel:
    """A fitted inference step-time model. ``method``, on a GPU without a factor of its own: ``learned``
    (roofline x exp(booster)) or ``rule`` (roofline x ``rule_factor``); the p90 is the p50 times
    ``p90_factor`` (the method's own, learnt on GPUs left out of the fit). ``seen_method``, on a GPU of
    ``gpu_factors`` (by the spec's name): ``learned`` or ``gpu-factor`` (roofline x that GPU's factor, its
    p90 ``gpu_p90_factor``, learnt on families left out); "" for a model without GPU factors (the
    learned or rule ``method`` everywhere). ``rule_p90_factor`` is the rule's, kept so that a learned model
    can be scored as the rule (:meth:`as_rule`). ``cv``: the cross-validation figures the choice was made on."""

    rule_factor: float
    p90_factor: float
    rule_p90_factor: float
    booster_text: str | None
    method: str
    trained_on: list[str]
    rows: int
    cv: dict[str, Any] = field(default_factory=dict)
    roofline: str = "plain"  # the replay roofline its features and ``roof`` are computed on (ROOFLINES)
    gpu_factors: dict[str, float] = field(default_factory=dict)  # per GPU (spec name): median measured / roofline
    gpu_p90_factor: float = 1.0
    seen_method: str = ""
    # p90 / p50 of the nearest measured GPU's factor on a GPU of no row, from leaving each fitting GPU out
    # (0: not fitted; the GPU factor's p90 times the spread between the GPUs' factors stands in)
    nearest_p90_factor: float = 0.0
    # per measured GPU (spec name): its calibration's measured / spec-sheet figures (``fractions_of_peak``),
    # where one was calibrated; a calibrated GPU's peaks are divided by its nearest GPU's here
    reference_fractions: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.roofline not in ROOFLINES:
            raise InferenceModelError(f"unknown roofline {self.roofline!r} ({', '.join(ROOFLINES)})")
        if self.method not in UNSEEN_METHODS:
            raise InferenceModelError(f"unknown method {self.method!r} ({', '.join(UNSEEN_METHODS)})")
        if self.method == "nearest-factor" and not self.gpu_factors:
            raise InferenceModelError("a nearest-factor model needs its GPUs' factors")
        if not (isinstance(self.nearest_p90_factor, int | float) and math.isfinite(self.nearest_p90_factor)
                and self.nearest_p90_factor >= 0):
            raise InferenceModelError(f"nearest_p90_factor must be a number >= 0, not {self.nearest_p90_factor!r}")
        if self.seen_method not in ("", "learned", "gpu-factor"):
            raise InferenceModelError(f"unknown seen_method {self.seen_method!r} (learned, gpu-factor)")
        if self.seen_method == "gpu-factor" and not self.gpu_factors:
            raise InferenceModelError("a gpu-factor model needs its GPUs' factors")
        for name, value in [*self.gpu_factors.items(), ("gpu_p90_factor", self.gpu_p90_factor)]:
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InferenceModelError(f"factor of {name} must be a positive number, not {value!r}")
        for name in ("rule_factor", "p90_factor", "rule_p90_factor"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InferenceModelError(f"{name} must be a positive number, not {value!r}")
        self._booster = None
        if "learned" in (self.method, self.seen_method):
            if not self.booster_text:
                raise InferenceModelError("a learned model needs its booster")
            import lightgbm as lgb

            try:
                self._booster = lgb.Booster(model_str=self.booster_text)
            except Exception as exc:  # noqa: BLE001 - LightGBM raises its own error on a bad model string
                raise InferenceModelError(f"booster is not a LightGBM model: {exc}") from exc
            if self._booster.feature_name() != FEATURES:
                raise InferenceModelError("booster was fitted on other features than this dprobe's: refit it "
                                          "(python -m dprobe.profiling.coldstart.inference DIR)")

    def sibling(self, gpu_name: str, bandwidth: float = 0.0) -> str | None:
        """The measured GPU of the same architecture as ``gpu_name`` (:func:`dprobe.core.gpus.generation`)
        whose memory bandwidth is within :data:`SIBLING_BANDWIDTH` of ``bandwidth`` (bytes/s; the same
        memory system, say the same chip), the nearest where there are several; None for a GPU of this
        model's own rows, of an architecture none of them has, or of another memory system."""
        if not self.gpu_factors or gpu_name in self.gpu_factors or bandwidth <= 0:
            return None
        arch = generation(gpu_name)
        known = {s.name: s.bandwidth for s in GPUS.values()}
        near = {g: abs(math.log(known[g] / bandwidth)) for g in self.gpu_factors
                if arch != "unknown" and generation(g) == arch and g in known}
        near = {g: d for g, d in near.items() if d <= math.log(SIBLING_BANDWIDTH)}
        return min(near, key=near.__getitem__) if near else None

    def nearest(self, gpu_name: str, bandwidth: float = 0.0, peak: float = 0.0) -> str | None:
        """The measured GPU (of ``gpu_factors``, with figures in :data:`~dprobe.core.gpus.GPUS`) nearest to a
        GPU of this name, bandwidth and fp16 tensor-core peak (bytes/s, FLOP/s): one of the same
        architecture (:func:`~dprobe.core.gpus.generation`) first, then the least distance between the logs of
        the bandwidths and of the peaks (a figure not given, 0, is left out). None for a GPU of this model's
        own rows or a model without GPU factors."""
        known = {s.name: s for s in GPUS.values()}
        measured = [g for g in self.gpu_factors if g in known]
        if not measured or gpu_name in self.gpu_factors:
            return None
        arch = generation(gpu_name)

        def distance(g: str) -> tuple[bool, float]:
            s = known[g]
            d = (math.log(s.bandwidth / bandwidth) ** 2 if bandwidth > 0 else 0.0) + \
                (math.log(s.peak_half("fp16") / peak) ** 2 if peak > 0 else 0.0)
            return (arch == "unknown" or generation(g) != arch, d)

        return min(sorted(measured), key=distance)

    def method_for(self, gpu_name: str, bandwidth: float = 0.0, peak: float = 0.0, calibrated: bool = False) -> str:
        """The method that predicts a step on the GPU of this spec name: ``seen_method`` on a GPU of its
        rows; ``calibrated`` on a GPU whose spec carries measured figures (``dprobe gpu calibrate``) where
        there are measured GPUs' factors; ``sibling-factor`` (a measured GPU of the same architecture's
        factor) where the GPU factor runs on seen GPUs and the GPU has such a sibling; else ``method``
        (``learned``, ``rule`` or ``nearest-factor``)."""
        if self.seen_method and gpu_name in self.gpu_factors:
            return self.seen_method
        if calibrated and self.nearest(gpu_name, bandwidth, peak):
            return "calibrated"
        if self.seen_method == "gpu-factor" and self.sibling(gpu_name, bandwidth):
            return "sibling-factor"
        return self.method

    def method_for_spec(self, spec: GPUSpec) -> str:
        """:meth:`method_for` of a GPU spec."""
        return self.method_for(spec.name, spec.bandwidth, spec.peak_half("fp16"), spec.calibration is not None)

    def anchor(self, gpu_name: str, bandwidth: float = 0.0, peak: float = 0.0, calibrated: bool = False) -> str:
        """The measured GPU whose factor a GPU's step takes (its own, a sibling's or the nearest's), "" where
        none does (the rule or the learned correction)."""
        method = self.method_for(gpu_name, bandwidth, peak, calibrated)
        if method == "gpu-factor":
            return gpu_name if gpu_name in self.gpu_factors else ""
        if method == "sibling-factor":
            return self.sibling(gpu_name, bandwidth) or ""
        if method in ("nearest-factor", "calibrated"):
            return self.nearest(gpu_name, bandwidth, peak) or ""
        return ""

    def log_factor(self, x: pd.DataFrame) -> np.ndarray:
        """log(step / roofline) of each row of :func:`feature_frame`."""
        gpus = _gpus(x)
        methods = np.array([self.method_for(*g) for g in gpus])
        out = np.full(len(x), math.log(self.rule_factor))
        if (methods == "learned").any():
            if self._booster is None:
                raise InferenceModelError("a learned method needs the model's booster")
            learned = np.asarray(self._booster.predict(x[FEATURES]), dtype=float)
            out = np.where(methods == "learned", learned, out)
        anchored = np.isin(methods, FACTOR_METHODS)
        if anchored.any():
            own = [self.gpu_factors.get(self.anchor(*g), self.rule_factor) for g in gpus]
            out = np.where(anchored, np.log(own), out)
        return out

    def p90_factors(self, x: pd.DataFrame) -> np.ndarray:
        """The p90 / p50 factor of each row: the GPU factor's own on a GPU with one, widened by the spread
        between the measured GPUs' factors on a sibling, by the nearest GPU's left-one-GPU-out spread
        (:attr:`nearest_p90_factor`) where the nearest GPU's factor runs, else ``p90_factor``."""
        spread = self.between_gpu_spread()
        nearest = self.nearest_p90_factor or self.gpu_p90_factor * spread
        widen = {"gpu-factor": self.gpu_p90_factor, "sibling-factor": self.gpu_p90_factor * spread,
                 "nearest-factor": nearest, "calibrated": nearest}
        return np.array([widen.get(self.method_for(*g), self.p90_factor) for g in _gpus(x)])

    def roofline_spec(self, spec: GPUSpec) -> GPUSpec:
        """The figures a GPU's roofline is put on: its spec sheet's, or for a calibrated GPU (of no row of
        this model) its measured peaks (:func:`~dprobe.core.gpus.measured_spec`) divided by the share of
        its spec sheet the nearest measured GPU reached in its own calibration
        (:attr:`reference_fractions`), so that the nearest GPU's factor, learnt against its spec-sheet
        roofline, applies. Where the nearest GPU has no calibration, that share is taken as this GPU's own
        median share (its figures' balance is the measurement's, its overall level the spec sheet's)."""
        if spec.calibration is None or self.method_for_spec(spec) != "calibrated":
            return spec
        own = fractions_of_peak(spec, spec.calibration)
        anchor = self.anchor(spec.name, spec.bandwidth, spec.peak_half("fp16"), True)
        ref = self.reference_fractions.get(anchor) or {}
        typical = float(np.median(list((ref or own).values()))) if (ref or own) else 1.0
        m = measured_spec(spec)

        def scaled(value: float, key: str) -> float:  # a figure not measured keeps the spec sheet's
            return value / ref.get(key, typical) if key in own else value

        half = scaled(m.peak_half("fp16"), "fp16")
        return replace(m, peak_flops_fp32=scaled(m.peak_flops_fp32, "fp32"),
                       peak_flops_tf32=scaled(m.peak_flops_tf32, "tf32"),
                       peak_flops_bf16=scaled(m.peak_flops_bf16, "bf16"), peak_flops_fp16=half,
                       bandwidth=scaled(m.bandwidth, "bandwidth"))

    def explain(self, spec: GPUSpec) -> tuple[str, str]:
        """``(method, why)`` of a step on ``spec``'s GPU: the method :meth:`method_for` picks and one
        sentence saying why (which measured GPU anchors it, and the figures its choice was made on)."""
        method = self.method_for_spec(spec)
        anchor = self.anchor(spec.name, spec.bandwidth, spec.peak_half("fp16"), spec.calibration is not None)
        factor = self.gpu_factors.get(anchor, self.rule_factor)
        if method == "calibrated":
            ref = "its own calibration" if anchor in self.reference_fractions else (
                "this GPU's median share of its spec sheet (no calibration of it ships)")
            why = (f"step time: the roofline on this GPU's measured peaks (dprobe gpu calibrate) times the factor of "
                   f"the nearest measured GPU, {anchor} (x{factor:.2f}), whose share of its spec sheet is taken from "
                   f"{ref}; p90 widened by the spread between GPUs (x{self._nearest_p90():.2f}, not yet validated "
                   "on a calibrated GPU)")
        elif method == "nearest-factor":
            why = (f"step time: the roofline times the factor of the nearest measured GPU, {anchor} (x{factor:.2f}), "
                   f"its p90 widened by the spread between GPUs left out in turn (x{self._nearest_p90():.2f}); it "
                   "beat the learned correction and the rule on every GPU left out")
        elif method == "learned" and not (self.seen_method and spec.name in self.gpu_factors):
            folds = (self.cv.get("folds") or {}).get("gpu") or []
            versus = ""
            if folds and all("nearest" in f for f in folds):
                near = " / ".join(f"{f['nearest']:.1f}" for f in folds)
                learned = " / ".join(f"{f['model']:.1f}" for f in folds)
                versus = (f"; the nearest measured GPU's factor did not beat it on every GPU left out (MAPE {near} % "
                          f"against {learned} %)")
            why = (f"{METHOD_NOTES['learned']}{versus}; calibrating the GPU (dprobe gpu calibrate) anchors it to "
                   "measured figures")
        else:
            why = METHOD_NOTES[method]
        return method, why

    def _nearest_p90(self) -> float:
        return self.nearest_p90_factor or self.gpu_p90_factor * self.between_gpu_spread()

    def between_gpu_spread(self) -> float:
        """How far one measured GPU's factor lies from the others' (geometric) mean, at most, as a factor:
        what taking a sibling's factor for a GPU risks (1 with fewer than two GPUs)."""
        logs = np.log(list(self.gpu_factors.values()))
        if len(logs) < 2:
            return 1.0
        return float(np.exp(max(abs(logs[i] - np.delete(logs, i).mean()) for i in range(len(logs)))))

    def as_rule(self) -> InferenceStepModel:
        """The same fit scored as the rule (roofline x its factor, the rule's own p90) on every GPU."""
        return replace(self, method="rule", seen_method="", booster_text=None, p90_factor=self.rule_p90_factor)

    def as_gpu_factor(self) -> InferenceStepModel:
        """The same fit scored as the GPU factor (the rule on a GPU without one)."""
        return replace(self, method="rule", seen_method="gpu-factor", booster_text=None,
                       p90_factor=self.rule_p90_factor)

    def as_learned(self) -> InferenceStepModel:
        """The same fit scored as the learned correction on every GPU."""
        return replace(self, method="learned", seen_method="")

    def as_nearest(self) -> InferenceStepModel:
        """The same fit scored as the nearest measured GPU's factor on a GPU of no row (each GPU's own factor
        on its rows)."""
        return replace(self, method="nearest-factor", seen_method="gpu-factor", booster_text=None)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": FEATURES, **asdict(self)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL) -> InferenceStepModel:
        """A model :meth:`save` wrote (plain JSON; the booster in LightGBM's text format: nothing is
        unpickled). A file that is not one raises :class:`InferenceModelError` naming it and why."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InferenceModelError(f"{path}: cannot read an inference model: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise InferenceModelError(f"{path}: not a dprobe inference model (format {got!r}, expected {FORMAT!r})")
        if data.get("features") != FEATURES:
            raise InferenceModelError(f"{path}: fitted on other features than this dprobe's: refit it "
                                      "(python -m dprobe.profiling.coldstart.inference DIR)")
        keys = ("rule_factor", "p90_factor", "rule_p90_factor", "booster_text", "method", "trained_on", "rows")
        missing = [k for k in keys if k not in data]
        if missing:
            raise InferenceModelError(f"{path}: field {missing[0]!r} missing")
        try:
            return cls(**{k: data[k] for k in keys}, cv=dict(data.get("cv") or {}),
                       roofline=str(data.get("roofline", "plain")),
                       gpu_factors={str(k): v for k, v in dict(data.get("gpu_factors") or {}).items()},
                       gpu_p90_factor=data.get("gpu_p90_factor", 1.0), seen_method=str(data.get("seen_method", "")),
                       nearest_p90_factor=data.get("nearest_p90_factor", 0.0),
                       reference_fractions={str(k): {str(f): float(v) for f, v in dict(d).items()}
                                            for k, d in dict(data.get("reference_fractions") or {}).items()})
        except InferenceModelError as exc:
            raise InferenceModelError(f"{path}: {exc}") from exc


_DEFAULT: InferenceStepModel | None = None


def default_model() -> InferenceStepModel:
    """The model shipped with dprobe (``python -m dprobe.profiling.coldstart.inference DIR`` writes it)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = InferenceStepModel.load(DEFAULT_MODEL)
    return _DEFAULT


def load_inference_model(path: str | Path | None = None) -> InferenceStepModel:
    """The model saved at ``path`` (:meth:`InferenceStepModel.load`); None: the shipped one."""
    return default_model() if path is None else InferenceStepModel.load(path)


def _gpu_names(x: pd.DataFrame) -> list[str]:
    return list(x["gpu_name"]) if "gpu_name" in x else [""] * len(x)


def _gpus(x: pd.DataFrame) -> list[tuple[str, float, float, bool]]:
    """Each row's GPU: its spec's name, memory bandwidth, fp16 tensor-core peak and whether it is calibrated."""
    def col(name: str, default: Any) -> list[Any]:
        return list(x[name]) if name in x else [default] * len(x)

    return list(zip(_gpu_names(x), col("gpu_bandwidth", 0.0), col("gpu_peak", 0.0),
                    [bool(c) for c in col("gpu_calibrated", False)], strict=True))


def _predict(model: InferenceStepModel, x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    p50 = x["roof"].to_numpy(dtype=float) * np.exp(model.log_factor(x))
    return p50, p50 * model.p90_factors(x)


def predict_inference_step(est: ReplayEstimate, precision: str, gpu: GPUSpec, *,
                           model: InferenceStepModel | None = None) -> tuple[float, float]:
    """p50 and p90 (seconds) of one inference step (the forward of ``est``'s batch, eval mode, autocast at
    ``precision``) on ``gpu``, from the replay and the GPU's spec sheet (a calibrated GPU's: its measured
    peaks, :meth:`InferenceStepModel.roofline_spec`). ``model``: None for the shipped one; its features are
    put on the replay roofline it was fitted on (``model.roofline``)."""
    if not est.ops:
        raise ValueError("the replay holds no kernels (an estimate from an older dprobe, without ops?)")
    model = model or default_model()
    p50, p90 = predict_frame(feature_frame([est], precision, model.roofline_spec(gpu), model.roofline), model=model)
    return float(p50[0]), float(p90[0])


def predict_frame(x: pd.DataFrame, *, model: InferenceStepModel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """p50 and p90 of each row of :func:`feature_frame` (what :func:`predict_inference_step` does for one
    replay; the cross-validation calls it on its rows' features computed once). Rows computed on another
    replay roofline than the model's are refused."""
    model = model or default_model()
    if x.attrs.get("roofline", model.roofline) != model.roofline:
        raise ValueError(f"features on the {x.attrs['roofline']} roofline, but the model was fitted on the "
                         f"{model.roofline} one: feature_frame(..., roofline={model.roofline!r})")
    return _predict(model, x)


def _specs(runs: pd.DataFrame) -> list[GPUSpec]:
    return [GPUS[g] for g in runs["gpu"]]


def _frame(runs: pd.DataFrame, ests: list[ReplayEstimate], roofline: str = "plain") -> pd.DataFrame:
    if len(runs) != len(ests):
        raise ValueError(f"{len(runs)} rows but {len(ests)} replays")
    return feature_frame(ests, list(runs["precision"]), _specs(runs), roofline)


def _target(runs: pd.DataFrame, x: pd.DataFrame) -> np.ndarray:
    return np.log(runs["step_time_s"].to_numpy(dtype=float) / x["roof"].to_numpy(dtype=float))


def _fit_core(runs: pd.DataFrame, x: pd.DataFrame) -> tuple[float, str, dict[str, float]]:
    """The rule's factor, the booster (LightGBM's text) and each GPU's factor fitted on these rows."""
    import lightgbm as lgb

    y = _target(runs, x)
    data = lgb.Dataset(x[FEATURES], y, feature_name=FEATURES, free_raw_data=True)
    booster = lgb.train(PARAMS, data, BOOST_ROUNDS)
    names = np.array(_gpu_names(x))
    per_gpu = {str(g): float(np.median(np.exp(y[names == g]))) for g in sorted(set(names)) if g}
    return float(np.median(np.exp(y))), booster.model_to_string(), per_gpu


def p90_factor(log_ratios: list[np.ndarray]) -> float:
    """The 90th percentile of held-out log(measured / p50), each left-out group weighed alike, as a
    factor (at least 1)."""
    values = np.concatenate(log_ratios)
    weights = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in log_ratios])
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(np.exp(max(values[order][min(int(np.searchsorted(cum, 0.9)), len(values) - 1)], 0.0)))


def _inner_groups(runs: pd.DataFrame) -> list[np.ndarray]:
    """The rows of each inner fold: each fitting GPU; one GPU: each fifth of the families."""
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    by = "gpu" if runs["gpu"].nunique() > 1 else "family"
    return [test for _, _, test in cv_folds(runs, by=by)]


def _fit(runs: pd.DataFrame, x: pd.DataFrame, roofline: str = "plain") -> InferenceStepModel:
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    runs, x = runs.reset_index(drop=True), x.reset_index(drop=True)
    rule_factor, booster, per_gpu = _fit_core(runs, x)
    y_all = runs["step_time_s"].to_numpy(dtype=float)
    learned_lr, rule_lr = [], []
    for test in _inner_groups(runs):
        train = np.setdiff1d(np.arange(len(runs)), test)
        if len(train) == 0:
            continue
        f, b, _ = _fit_core(runs.iloc[train], x.iloc[train])
        inner = InferenceStepModel(f, 1.0, 1.0, b, "learned", [], len(train))
        learned_lr.append(np.log(y_all[test] / _predict(inner, x.iloc[test])[0]))
        rule_lr.append(np.log(y_all[test] / _predict(inner.as_rule(), x.iloc[test])[0]))
    nearest_lr = _nearest_log_ratios(x, y_all, rule_factor)
    gpu_lr = []  # the GPU factor's spread on families it never saw, on GPUs it has
    for _, train, test in cv_folds(runs, by="family") if runs["family"].nunique() > 1 else []:
        names = np.array(_gpu_names(x))
        factors = {g: float(np.median(y_all[train][names[train] == g] / x["roof"].to_numpy()[train][names[train] == g]))
                   for g in set(names[train])}
        pred = x["roof"].to_numpy()[test] * np.array([factors.get(g, rule_factor) for g in names[test]])
        gpu_lr.append(np.log(y_all[test] / pred))
    learned_p90 = p90_factor(learned_lr) if learned_lr else 1.0
    rule_p90 = p90_factor(rule_lr) if rule_lr else 1.0
    return InferenceStepModel(rule_factor, learned_p90, rule_p90, booster, "learned",
                              sorted(runs["gpu"].unique()), len(runs), roofline=roofline, gpu_factors=per_gpu,
                              gpu_p90_factor=p90_factor(gpu_lr) if gpu_lr else 1.0,
                              nearest_p90_factor=p90_factor(nearest_lr) if nearest_lr else 0.0)


def _nearest_log_ratios(x: pd.DataFrame, y: np.ndarray, rule_factor: float) -> list[np.ndarray]:
    """log(measured / p50) of each fitting GPU's rows predicted by the nearest *other* fitting GPU's factor
    (:meth:`InferenceStepModel.nearest`), one array per GPU: the spread between GPUs that a GPU of no row
    risks (empty with fewer than two GPUs)."""
    names = np.array(_gpu_names(x))
    roof = x["roof"].to_numpy(dtype=float)
    gpus = sorted(g for g in set(names) if g)
    factors = {g: float(np.median(y[names == g] / roof[names == g])) for g in gpus}
    out = []
    for g in gpus if len(gpus) > 1 else []:
        others = InferenceStepModel(rule_factor, 1.0, 1.0, None, "nearest-factor", [], 0,
                                    gpu_factors={o: f for o, f in factors.items() if o != g}, seen_method="gpu-factor")
        mine = names == g
        first = int(np.flatnonzero(mine)[0])
        near = others.nearest(g, float(x["gpu_bandwidth"].iloc[first]), float(x["gpu_peak"].iloc[first]))
        if near is None:
            continue
        out.append(np.log(y[mine] / (roof[mine] * factors[near])))
    return out


def fit(runs: pd.DataFrame, ests: list[ReplayEstimate], roofline: str = "plain") -> InferenceStepModel:
    """Fit on the rows of ``runs`` (:func:`~dprobe.profiling.coldstart.timm_infer.load_timm_infer`'s,
    each with its replay, :func:`~dprobe.profiling.coldstart.timm_infer.with_replays`): the rule's factor,
    the booster, and each one's p90 factor from an inner leave-one-GPU-out over the fitting GPUs (leave a
    fifth of the families out where there is one GPU). The model returned is the learned one
    (:meth:`InferenceStepModel.as_rule` gives the rule). ``roofline``: the replay roofline of its features
    (:data:`~dprobe.profiling.coldstart.features.ROOFLINES`), recorded in the model."""
    return _fit(runs, _frame(runs, ests, roofline), roofline)


@dataclass(frozen=True)
class Scores:
    """One predictor on one fold: MAPE (%), median predicted / measured, Spearman, p90 coverage."""

    mape: float
    median_ratio: float
    spearman: float
    p90_coverage: float


@dataclass(frozen=True)
class FoldResult:
    """One fold left out: its rows and GPUs, and the roofline's, the rule's and the model's scores (each
    fitted on the other folds' rows only). The roofline's p90 is the roofline itself."""

    fold: str
    rows: int
    gpus: tuple[str, ...]
    roofline: Scores
    rule: Scores
    model: Scores
    gpu_factor: Scores
    nearest: Scores | None = None  # the nearest measured GPU's factor, p90 widened by the spread between GPUs
    nearest_sibling: Scores | None = None  # the same p50, p90 widened as the sibling rule widens it


def scores(measured: np.ndarray, p50: np.ndarray, p90: np.ndarray) -> Scores:
    from scipy.stats import spearmanr

    rho = float(spearmanr(p50, measured)[0]) if len(measured) > 1 else float("nan")
    return Scores(float(100 * np.mean(np.abs(p50 - measured) / measured)), float(np.median(p50 / measured)),
                  rho, float(np.mean(measured <= p90)))


def held_out_predictions(runs: pd.DataFrame, ests: list[ReplayEstimate], by: str,
                         roofline: str = "plain") -> pd.DataFrame:
    """Each row of ``runs`` predicted by the fold of :func:`~dprobe.profiling.coldstart.timm_infer.cv_folds`
    (``by="gpu"``: each GPU left out; ``"family"``: a fifth of the families) that leaves it out: the model
    and the rule fitted on the other rows only (their p90 factors from an inner cross-validation of those
    rows), through :func:`predict_frame` (:func:`predict_inference_step`'s path). Columns ``fold``,
    ``measured``, ``roofline``, ``rule_p50``, ``rule_p90``, ``model_p50``, ``model_p90``, ``gpu_factor_p50``,
    ``gpu_factor_p90`` (the GPU's own factor; the rule's on a GPU left out), ``nearest_p50``, ``nearest_p90``
    (the nearest measured GPU's factor on a GPU left out, its p90 from the spread between the fitting GPUs
    left out in turn; the GPU's own factor on a GPU with rows), ``nearest_sibling_p90`` (that p50 with the
    sibling rule's widening: the GPU factor's p90 times the spread between factors) and ``nearest_gpu`` (the
    GPU whose factor it took), in ``runs``' order; ``model`` is the learned correction on every GPU.
    ``roofline``: the replay roofline the features (and the column ``roofline``) are computed on."""
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    runs = runs.reset_index(drop=True)
    x = _frame(runs, ests, roofline)
    out = pd.DataFrame({"fold": "", "measured": runs["step_time_s"].to_numpy(dtype=float),
                        "roofline": x["roof"].to_numpy(dtype=float)})
    for col in ("rule_p50", "rule_p90", "model_p50", "model_p90", "gpu_factor_p50", "gpu_factor_p90",
                "nearest_p50", "nearest_p90", "nearest_sibling_p90"):
        out[col] = np.nan
    out["nearest_gpu"] = ""
    for name, train, test in cv_folds(runs, by=by):
        model = _fit(runs.iloc[train], x.iloc[train], roofline)
        out.loc[test, "fold"] = name
        for kind, m in (("rule", model.as_rule()), ("model", model.as_learned()), ("gpu_factor", model.as_gpu_factor()),
                        ("nearest", model.as_nearest())):
            p50, p90 = predict_frame(x.iloc[test], model=m)
            out.loc[test, f"{kind}_p50"], out.loc[test, f"{kind}_p90"] = p50, p90
        # the same p50 with the sibling rule's widening (the GPU factor's p90 times the spread between factors)
        sibling = replace(model.as_nearest(), nearest_p90_factor=0.0)
        out.loc[test, "nearest_sibling_p90"] = predict_frame(x.iloc[test], model=sibling)[1]
        out.loc[test, "nearest_gpu"] = [model.anchor(*g) for g in _gpus(x.iloc[test])]
    return out


def crossval(runs: pd.DataFrame, ests: list[ReplayEstimate], by: str, roofline: str = "plain") -> list[FoldResult]:
    """The scores of each fold of :func:`held_out_predictions`: the raw roofline's, the rule's and the
    model's, each fitted on the other folds' rows only, all on the replay roofline ``roofline``."""
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    runs = runs.reset_index(drop=True)
    pred = held_out_predictions(runs, ests, by, roofline)
    out = []
    for name, _, test in cv_folds(runs, by=by):
        t = pred.iloc[test]
        y = t["measured"].to_numpy()
        out.append(FoldResult(name, len(test), tuple(sorted(runs["gpu"].iloc[test].unique())),
                              scores(y, t["roofline"].to_numpy(), t["roofline"].to_numpy()),
                              scores(y, t["rule_p50"].to_numpy(), t["rule_p90"].to_numpy()),
                              scores(y, t["model_p50"].to_numpy(), t["model_p90"].to_numpy()),
                              scores(y, t["gpu_factor_p50"].to_numpy(), t["gpu_factor_p90"].to_numpy()),
                              scores(y, t["nearest_p50"].to_numpy(), t["nearest_p90"].to_numpy()),
                              scores(y, t["nearest_p50"].to_numpy(), t["nearest_sibling_p90"].to_numpy())))
    return out


def summarise(results: list[FoldResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean, min and max over folds of each predictor's scores."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ("roofline", "rule", "model", "gpu_factor", "nearest", "nearest_sibling"):
        if any(getattr(r, kind) is None for r in results):
            continue
        vals = [asdict(getattr(r, kind)) for r in results]
        out[kind] = {k: {"mean": float(np.mean([v[k] for v in vals])), "min": float(np.min([v[k] for v in vals])),
                         "max": float(np.max([v[k] for v in vals]))} for k in vals[0]}
    return out


def load_rows(directory: str | Path) -> tuple[pd.DataFrame, list[ReplayEstimate]]:
    """A timm inference folder's channels-first rows that have a replay, and their replays."""
    from dprobe.profiling.coldstart.timm_infer import REPLAYS, load_timm_infer, read_replays, with_replays

    directory = Path(directory)
    runs = load_timm_infer(directory)
    replays = read_replays(directory / REPLAYS)
    if not replays:
        raise FileNotFoundError(f"{directory / REPLAYS}: no replays (python -m dprobe.profiling.coldstart."
                                f"timm_infer {directory})")
    return with_replays(runs, replays)


def choose(folds: dict[str, list[FoldResult]]) -> tuple[str, str]:
    """``(method, seen_method)``: on a GPU never seen the learned correction where its MAPE beat the rule's
    on every GPU left out, else the rule; that one replaced by the nearest measured GPU's factor where its
    MAPE beat it on every GPU left out too; on a GPU with rows the learned correction where it beat the GPU
    factor's on every fifth of the families left out, else the GPU factor."""
    unseen = "learned" if all(f.model.mape < f.rule.mape for f in folds["gpu"]) else "rule"
    current = {"learned": "model", "rule": "rule"}[unseen]
    if folds["gpu"] and all(f.nearest is not None and f.nearest.mape < getattr(f, current).mape for f in folds["gpu"]):
        unseen = "nearest-factor"
    seen = "learned" if all(f.model.mape < f.gpu_factor.mape for f in folds["family"]) else "gpu-factor"
    return unseen, seen


def fit_shipped(directory: str | Path, roofline: str = SHIPPED_ROOFLINE) -> InferenceStepModel:
    """The shipped model: cross-validated by GPU and by family, fitted on every row, each case's method
    chosen fold by fold against its simple rule (:func:`choose`); the figures recorded.
    ``roofline``: the replay roofline of its features (default :data:`SHIPPED_ROOFLINE`)."""
    runs, ests = load_rows(directory)
    folds = {by: crossval(runs, ests, by, roofline) for by in ("gpu", "family")}
    method, seen_method = choose(folds)
    model = fit(runs, ests, roofline)
    model = replace(model, method=method, seen_method=seen_method,
                    p90_factor=model.p90_factor if method == "learned" else model.rule_p90_factor)
    model.cv = {"data": Path(directory).name, **{by: summarise(f) for by, f in folds.items()},
                "folds": {by: [{"fold": r.fold, **{k: asdict(getattr(r, k))["mape"] for k in
                                                   ("roofline", "rule", "model", "gpu_factor", "nearest")
                                                   if getattr(r, k) is not None}} for r in f]
                          for by, f in folds.items()}}
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dprobe.profiling.coldstart.inference",
                                description="Cross-validate the inference step-time model on a folder of timm "
                                "inference benchmarks with their replays (datasets/timm-infer-gpus), refit it "
                                f"on every row and write it ({DEFAULT_MODEL.name} beside this module).")
    p.add_argument("directory", help="the folder of infer-*.csv tables and their replays-infer.jsonl.gz")
    p.add_argument("--out", default=str(DEFAULT_MODEL), help="where to write the model (default: the shipped one)")
    p.add_argument("--roofline", choices=ROOFLINES, default=SHIPPED_ROOFLINE,
                   help=f"the replay roofline of the features (default {SHIPPED_ROOFLINE})")
    args = p.parse_args(argv)
    t0 = time.time()
    model = fit_shipped(args.directory, args.roofline)
    model.save(args.out)
    for by in ("gpu", "family"):
        s = model.cv[by]
        print(f"{by:>6}: MAPE roofline {s['roofline']['mape']['mean']:.1f} %, rule {s['rule']['mape']['mean']:.1f} %, "
              f"GPU factor {s['gpu_factor']['mape']['mean']:.1f} %, learned {s['model']['mape']['mean']:.1f} %")
    print(f"shipped: {model.seen_method} on a GPU with rows ({', '.join(model.gpu_factors)}), {model.method} "
          f"on any other, on the {model.roofline} roofline ({model.rows} rows, "
          f"{', '.join(model.trained_on)}; p90 factor "
          f"{model.p90_factor:.3f}) -> {args.out} in {time.time() - t0:.0f} s")
    return 0


__all__ = ["FEATURES", "SHIPPED_ROOFLINE", "FoldResult", "InferenceModelError", "InferenceStepModel", "Scores", "choose",
           "crossval",
           "default_model", "feature_frame", "fit", "fit_shipped", "held_out_predictions", "inference_features",
           "load_inference_model",
           "load_rows", "main",
           "predict_frame", "predict_inference_step", "scores", "summarise"]


if __name__ == "__main__":
    raise SystemExit(main())
