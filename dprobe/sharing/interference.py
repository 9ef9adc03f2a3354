"""Predicted slowdown of jobs that share one GPU, each job its own, and whether they fit in its memory.

:func:`predict_colocation` is the one entry point (``dprobe predict --colocate``, the benchmark and the
validation call it alike): from two jobs' cold-start profiles (``dprobe predict --json`` objects) and the
GPU, each job's speed beside the other (relative to alone) with its p10, by the shipped default:

- the time-share rule ``min(1, 1 / (u_1 + u_2))``: a job beside an idle one runs at full speed, and more
  load beside it never speeds it up. It runs wherever nothing learnt has earned its place: on GPU
  architectures, job classes and utilisations no measured pair covers, and under MPS;
- inside the support of Gavel's measured pairs (datasets/gavel-colocation: K80, P100, V100, i.e. Kepler,
  Pascal, Volta; time-slicing; vision, language, recommendation, reinforcement-learning and generative
  jobs), the per-job model: gradient-boosted trees that give the share of the rule's speed each job keeps,
  from both jobs' profiles (utilisation, step time, host share of the step, share of the GPU's peak FLOP/s
  reached while busy, memory share) and the GPU's peak. The share stays within [0.01, 1] and never rises
  with the partner's load (monotone constraints), so the limits above hold for it too; it is asymmetric
  (A beside B and B beside A are two predictions). It runs there only because it beat the rule on every
  architecture and job class left out in turn (``interference_fitted.json`` records the figures, the
  support and the choice; ``python -m dprobe.sharing.interference_fit --write`` refits it).

The p10 of each speed is the p50 times a factor from left-out-source residuals: for each source (a GPU
architecture, a job class, a lab) the factor that covers 90 % of its jobs, and the most cautious of them.

Memory: the pair fits when both allocator peaks (p50) and a CUDA context each add up to no more than the
GPU's memory ("maybe" when the pair's device memory p90 adds up to more). The pair's device memory is both
jobs' own plus what a second process adds (measured on the co-located H200 pair).

The older contention model (:class:`InterferenceModel`, one speed for both jobs) stays for the packing
planner's slowdown limits. Each job ``i`` alone keeps the GPU busy a share ``u_i`` of its time (NVML's / DCGM's utilisation, 0-1),
and, where known, its memory controller a share ``m_i``. Together, two effects slow it:

- contention: a kernel of ``i`` that finds the GPU taken waits; the chance grows with how busy the others
  are, and the cost with how much of ``i``'s own time is GPU time, so ``i``'s step stretches by
  ``1 + a u_i U_i + b m_i M_i`` (``U_i``, ``M_i``: the others' summed utilisation and memory traffic);
- saturation: the GPU cannot be busy more than all the time; when the jobs' busy shares at those speeds
  add up to more than 1, every job slows further by that sum.

Speed relative to alone is ``1 / stretch / max(1, sum_k u_k / stretch_k)`` and the slowdown is one minus
it. With ``a = b = 0`` this is the saturation bound ``min(1, 1 / (u_1 + u_2))`` alone.

Calibration: ``a`` comes from the one co-located pair measured on an H200 (``datasets/h200-profiles``,
runs ``p00a`` / ``p00b``, time-slicing, no MPS) against the solo run of the same BERT configuration
(:func:`calibrate_from_pair`); one pair fixes one number, so ``a`` is uncertain (see
``docs/sharing.md``). ``b`` (memory traffic) has no measurement yet and defaults to 0. MPS runs kernels of
both jobs at once, so its contention is lower; with no measurement the MPS coefficient is taken as half
the time-slicing one, an assumption ``docs/sharing.md`` flags.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dprobe.sharing.support import Support, job_class

CONTENTION_TIME_SLICING = 0.6  # a, from the H200 pair (plausible range 0.3-1.0: one pair)
MODES = ("time-slicing", "mps")


@dataclass(frozen=True)
class InterferenceModel:
    """Coefficients of the model in the module docstring."""

    contention: float = CONTENTION_TIME_SLICING
    memory_contention: float = 0.0
    mode: str = "time-slicing"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown sharing mode {self.mode!r}; choose from {', '.join(MODES)}")
        if not (self.contention >= 0 and self.memory_contention >= 0):
            raise ValueError("interference coefficients must be >= 0")

    @property
    def effective_contention(self) -> float:
        return self.contention * (0.5 if self.mode == "mps" else 1.0)

    def speeds(self, utilization: np.ndarray, memory_traffic: np.ndarray | None = None) -> np.ndarray:
        """Speed relative to alone (0-1] of each of the jobs sharing one GPU; ``utilization`` and
        ``memory_traffic`` 0-1 per job (memory traffic NaN or None: unknown, no memory term)."""
        u = _ratios(utilization, "utilization")
        others = u.sum() - u
        stretch = 1 + self.effective_contention * u * others
        if memory_traffic is not None and self.memory_contention > 0:
            m = np.nan_to_num(_ratios(memory_traffic, "memory_traffic", allow_nan=True))
            stretch = stretch + self.memory_contention * m * (m.sum() - m)
        busy = float((u / stretch).sum())
        return 1 / stretch / max(1.0, busy)

    def slowdowns(self, utilization: np.ndarray, memory_traffic: np.ndarray | None = None) -> np.ndarray:
        """``1 - speed`` of each job (0: as fast as alone)."""
        return 1 - self.speeds(utilization, memory_traffic)


def _ratios(values: np.ndarray, what: str, allow_nan: bool = False) -> np.ndarray:
    v = np.atleast_1d(np.asarray(values, dtype=np.float64))
    bad = ~np.isfinite(v) if not allow_nan else np.isinf(v)
    if bad.any() or (v[np.isfinite(v)] < 0).any() or (v[np.isfinite(v)] > 1).any():
        raise ValueError(f"{what} must be a share between 0 and 1 per job, got {v.tolist()}")
    return v


def saturation_speeds(utilization: np.ndarray) -> np.ndarray:
    """The baseline ``min(1, 1 / sum u)`` for every job."""
    u = _ratios(utilization, "utilization")
    return np.full(len(u), min(1.0, 1 / max(u.sum(), 1e-12)))


def calibrate_from_pair(speed: float, u_self: float, u_other: float) -> float:
    """The contention coefficient ``a`` that gives a job of utilisation ``u_self`` the measured ``speed``
    beside one of ``u_other`` (below saturation)."""
    if not (0 < speed <= 1) or u_self <= 0 or u_other <= 0:
        raise ValueError("need 0 < speed <= 1 and positive utilisations")
    return (1 / speed - 1) / (u_self * u_other)


PAIR_KEYS = ("lib", "model", "config", "arch", "config_kwargs", "task", "image", "seq", "batch", "precision",
             "optimizer", "phases")


def _solo_match(solo, job):
    match = solo[(solo[list(PAIR_KEYS)] == job[list(PAIR_KEYS)]).all(axis=1)]
    if match.empty:
        return None, False
    same = match[match["collection"] == job["collection"]]
    return (same if len(same) else match).iloc[0], bool(len(same))


def _pairs_and_solo(runs):
    runs = runs.copy()
    for k in PAIR_KEYS:
        runs[k] = runs[k].astype(str).replace("nan", "")
    pairs = runs[runs["kind"] == "colocated"].copy()
    pairs["pair"] = pairs["run_id"].str.replace(r"[a-z]$", "", regex=True)
    return pairs, runs[(runs["kind"] == "train") & (runs["status"] == "ok")]


def evaluate_pairs(runs, model: InterferenceModel | None = None) -> list[dict]:
    """Each co-located job of a ``runs.csv`` frame whose pair has a solo run of both members: its measured
    speed (solo step time over co-located) beside the model's prediction from the two solo utilisations
    alone, no slowdown (1) and the saturation bound."""
    model = model or InterferenceModel()
    pairs, solo = _pairs_and_solo(runs)
    out = []
    for pair_id, members in pairs.groupby("pair"):
        if len(members) != 2:
            continue
        refs = [_solo_match(solo, job) for _, job in members.iterrows()]
        if any(r is None for r, _ in refs):
            continue
        u = np.array([float(r["nvml_gpu_util_pct_mean_2nd_half"]) / 100 for r, _ in refs])
        predicted, saturated = model.speeds(np.clip(u, 0, 1)), saturation_speeds(np.clip(u, 0, 1))
        for k, (_, job) in enumerate(members.iterrows()):
            ref, same = refs[k]
            out.append({"pair": pair_id, "job": job["run_id"], "solo_run": ref["run_id"], "same_collection": same,
                        "utilization_alone": float(u[k]),
                        "speed": float(ref["step_time_median_s"]) / float(job["step_time_median_s"]),
                        "model": float(predicted[k]), "no_slowdown": 1.0, "saturation": float(saturated[k])})
    return out


def pair_calibrations(runs) -> list[dict]:
    """The contention coefficient from each co-located pair of a ``runs.csv`` frame (h200-profiles layout):
    for a pair member with a solo ``train`` run of the same configuration (the same collection preferred),
    its speed beside the other is its solo step time over its co-located one; the other's solo utilisation,
    unknown, follows from the pair's measured utilisation together (``nvml_gpu_util_pct_mean_2nd_half``):
    under the model both jobs stretch by the same factor, so ``u_self s + u_other s = u_together``."""
    pairs, solo = _pairs_and_solo(runs)
    out = []
    for pair_id, members in pairs.groupby("pair"):
        if len(members) != 2:
            continue
        for _, job in members.iterrows():
            ref, same = _solo_match(solo, job)
            if ref is None:
                continue
            speed = float(ref["step_time_median_s"]) / float(job["step_time_median_s"])
            u_self = float(ref["nvml_gpu_util_pct_mean_2nd_half"]) / 100
            together = float(job["nvml_gpu_util_pct_mean_2nd_half"]) / 100
            u_other = together / min(speed, 1.0) - u_self
            row = {"pair": pair_id, "job": job["run_id"], "solo_run": ref["run_id"],
                   "same_collection": same, "speed": speed, "u_self": u_self, "u_other": u_other}
            row["contention"] = (calibrate_from_pair(min(speed, 1.0), u_self, u_other)
                                 if speed > 0 and u_other > 0 else float("nan"))
            out.append(row)
    return out


# --- per-job co-location model ------------------------------------------------------------------------------

FITTED_PATH = Path(__file__).with_name("interference_fitted.json")
FITTED_FORMAT = "dprobe-colocation/2"
CUDA_CONTEXT_BYTES = int(1.37 * (1 << 30))  # a CUDA context on the device, as the cold-start replay counts it
METHODS = ("auto", "per-job", "time-share", "contention")
# the per-job model's inputs: the job's own profile ("self"), the other's, and the GPU's
FEATURES = ("u_self", "log_step_self", "host_share_self", "flops_share_self", "memory_share_self",
            "u_other", "log_step_other", "host_share_other", "flops_share_other", "memory_share_other",
            "log_step_ratio", "log_gpu_flops")
# the partner's load: the per-job model's share of the time-share speed never rises with these (LightGBM's
# monotone constraints), so more load beside a job never speeds it up
PARTNER_LOAD = ("u_other", "flops_share_other", "memory_share_other")
SPEED_FLOOR = 0.01  # the per-job model's share of the time-share speed is kept within [SPEED_FLOOR, 1]
INTERVAL_LEVEL = 0.9  # the speed interval's lower end is its p10: a job runs at least that fast 9 times in 10


@dataclass(frozen=True)
class GPU:
    """What the co-location model reads of a GPU: its memory, peak fp32 FLOP/s and memory bandwidth."""

    memory_bytes: float
    fp32_flops: float
    bandwidth: float = 0.0
    name: str = ""

    @staticmethod
    def of(value: GPU | dict[str, Any]) -> GPU:
        """A :class:`GPU` from itself, a dict with its fields, or a ``gpu_spec`` of ``dprobe predict --json``
        (``memory_gib``, ``fp32_tflops``, ``bandwidth_gbps``)."""
        if isinstance(value, GPU):
            return value
        if "memory_gib" in value:
            return GPU(float(value["memory_gib"]) * (1 << 30), float(value["fp32_tflops"]) * 1e12,
                       float(value.get("bandwidth_gbps", 0.0)) * 1e9, str(value.get("name", "")))
        return GPU(float(value["memory_bytes"]), float(value["fp32_flops"]), float(value.get("bandwidth", 0.0)),
                   str(value.get("name", "")))


def gpu_of(profile: dict[str, Any]) -> GPU:
    """The GPU a ``dprobe predict --json`` profile was predicted for (its ``gpu_spec``); a ValueError when it
    has none."""
    spec = profile.get("gpu_spec")
    if not isinstance(spec, dict):
        raise ValueError("the job's profile names no GPU (no gpu_spec): give the GPU")
    return GPU.of(spec)


def _p50(profile: dict[str, Any], key: str, job: str) -> float:
    value = profile.get(key)
    if not isinstance(value, dict) or "p50" not in value:
        raise ValueError(f"{job}: its profile has no {key} p50")
    v = float(value["p50"])
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{job}: its {key} p50 is {v}")
    return v


def job_features(profile: dict[str, Any], gpu: GPU, job: str = "job") -> dict[str, float]:
    """A job's own inputs to the per-job model, from its profile on ``gpu``: utilisation (p50, 0-1), log
    step time, the host's share of the replayed step, the share of the GPU's fp32 peak its kernels reach
    while busy (FLOPs over busy time), its device memory as a share of the GPU's."""
    u = min(_p50(profile, "gpu_utilization", job), 1.0)
    step = max(_p50(profile, "step_time_seconds", job), 1e-6)
    memory = _p50(profile, "device_memory_bytes", job)
    an = profile.get("analytical") or {}
    busy = float(an.get("gpu_seconds_per_step") or 0.0)
    host = float(an.get("host_seconds_per_step") or 0.0)
    replayed = float(an.get("step_time_seconds") or 0.0) or max(busy, host, 1e-9)
    flops = float(an.get("flops_per_step") or 0.0)
    return {"u": u, "log_step": math.log(step), "host_share": min(host / replayed, 1.0) if replayed > 0 else 0.0,
            "flops_share": flops / (busy * gpu.fp32_flops) if busy > 0 and gpu.fp32_flops > 0 else 0.0,
            "memory_share": memory / gpu.memory_bytes}


def pair_features(profile_a: dict[str, Any], profile_b: dict[str, Any], gpu: GPU) -> np.ndarray:
    """The per-job model's input (order of :data:`FEATURES`) for job A beside job B."""
    a, b = job_features(profile_a, gpu, "job A"), job_features(profile_b, gpu, "job B")
    own = [a[k] for k in ("u", "log_step", "host_share", "flops_share", "memory_share")]
    other = [b[k] for k in ("u", "log_step", "host_share", "flops_share", "memory_share")]
    return np.array([*own, *other, a["log_step"] - b["log_step"], math.log(max(gpu.fp32_flops, 1.0))])


def time_share(u_self: float, u_other: float) -> float:
    """The time-share rule: ``min(1, 1 / (u_self + u_other))``, the speed of either job of a pair when the
    GPU can be busy no more than all the time (1 when the partner is idle)."""
    return min(1.0, 1.0 / max(u_self + u_other, 1e-12))


@dataclass(frozen=True)
class Trees:
    """A boosted ensemble of regression trees as arrays (one row per tree, padded): a node's feature
    (-1: a leaf), threshold (go left when the value is at most it, or when it is NaN and ``nan_left``),
    children and value. The prediction is the sum of the leaves reached."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    nan_left: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The ensemble's prediction for rows ``x`` (n, features)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        trees = np.arange(self.feature.shape[0])
        node = np.zeros((x.shape[0], len(trees)), dtype=np.int64)
        for _ in range(self.feature.shape[1]):
            f = self.feature[trees, node]
            leaf = f < 0
            if leaf.all():
                break
            v = np.take_along_axis(x, np.maximum(f, 0), axis=1)
            go_left = np.where(np.isnan(v), self.nan_left[trees, node], v <= self.threshold[trees, node])
            node = np.where(leaf, node, np.where(go_left, self.left[trees, node], self.right[trees, node]))
        return self.value[trees, node].sum(axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k).tolist() for k in ("feature", "threshold", "left", "right", "value", "nan_left")}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Trees:
        return Trees(np.asarray(d["feature"], dtype=np.int64), np.asarray(d["threshold"], dtype=np.float64),
                     np.asarray(d["left"], dtype=np.int64), np.asarray(d["right"], dtype=np.int64),
                     np.asarray(d["value"], dtype=np.float64), np.asarray(d["nan_left"], dtype=bool))


@dataclass(frozen=True)
class FittedColocation:
    """The per-job model and what its validation decided.

    ``trees`` give the share of the time-share speed a job keeps beside another (a bounded residual on the
    rule: within [SPEED_FLOOR, 1], never rising with the partner's load). ``per_job_default``: it beat the
    rule on every source left out inside its ``support`` (each GPU architecture, each job class), so ``auto``
    runs it there. ``speed_p10_ratio``: per method, the factor on the p50 speed that gives its p10, from
    left-out-source residuals (the most cautious source's). ``sharing_extra_bytes``: what a second process on
    the GPU adds to the two jobs' own device memory (measured pairs). ``summary``: the figures."""

    trees: Trees
    per_job_default: bool
    support: Support = Support()
    speed_p10_ratio: dict[str, float] = field(default_factory=dict)
    sharing_extra_bytes: float = 0.0
    gpus: tuple[str, ...] = ()
    summary: dict[str, Any] | None = None

    def share(self, profile_a: dict[str, Any], profile_b: dict[str, Any], gpu: GPU) -> float:
        """The share of the time-share speed job A keeps beside job B, in [SPEED_FLOOR, 1]."""
        raw = float(self.trees.predict(pair_features(profile_a, profile_b, gpu)[None, :])[0])
        return float(np.clip(raw, SPEED_FLOOR, 1.0))

    def speed(self, profile_a: dict[str, Any], profile_b: dict[str, Any], gpu: GPU) -> float:
        """Job A's predicted speed beside job B (relative to alone): the time-share rule times :meth:`share`.
        Below the lowest utilisation the model was fitted on, the partner's effect fades in proportion to
        its utilisation, to none beside an idle partner (speed 1)."""
        u_a = min(_p50(profile_a, "gpu_utilization", "job A"), 1.0)
        u_b = min(_p50(profile_b, "gpu_utilization", "job B"), 1.0)
        low = self.support.min_utilization
        fade = min(1.0, u_b / low) if low > 0 else float(u_b > 0)
        return time_share(u_a, u_b) * (1.0 - fade * (1.0 - self.share(profile_a, profile_b, gpu)))


def load_fitted(path: str | Path | None = None) -> FittedColocation:
    """The shipped per-job model (``interference_fitted.json``), or the one at ``path``."""
    return _load_fitted(str(Path(path) if path else FITTED_PATH))


@lru_cache(maxsize=4)
def _load_fitted(path: str) -> FittedColocation:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FITTED_FORMAT:
        raise ValueError(f"{path}: not a dprobe co-location model of this version (format {data.get('format')!r}, "
                         f"expected {FITTED_FORMAT!r}: refit with python -m dprobe.sharing.interference_fit --write)")
    if tuple(data["features"]) != FEATURES:
        raise ValueError(f"{path}: fitted on features {data['features']}, this dprobe computes {list(FEATURES)}")
    return FittedColocation(Trees.from_dict(data["trees"]), bool(data["per_job_default"]),
                            Support.from_dict(data.get("support")),
                            {k: float(v) for k, v in data.get("speed_p10_ratio", {}).items()},
                            float(data.get("sharing_extra_bytes", 0.0)), tuple(data.get("gpus", ())),
                            data.get("summary"))


def memory_fit(profile_a: dict[str, Any], profile_b: dict[str, Any], gpu: GPU,
               sharing_extra_bytes: float = 0.0) -> dict[str, Any]:
    """Whether two jobs fit together in ``gpu``'s memory: "no" when their allocator peaks (p50) and a CUDA
    context each add up to more than it, "maybe" when the pair's device memory p90 does, else "yes".

    The pair's device memory (what NVML shows with both on the GPU) is both jobs' own (each with its CUDA
    context) plus ``sharing_extra_bytes``, what a second process adds (measured on co-located pairs)."""
    peaks = [_p50(p, "peak_memory_bytes", j) for p, j in ((profile_a, "job A"), (profile_b, "job B"))]
    need = sum(peaks) + 2 * CUDA_CONTEXT_BYTES
    device = {q: sum(float(p["device_memory_bytes"].get(q, p["device_memory_bytes"]["p50"]))
                     for p in (profile_a, profile_b)) + sharing_extra_bytes for q in ("p50", "p90")}
    fits = "no" if need > gpu.memory_bytes else "maybe" if device["p90"] > gpu.memory_bytes else "yes"
    return {"fits": fits, "peaks_and_contexts_bytes": float(need), "device_memory_bytes": device,
            "sharing_extra_bytes": float(sharing_extra_bytes), "gpu_memory_bytes": float(gpu.memory_bytes)}


def predict_colocation(profile_a: dict[str, Any], profile_b: dict[str, Any], gpu: GPU | dict[str, Any] | None = None,
                       method: str = "auto", mode: str = "time-slicing",
                       fitted: FittedColocation | None = None) -> dict[str, Any]:
    """Each job's speed beside the other (relative to alone, 0-1] with its p10, its slowdown, and whether the
    two fit in the GPU's memory, from their cold-start profiles (``dprobe predict --json`` objects:
    utilisation, step time, memory, the replay's ``analytical`` figures, the model's name).

    ``gpu``: a :class:`GPU` or a dict of its fields (default: the first profile's ``gpu_spec``).
    ``method``: "auto" (the shipped default: the per-job model for pairs inside its support where its
    validation chose it, else the time-share rule), "per-job", "time-share" (``min(1, 1 / (u_1 + u_2))``),
    "contention" (the older symmetric :class:`InterferenceModel`). ``mode``: "time-slicing" or "mps" (the
    per-job model learnt time-slicing's context switches; under MPS kernels of both jobs run at once and
    "auto" keeps the time-share bound alone). ``fitted``: the per-job model (default: the shipped one).

    The output says which method ran and why (``method``, ``why``), whether the pair is inside the per-job
    model's support (``support``), each job's class, and the p10 of each speed (``speeds_p10``).
    """
    if method not in METHODS:
        raise ValueError(f"unknown co-location method {method!r}; choose from {', '.join(METHODS)}")
    if mode not in MODES:
        raise ValueError(f"unknown sharing mode {mode!r}; choose from {', '.join(MODES)}")
    gpu = gpu_of(profile_a) if gpu is None else GPU.of(gpu)
    u = np.array([min(_p50(p, "gpu_utilization", j), 1.0) for p, j in ((profile_a, "job A"), (profile_b, "job B"))])
    classes = (job_class(profile_a.get("model")), job_class(profile_b.get("model")))
    fitted = fitted or load_fitted()
    outside = fitted.support.reasons_outside(gpu.name, classes, (float(u[0]), float(u[1])))
    chosen, why = method, "asked for"
    if method == "auto":
        if mode == "mps":
            chosen, why = "time-share", ("MPS: kernels of both jobs run at once; the per-job model learnt "
                                         "time-slicing, so only the time-share bound is applied (no pair was "
                                         "measured under MPS)")
        elif not fitted.per_job_default:
            chosen, why = "time-share", "the per-job model did not beat the time-share rule on every left-out source"
        elif outside:
            chosen, why = "time-share", "outside the per-job model's support: " + "; ".join(outside)
        else:
            chosen, why = "per-job", ("inside its support, where it beat the time-share rule on every left-out "
                                      "GPU architecture and job class")
    if chosen == "per-job":
        speeds = np.array([fitted.speed(profile_a, profile_b, gpu), fitted.speed(profile_b, profile_a, gpu)])
    elif chosen == "time-share":
        speeds = saturation_speeds(u)
    else:
        speeds = InterferenceModel(mode=mode).speeds(u)
    ratio = fitted.speed_p10_ratio.get(chosen, fitted.speed_p10_ratio.get("time-share", 1.0))
    low = np.clip(speeds * ratio, 0.0, speeds)
    return {"speeds": [float(s) for s in speeds], "speeds_p10": [float(s) for s in low],
            "slowdowns": [float(1 - s) for s in speeds], "slowdowns_p90": [float(1 - s) for s in low],
            "utilization": [float(x) for x in u], "classes": list(classes), "method": chosen, "why": why,
            "support": {"inside": not outside, "outside": outside}, "sharing_mode": mode,
            "time_share_speed": float(saturation_speeds(u)[0]),
            **memory_fit(profile_a, profile_b, gpu, fitted.sharing_extra_bytes)}
