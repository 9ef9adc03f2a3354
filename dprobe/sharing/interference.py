"""Predicted slowdown of jobs that share one GPU (time-slicing or MPS), from their utilisation alone.

Each job ``i`` alone keeps the GPU busy a share ``u_i`` of its time (NVML's / DCGM's utilisation, 0-1),
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

from dataclasses import dataclass

import numpy as np

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
