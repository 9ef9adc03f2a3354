"""Packing workloads onto shared GPUs or MIG slices: the plan the simulator scores and the scaler applies.

A workload's demand: GPU memory (a high quantile of its forecast plus a margin: a hard limit, the sum on a
GPU never exceeds the GPU's memory; optionally a burst above it, for which each GPU keeps room: the sum
plus the largest burst of its tenants, and ``burst_overlap`` of the others' bursts, stays under the GPU's
memory), utilisation (a chosen quantile, 0-1: soft, the sum on a GPU is kept
under ``utilization_target``) and, optionally, the most slowdown it tolerates from its co-tenants
(:mod:`dprobe.sharing.interference`).

A workload without a memory forecast is never packed as if it used nothing: it keeps its request (a
GPU of its own, or its share of one where it asks for a share) and the plan says so. One too big for any
GPU, or whose slowdown limit no GPU meets, is counted as not placed, with the reason.

Policies (workloads sorted by memory, largest first):
``first-fit`` (first-fit decreasing), ``best-fit`` (the GPU left with the least memory), ``fgd``
(the GPU whose expected fragmentation grows least under the workloads' distribution of memory shares,
:func:`dprobe.sharing.fgd.gpu_fragment_table`, empty GPUs included), ``frag-aware`` (FGD's score over the
GPUs already in use, best-fit among equals; a new GPU only when none of them has room).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from dprobe.sharing.fgd import gpu_fragment_table
from dprobe.sharing.interference import InterferenceModel
from dprobe.sharing.mig import GpuModel, MigLayout, MigProfile, smallest_profile

PLANNER_POLICIES = ("first-fit", "best-fit", "frag-aware", "fgd")
BURST_COMBINE = ("max", "rss")
RESOLUTION = 1000  # memory shares are scored on a grid of 1/1000 of a GPU


@dataclass
class Workload:
    """One workload to place. ``memory_bytes``: the memory forecast (high quantile; None or NaN: no
    forecast); ``utilization``: 0-1 (None: unknown, counts as 0 against the target but blocks no one);
    ``request_gpus``: what it asks without sharing (a share < 1, or whole GPUs); ``slowdown_limit``:
    the most slowdown it accepts (0-1, None: any); ``mig_profile``: a MIG profile it asks for by name;
    ``memory_burst_bytes``: more memory it may take for a while beyond ``memory_bytes`` (a GPU keeps room
    for the largest burst of its tenants, one at a time)."""

    name: str
    memory_bytes: float | None
    utilization: float | None = None
    request_gpus: float = 1.0
    slowdown_limit: float | None = None
    mig_profile: str | None = None
    memory_burst_bytes: float = 0.0

    @property
    def has_forecast(self) -> bool:
        return self.forecast_bytes is not None

    @property
    def forecast_bytes(self) -> float | None:
        """``memory_bytes`` as a float where it is a forecast (given and finite), else None."""
        if self.memory_bytes is None or not math.isfinite(float(self.memory_bytes)):
            return None
        return float(self.memory_bytes)


@dataclass(frozen=True)
class PlanSettings:
    """``memory_margin``: a share added to every memory forecast; ``utilization_target``: most summed
    utilisation per GPU; ``policy``: one of :data:`PLANNER_POLICIES`; ``interference``: the slowdown model;
    ``burst_overlap``: the share of the other tenants' bursts a GPU keeps room for besides the largest
    (0: one burst at a time; 1: all at once); ``burst_combine``: ``"max"`` (the largest burst plus
    ``burst_overlap`` of the others') or ``"rss"`` (the root of the sum of the squared bursts, as for a
    quantile of a sum of independent bursts; ``burst_overlap`` is then unused)."""

    memory_margin: float = 0.0
    utilization_target: float = 1.0
    policy: str = "best-fit"
    interference: InterferenceModel = field(default_factory=InterferenceModel)
    burst_overlap: float = 0.0
    burst_combine: str = "max"

    def __post_init__(self) -> None:
        if self.burst_combine not in BURST_COMBINE:
            raise ValueError(f"unknown burst_combine {self.burst_combine!r}; choose from {', '.join(BURST_COMBINE)}")
        if self.policy not in PLANNER_POLICIES:
            raise ValueError(f"unknown packing policy {self.policy!r}; choose from {', '.join(PLANNER_POLICIES)}")
        if not (self.memory_margin >= 0 and math.isfinite(self.memory_margin)):
            raise ValueError(f"memory_margin must be >= 0, got {self.memory_margin!r}")
        if not 0 <= self.burst_overlap <= 1:
            raise ValueError(f"burst_overlap must be between 0 and 1, got {self.burst_overlap!r}")
        if not self.utilization_target > 0:
            raise ValueError(f"utilization_target must be > 0, got {self.utilization_target!r}")


@dataclass
class Placement:
    """Where a workload went: ``gpus`` (indices; empty: not placed), its ``memory_bytes`` as packed, the
    ``mig_profile`` on a MIG GPU, and ``reason`` when it was not packed as asked."""

    workload: str
    gpus: list[int]
    memory_bytes: float
    mig_profile: str | None = None
    reason: str = ""

    @property
    def placed(self) -> bool:
        return bool(self.gpus)


@dataclass
class Plan:
    """The placements in input order and the GPUs they occupy."""

    placements: list[Placement]
    gpus_available: int
    memory_per_gpu: float

    @property
    def gpus_used(self) -> int:
        return len({g for p in self.placements for g in p.gpus})

    @property
    def not_placed(self) -> list[Placement]:
        return [p for p in self.placements if not p.placed]

    def assignment(self) -> np.ndarray:
        """The (first) GPU of each workload, -1 where not placed."""
        return np.array([p.gpus[0] if p.gpus else -1 for p in self.placements], dtype=np.int64)

    def to_dict(self) -> dict:
        return {"gpus_available": self.gpus_available, "gpus_used": self.gpus_used,
                "memory_per_gpu_bytes": self.memory_per_gpu, "not_placed": len(self.not_placed),
                "placements": [{"workload": p.workload, "gpus": p.gpus, "memory_bytes": p.memory_bytes,
                                "mig_profile": p.mig_profile, "reason": p.reason} for p in self.placements]}


def plan(workloads: list[Workload], memory_per_gpu: float, gpus: int | None = None,
         settings: PlanSettings | None = None, previous: list[int] | None = None) -> Plan:
    """Pack ``workloads`` onto ``gpus`` GPUs of ``memory_per_gpu`` bytes each (None: as many as needed,
    one per workload at most). ``previous``: the GPU each workload is on now (-1: none); a workload stays
    there when it still has room, the others are placed by the policy."""
    settings = settings or PlanSettings()
    if previous is not None and len(previous) != len(workloads):
        raise ValueError(f"previous must give one GPU per workload ({len(workloads)}), got {len(previous)}")
    if not (memory_per_gpu is not None and math.isfinite(memory_per_gpu) and memory_per_gpu > 0):
        raise ValueError(f"memory_per_gpu must be a positive number of bytes, got {memory_per_gpu!r}")
    n = len(workloads)
    need = _demands(workloads, memory_per_gpu, settings)
    n_gpus = int(sum(max(1, math.ceil(w.request_gpus)) for w in workloads)) if gpus is None else int(gpus)
    if n_gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    mem_left = np.full(n_gpus, float(memory_per_gpu))
    burst = np.zeros(n_gpus)  # the largest burst of each GPU's tenants
    burst_sum = np.zeros(n_gpus)  # and all of them
    burst_sq = np.zeros(n_gpus)  # and their squares
    util_sum = np.zeros(n_gpus)
    dedicated = np.zeros(n_gpus, dtype=bool)  # a GPU given whole to a workload
    tenants: list[list[int]] = [[] for _ in range(n_gpus)]
    placements: list[Placement | None] = [None] * n
    limited = any(w.slowdown_limit is not None for w in workloads)
    table = None
    if settings.policy in ("fgd", "frag-aware"):
        shares = np.array([m / memory_per_gpu for m, _, whole, _ in need if not whole and m <= memory_per_gpu])
        if len(shares):
            table = gpu_fragment_table(shares, resolution=RESOLUTION)
    order = sorted(range(n), key=lambda i: (-need[i][2], -need[i][0] - workloads[i].memory_burst_bytes, i))
    for i in order:
        w = workloads[i]
        mem, util, whole, reason = need[i]
        extra = float(w.memory_burst_bytes) if whole == 0 and w.has_forecast else 0.0
        if whole:  # whole GPUs of its own
            free = np.flatnonzero((mem_left >= memory_per_gpu) & ~dedicated & (util_sum == 0))[:whole]
            if len(free) < whole:
                placements[i] = Placement(w.name, [], mem, reason=f"{reason}; not enough free GPUs")
                continue
            mem_left[free] = 0.0
            dedicated[free] = True
            for g in free:
                tenants[g].append(i)
            placements[i] = Placement(w.name, free.tolist(), mem, reason=reason)
            continue
        if mem > memory_per_gpu:
            placements[i] = Placement(w.name, [], mem, reason=f"needs {mem / 1e9:.3g} GB, more than one GPU's "
                                      f"{memory_per_gpu / 1e9:.3g} GB")
            continue
        extra = min(extra, memory_per_gpu - mem)  # a burst past the whole GPU cannot be kept room for
        if settings.burst_combine == "rss":
            room = mem_left - np.sqrt(burst_sq + extra * extra)
        else:
            top = np.maximum(burst, extra)
            room = mem_left - top - settings.burst_overlap * (burst_sum + extra - top)
        ok = (room + 1e-6 >= mem) & ~dedicated & (util_sum + util <= settings.utilization_target + 1e-9)
        ok |= (util_sum == 0) & (mem_left >= memory_per_gpu) & ~dedicated  # an empty GPU always takes one
        cand = np.flatnonzero(ok)
        ranked = _rank(cand, room, mem, settings.policy, table, memory_per_gpu,
                       mem_left < memory_per_gpu, not limited)
        chosen = None
        stay = -1 if previous is None else int(previous[i])
        if 0 <= stay < n_gpus and ok[stay]:
            ranked = np.concatenate([[stay], ranked[ranked != stay]])
        for g in ranked:
            if not limited or _slowdowns_ok(workloads, tenants[g] + [i], need, settings.interference):
                chosen = int(g)
                break
        if chosen is None:
            why = "no GPU with room" if not len(cand) else "no GPU meets its or its co-tenants' slowdown limits"
            placements[i] = Placement(w.name, [], mem, reason=why)
            continue
        mem_left[chosen] -= mem
        burst[chosen] = max(burst[chosen], extra)
        burst_sum[chosen] += extra
        burst_sq[chosen] += extra * extra
        util_sum[chosen] += util
        tenants[chosen].append(i)
        placements[i] = Placement(w.name, [chosen], mem, reason=reason)
    return Plan([p for p in placements if p is not None], n_gpus, float(memory_per_gpu))


def _demands(workloads: list[Workload], memory_per_gpu: float,
             settings: PlanSettings) -> list[tuple[float, float, int, str]]:
    """Per workload: memory to pack, utilisation, whole GPUs it keeps (0: packed) and why, if not packed
    as forecast."""
    out = []
    for w in workloads:
        if not (w.request_gpus > 0 and math.isfinite(w.request_gpus)):
            raise ValueError(f"workload {w.name}: request_gpus must be > 0, got {w.request_gpus!r}")
        if w.utilization is not None and not 0 <= w.utilization <= 1:
            raise ValueError(f"workload {w.name}: utilization must be between 0 and 1, got {w.utilization!r}")
        if not (w.memory_burst_bytes >= 0 and math.isfinite(w.memory_burst_bytes)):
            raise ValueError(f"workload {w.name}: memory_burst_bytes must be >= 0, got {w.memory_burst_bytes!r}")
        if w.slowdown_limit is not None and not 0 <= w.slowdown_limit <= 1:
            raise ValueError(f"workload {w.name}: slowdown_limit must be between 0 and 1, got {w.slowdown_limit!r}")
        util = float(w.utilization) if w.utilization is not None else 0.0
        forecast = w.forecast_bytes
        if forecast is not None:
            if forecast < 0:
                raise ValueError(f"workload {w.name}: memory_bytes must be >= 0, got {w.memory_bytes!r}")
            out.append((forecast * (1 + settings.memory_margin), util, 0, ""))
        elif w.request_gpus < 1:
            share = float(w.request_gpus)
            out.append((share * memory_per_gpu, max(util, share), 0,
                        f"no memory forecast: packed at its request ({share:g} of a GPU)"))
        else:
            k = int(math.ceil(w.request_gpus))
            out.append((k * memory_per_gpu, 1.0, k, f"no memory forecast: kept on {k} GPU(s) of its own"))
    return out


def _rank(cand: np.ndarray, mem_left: np.ndarray, mem: float, policy: str, table: np.ndarray | None,
          memory_per_gpu: float, used: np.ndarray, best_only: bool) -> np.ndarray:
    """``cand`` in the order ``policy`` prefers them (only the first, when ``best_only``)."""
    if not len(cand) or policy == "first-fit":
        return cand[:1] if best_only else cand
    if policy == "frag-aware":  # GPUs in use first: a new GPU only when none of them has room
        busy = cand[used[cand]]
        cand = busy if len(busy) else cand[:1]
    left = mem_left[cand] - mem
    if policy == "best-fit" or table is None:
        return cand[[int(np.argmin(left))]] if best_only else cand[np.argsort(left, kind="stable")]
    res = len(table) - 1
    before = table[np.clip(np.floor(mem_left[cand] / memory_per_gpu * res + 1e-9).astype(int), 0, res)]
    after = table[np.clip(np.floor(left / memory_per_gpu * res + 1e-9).astype(int), 0, res)]
    delta = np.round(after - before, 9)
    if policy == "fgd":
        return cand[[int(np.argmin(delta))]] if best_only else cand[np.argsort(delta, kind="stable")]
    if best_only:
        tied = np.flatnonzero(delta == delta.min())
        return cand[[int(tied[np.argmin(left[tied])])]]
    return cand[np.lexsort((left, delta))]


def _slowdowns_ok(workloads: list[Workload], members: list[int], need: list, model: InterferenceModel) -> bool:
    u = np.array([need[j][1] for j in members])
    slow = model.slowdowns(np.clip(u, 0, 1))
    for k, j in enumerate(members):
        limit = workloads[j].slowdown_limit
        if limit is not None and not slow[k] <= limit + 1e-9:
            return False
    return True


def plan_mig(workloads: list[Workload], model: GpuModel, gpus: int | None = None,
             settings: PlanSettings | None = None) -> Plan:
    """Pack ``workloads`` onto MIG instances of ``gpus`` GPUs of ``model``: each gets the profile it asks
    for (a :class:`ValueError` if the GPU has none of that name) or the smallest profile with room for its
    memory (plus the margin) and its utilisation as a share of the SMs, placed where NVIDIA allows it
    (first-fit: the first GPU; otherwise the GPU left with the fewest free memory slices)."""
    settings = settings or PlanSettings()
    if not model.mig_profiles:
        raise ValueError(f"GPU {model.name} has no MIG profiles")
    profiles: list[tuple[MigProfile | None, str]] = []
    for w in workloads:
        if w.mig_profile:
            profiles.append((model.profile(w.mig_profile), ""))
            continue
        forecast = w.forecast_bytes
        if forecast is not None:
            mem = forecast * (1 + settings.memory_margin)
            why = ""
        else:
            mem = min(w.request_gpus, 1.0) * model.memory_bytes
            why = "no memory forecast: sized by its request"
        p = smallest_profile(model, mem, float(w.utilization or 0.0))
        profiles.append((p, why if p else f"needs {mem / 1e9:.3g} GB, more than {model.name}'s largest instance"))
    n_gpus = len(workloads) if gpus is None else int(gpus)
    layouts = [MigLayout(model) for _ in range(n_gpus)]
    placements: list[Placement | None] = [None] * len(workloads)

    def biggest_first(i: int) -> tuple[int, int]:
        profile = profiles[i][0]
        return -(profile.memory_slices if profile else 99), i

    order = sorted(range(len(workloads)), key=biggest_first)
    # GPUs grouped by their layout's state (a few dozen states however many GPUs): whether a profile fits is
    # asked once per state, and each state keeps its GPUs in a heap, lowest index first (a GPU that has
    # moved on to another state is dropped when it reaches the top: states only fill up, never return)
    by_state: dict[tuple, list[int]] = {layouts[0].state(): list(range(n_gpus))} if n_gpus else {}
    state_of = [layouts[0].state()] * n_gpus if n_gpus else []
    fits: dict[tuple[tuple, str], bool] = {}
    for i in order:
        p, why = profiles[i]
        w = workloads[i]
        if p is None:
            placements[i] = Placement(w.name, [], float(w.memory_bytes or 0.0), reason=why)
            continue
        best: tuple | None = None  # first-fit: (GPU,); otherwise (memory slices left over, GPU)
        for key, heap in list(by_state.items()):
            while heap and state_of[heap[0]] != key:
                heapq.heappop(heap)
            if not heap:
                del by_state[key]
                continue
            if (key, p.name) not in fits:
                fits[key, p.name] = layouts[heap[0]].position_for(p) is not None
            if fits[key, p.name]:
                rank = (heap[0],) if settings.policy == "first-fit" else ((8 - sum(key[0])) - p.memory_slices, heap[0])
                best = rank if best is None or rank < best else best
        if best is None:
            placements[i] = Placement(w.name, [], p.memory_bytes, p.name, reason="no GPU with a free slot for "
                                      f"{p.name}")
            continue
        g = best[-1]
        layouts[g].add(p)
        state_of[g] = layouts[g].state()
        heapq.heappush(by_state.setdefault(state_of[g], []), g)
        placements[i] = Placement(w.name, [g], p.memory_bytes, p.name, reason=why)
    return Plan([x for x in placements if x is not None], n_gpus, model.memory_bytes)
