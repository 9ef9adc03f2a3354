"""Pods packed onto shared GPUs by policy and scored against what they did afterwards (``dprobe simulate
sharing``).

Every ``interval`` steps the present pods are repacked (:func:`dprobe.sharing.planner.plan`) from the
demand a policy sees at that moment: GPU memory (hard: the sum on a GPU stays under its memory) and duty
cycle (soft: the sum stays under 100 %). Until the next repack each pod stays where it was put, and every
step is scored with the pods' measured memory and duty cycle: GPUs in use, pods on a GPU whose measured
memory adds up to more than its capacity, GPUs whose measured duty cycles add up to more than 100 %, and
pods moved at each repack. A pod that appears between repacks gets a GPU of its own until the next.

Only each pod's test span is scored (from ``Split.test_start`` of its own series on, and not before the
same share of the whole trace): the forecaster never trained or validated on it. History before it is
what the policies read. The validation span (``span="validation"``) is there to choose settings on.

:func:`simulate_policies` is the one entry point (``dprobe simulate sharing``, the benchmark and the
cross-validation of :mod:`dprobe.sim.sharing.cv` call it alike); :class:`SharingSettings` holds its
defaults, the shipped ones.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dprobe.core.split import Split
from dprobe.sharing.planner import Plan, PlanSettings, Workload, plan
from dprobe.sim.sharing.settings import GUARD_MODES, SHARING_POLICIES, SharingSettings
from dprobe.sim.sharing.settings import RULES as RULES  # re-exported: its names are the settings module's

if TYPE_CHECKING:  # pandas with it: not for dprobe simulate sharing --help
    from dprobe.forecaster.base import Forecaster

HISTORY_SECONDS = 2 * 3600.0  # the peak policies' look-back


@dataclass
class PodSeries:
    """Pods on one global grid: ``memory`` (bytes) and ``duty`` (percent) ``(P, T)`` with NaN at gaps
    and outside each pod's span, covariates ``(P, T, C)``, each pod's first scored step and end."""

    ids: list[str]
    memory: np.ndarray
    duty: np.ndarray
    covariates: np.ndarray
    covariate_names: tuple[str, ...]
    first: np.ndarray  # first step of each pod's span
    end: np.ndarray  # one past its last step
    scored_from: np.ndarray  # first scored step of each pod
    scored_to: np.ndarray  # one past its last scored step
    eval_start: int
    eval_end: int
    step_seconds: float
    unseen_from: np.ndarray | None = None  # first step of each pod no forecaster trained on (its validation span)

    @property
    def steps(self) -> int:
        return self.memory.shape[1]

    def cell(self, pods: np.ndarray, start: int, end: int) -> PodSeries:
        """The same series scored only for ``pods`` (a boolean mask or indices) from step ``start`` to
        ``end``, and for each of them not before its ``unseen_from``: one fold of a cross-validation. The
        arrays are shared, so pod indices (and forecasts cached by them) stay the same."""
        keep = np.zeros(len(self.ids), dtype=bool)
        keep[pods] = True
        start, end = max(0, int(start)), min(self.steps, int(end))
        unseen = self.scored_from if self.unseen_from is None else self.unseen_from
        scored_from = np.maximum(unseen, start)
        scored_to = np.where(keep, np.minimum(self.end, end), scored_from)
        return replace(self, scored_from=scored_from, scored_to=np.maximum(scored_to, scored_from),
                       eval_start=start, eval_end=end)

    def scored_pods(self) -> np.ndarray:
        """Indices of the pods scored at some step."""
        return np.flatnonzero(self.scored_to > self.scored_from)

    def filled(self, values: np.ndarray) -> np.ndarray:
        """``values`` with gaps inside each pod's span carried forward (then backward from its first
        measurement): what the pod held at a step nobody measured."""
        out = values.copy()
        for p in range(len(out)):
            span = out[p, self.first[p]:self.end[p]]
            ok = np.isfinite(span)
            if not ok.any():
                span[:] = 0.0
                continue
            idx = np.where(ok, np.arange(len(span)), 0)
            np.maximum.accumulate(idx, out=idx)
            filled = span[idx]
            filled[: int(np.argmax(ok))] = span[int(np.argmax(ok))]
            out[p, self.first[p]:self.end[p]] = filled
        return out


def pod_series(dataset, split: Split | None = None, span: str = "test") -> PodSeries:
    """A :class:`~dprobe.data.common.SeriesDataset` of the ``alibaba-genai-2026`` layout on one grid, scored
    on each pod's ``test`` span (the default) or its ``validation`` span (to choose settings on)."""
    split = split or Split()
    if span not in ("test", "validation"):
        raise ValueError(f"span must be 'test' or 'validation', got {span!r}")
    frame = dataset.frame
    for col in ("gpu_memory_bytes", "gpu_duty_cycle_pct"):
        if col not in frame:
            raise ValueError(f"{dataset.name}: dprobe simulate sharing needs per-pod {col} (missing)")
    origin = frame["ds"].min()
    step = dataset.freq.total_seconds()
    t = np.round((frame["ds"] - origin).dt.total_seconds().to_numpy() / step).astype(np.int64)
    ids = sorted(frame["unique_id"].unique())
    index = {u: i for i, u in enumerate(ids)}
    p = frame["unique_id"].map(index).to_numpy()
    n_steps = int(t.max()) + 1
    shape = (len(ids), n_steps)
    memory, duty = np.full(shape, np.nan), np.full(shape, np.nan)
    memory[p, t] = frame["gpu_memory_bytes"].to_numpy(np.float64)
    duty[p, t] = frame["gpu_duty_cycle_pct"].to_numpy(np.float64)
    names = tuple(dataset.covariates)
    cov = np.full((*shape, len(names)), np.nan)
    for c, name in enumerate(names):
        cov[p, t, c] = frame[name].to_numpy(np.float64)
    measured = np.isfinite(memory) | np.isfinite(duty)
    first = np.argmax(measured, 1)
    end = n_steps - np.argmax(measured[:, ::-1], 1)
    lengths = end - first
    test_from = np.maximum(first + np.array([split.test_index(int(n)) for n in lengths]), split.test_index(n_steps))
    unseen = first + np.array([split.validation_index(int(n)) for n in lengths])
    if span == "test":
        eval_start, eval_end, scored_from, scored_to = split.test_index(n_steps), n_steps, test_from, end
    else:
        eval_start, eval_end = split.validation_index(n_steps), split.test_index(n_steps)
        scored_from = np.maximum(unseen, eval_start)
        scored_to = np.minimum(np.minimum(test_from, end), eval_end)
    return PodSeries(ids, memory, duty, cov, names, first, end, scored_from, scored_to, eval_start, eval_end, step,
                     unseen)


class SharingPolicy:
    """Demand of the pods to pack at step ``t``: memory (bytes, NaN: unknown), duty (percent) and, where
    the policy keeps room for them, memory bursts (bytes beyond the memory, see ``Workload``)."""

    name = "policy"

    def demand(self, series: PodSeries, pods: np.ndarray, t: int, interval: int) -> tuple[np.ndarray, ...]:
        raise NotImplementedError


class OnePerGpu(SharingPolicy):
    """No sharing: every pod keeps a GPU of its own (the reference for GPU-hours)."""

    name = "one-per-gpu"


class PeakOfHistory(SharingPolicy):
    """Each pod's peak memory over the last ``window`` steps plus ``headroom``, and the ``duty_quantile``
    of its duty cycle over the same steps."""

    def __init__(self, window: int, headroom: float = 0.0, duty_quantile: float = 0.9, label: str = "2h") -> None:
        self.window = int(window)
        self.headroom = float(headroom)
        self.duty_quantile = float(duty_quantile)
        self.name = f"peak-{label}" + (f"+{100 * headroom:g}%" if headroom else "")

    def demand(self, series, pods, t, interval):
        lo = max(0, t - self.window)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mem = np.nanmax(series.memory[pods, lo:t], 1) if t > lo else np.full(len(pods), np.nan)
            duty = (np.nanquantile(series.duty[pods, lo:t], self.duty_quantile, 1) if t > lo
                    else np.full(len(pods), np.nan))
        return mem * (1 + self.headroom), duty, np.zeros(len(pods))


class ForecastDemand(SharingPolicy):
    """The ``memory_quantile`` (and ``duty_quantile``) of a forecaster's forecasts over the next interval,
    its largest over the leads; plus ``margin`` on memory. With ``burst_quantile``, each pod's burst is
    the larger of that quantile of its forecast (plus the margin) and its own peak over the last
    ``burst_history`` steps, less its memory demand: the GPU keeps room for its tenants' largest burst.
    ``cache``: forecasts kept per pod and step, shared by policies of the same forecaster and context."""

    def __init__(self, name: str, forecaster: Forecaster, context: int, memory_quantile: float,
                 duty_quantile: float, margin: float = 0.0, covariates: tuple[str, ...] = (),
                 max_lead_steps: int | None = None, burst_quantile: float | None = None, burst_history: int = 0,
                 cache: dict | None = None) -> None:
        self.burst_quantile = burst_quantile
        self.burst_history = int(burst_history)
        self.name = name
        self.forecaster = forecaster
        self.context = int(context)
        self.memory_quantile, self.duty_quantile = memory_quantile, duty_quantile
        self.margin = float(margin)
        self.covariates = covariates
        self.max_lead_steps = max_lead_steps  # the forecaster's longest lead, in the series' steps
        self._cache: dict = {} if cache is None else cache  # shared: by policies of one forecaster and context

    def quantile(self, series: PodSeries, values: np.ndarray, pods: np.ndarray, t: int, interval: int,
                 metric: str, level: float) -> np.ndarray:
        """The forecast's quantile nearest ``level`` of ``values`` (``metric``) for ``pods`` at ``t``, its largest
        over the leads 1 to ``interval``; NaN for a pod without history. Forecasts are kept per pod and step,
        so runs over the same series (folds, settings) forecast each pod once."""
        leads = tuple(range(1, min(interval, self.max_lead_steps or interval) + 1))
        key = (id(values), metric, t, len(leads))
        if key not in self._cache:  # the entry holds ``values``: its id is not reused while the entry lives
            self._cache[key] = (np.full((len(values), 0), np.nan), np.zeros(len(values), dtype=bool), (), values)
        table, done, levels, _ = self._cache[key]
        todo = pods[~done[pods]]
        if len(todo):
            fc, fc_levels = self._forecast(series, values, todo, t, leads, metric)
            if not levels:
                levels = fc_levels
                table = np.full((len(values), len(levels)), np.nan)
            if fc is not None:
                table[todo] = fc
            done[todo] = True
            self._cache[key] = (table, done, levels, values)
        if not levels:
            return np.full(len(pods), np.nan)
        k = int(np.argmin(np.abs(np.asarray(levels) - level)))
        return table[pods, k]

    def _forecast(self, series: PodSeries, values: np.ndarray, pods: np.ndarray, t: int, leads: tuple[int, ...],
                  metric: str) -> tuple[np.ndarray | None, tuple[float, ...]]:
        """Every quantile's largest over ``leads`` per pod (NaN: no history), and the quantile levels."""
        lo = max(0, t - self.context)
        window = values[pods, lo:t]
        cov = None
        if self.covariates:
            idx = [series.covariate_names.index(c) for c in self.covariates]
            cov = series.covariates[pods, lo:t][..., idx]
        has = np.isfinite(window).any(1)
        if not has.any():
            return None, ()
        from dprobe.forecaster.base import ForecastInput

        fc = self.forecaster.predict(ForecastInput(values=window[has], metric=metric, leads=leads,
                                                   step_seconds=series.step_seconds,
                                                   covariates=None if cov is None else cov[has]))
        out = np.full((len(pods), len(fc.quantile_levels)), np.nan)
        out[has] = fc.quantiles.max(1)
        return out, tuple(float(q) for q in fc.quantile_levels)

    def demand(self, series, pods, t, interval):
        mem = self.quantile(series, series.memory, pods, t, interval, "gpu_memory_bytes", self.memory_quantile)
        duty = self.quantile(series, series.duty, pods, t, interval, "gpu_duty_cycle_pct", self.duty_quantile)
        mem = np.clip(mem, 0, None) * (1 + self.margin)
        burst = np.zeros(len(pods))
        if self.burst_quantile is not None:
            high = self.quantile(series, series.memory, pods, t, interval, "gpu_memory_bytes", self.burst_quantile)
            lo = max(0, t - self.burst_history)
            seen = (np.where(np.isfinite(series.memory[pods, lo:t]), series.memory[pods, lo:t], 0.0).max(1)
                    if t > lo else np.zeros(len(pods)))
            burst = np.nan_to_num(np.maximum(high * (1 + self.margin), seen) - mem).clip(0, None)
        return mem, np.clip(duty, 0, 100), burst


class GuardedPeak(SharingPolicy):
    """Peak packing with a forecast guard. Each pod's size is its peak of history (``peak``), raised to the
    ``quantile`` of ``forecast`` over the coming interval plus ``margin`` where that is higher; its duty
    cycle is the peak policy's. ``mode="always"``: those sizes, whatever GPUs they take. ``mode="free"``: the
    guard only as far as it costs no GPU: at each repack the simulator makes peak packing's plan (from peak
    packing's own state, tracked alongside) and repairs it under the whole guard, then under ``steps`` of
    each pod's rise above its peak (a half, a quarter): pods stay where their guarded size still fits, the
    others move; the first repair that needs no more GPUs is kept, else peak packing's plan as it is
    (:meth:`alternatives`). With ``swap``, pods the whole guard still finds over their GPU's memory are then
    moved or swapped between GPUs where that lowers the overflow the guard sees and keeps every GPU within
    peak packing's limits."""

    def __init__(self, name: str, peak: PeakOfHistory, forecast: ForecastDemand, quantile: float = 0.99,
                 margin: float = 0.0, mode: str = "free", steps: tuple[float, ...] = (1.0, 0.5, 0.25),
                 swap: bool = False) -> None:
        if mode not in GUARD_MODES:
            raise ValueError(f"unknown guard mode {mode!r}; choose from {', '.join(GUARD_MODES)}")
        self.name, self.peak, self.forecast = name, peak, forecast
        self.quantile, self.margin, self.mode, self.swap = float(quantile), float(margin), mode, bool(swap)
        self.steps = tuple(float(x) for x in steps)

    def _parts(self, series, pods, t, interval) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mem, duty, _ = self.peak.demand(series, pods, t, interval)
        high = self.forecast.quantile(series, series.memory, pods, t, interval, "gpu_memory_bytes", self.quantile)
        rise = np.nan_to_num(high * (1 + self.margin) - mem).clip(0, None)  # no peak: a GPU of its own anyway
        return mem, duty, rise

    def demand(self, series, pods, t, interval):
        mem, duty, rise = self._parts(series, pods, t, interval)
        return mem + rise, duty, np.zeros(len(pods))

    def alternatives(self, series, pods, t, interval) -> list[tuple[np.ndarray, ...]]:
        """Demands to pack, most guarded first and peak packing's last: the simulator repairs the last one's
        plan under the others in turn (:func:`simulate_sharing`). Only the whole guard with ``mode="always"``."""
        mem, duty, rise = self._parts(series, pods, t, interval)
        zero = np.zeros(len(pods))
        if self.mode == "always":
            return [(mem + rise, duty, zero)]
        if not rise.any():
            return [(mem, duty, zero)]
        return [(mem + f * rise, duty, zero) for f in self.steps if f > 0] + [(mem, duty, zero)]


class PartialHindsight(SharingPolicy):
    """A forecast policy with one part of its demand taken from what the pods measured over the coming
    interval (hindsight): how far a better forecast of that part alone could go. ``part="level"``: each
    pod's size is its measured median (its burst room still reaches the policy's burst top);
    ``part="burst"``: its burst room reaches its measured peak."""

    def __init__(self, base: ForecastDemand, filled_memory: np.ndarray, part: str) -> None:
        if part not in ("level", "burst"):
            raise ValueError(f"part must be 'level' or 'burst', got {part!r}")
        self.base, self.memory, self.part = base, filled_memory, part
        self.name = f"{base.name} with hindsight {part}"

    def demand(self, series, pods, t, interval):
        mem, duty, burst = self.base.demand(series, pods, t, interval)
        future = self.memory[pods, t:min(series.steps, t + interval)]
        if self.part == "level":
            level = np.nanmedian(future, 1)  # a pod present at t is measured (or carried) at t
            return level, duty, np.nan_to_num(mem + burst - level).clip(0, None)
        return mem, duty, np.nan_to_num(np.nanmax(future, 1) - mem).clip(0, None)


class Oracle(SharingPolicy):
    """Each pod's measured peak memory and ``duty_quantile`` of its duty cycle over the coming interval
    (hindsight)."""

    name = "oracle"

    def __init__(self, filled_memory: np.ndarray, filled_duty: np.ndarray, duty_quantile: float = 0.9) -> None:
        self.memory, self.duty = filled_memory, filled_duty
        self.duty_quantile = float(duty_quantile)

    def demand(self, series, pods, t, interval):
        hi = min(series.steps, t + interval)
        return (np.nanmax(self.memory[pods, t:hi], 1), np.nanquantile(self.duty[pods, t:hi], self.duty_quantile, 1),
                np.zeros(len(pods)))


@dataclass
class PodShares:
    """One run per pod, over the scored steps: its share of the GPUs it was on (``1 / tenants`` a step:
    the shares of all pods add up to the GPU-steps), the steps it was scored and those it spent on a GPU
    over its memory. What bootstraps over pods resample."""

    gpu_steps: np.ndarray
    steps: np.ndarray
    over_memory_steps: np.ndarray


@dataclass
class SharingResult:
    """One policy's run: per scored step the GPUs in use, pods over memory, GPUs over 100 % duty; and
    per pod (``per_pod``) its share of those."""

    policy: str
    gpus: np.ndarray
    pods: np.ndarray
    pods_over_memory: np.ndarray
    gpus_over_duty: np.ndarray
    moves: int
    no_forecast: int  # pod placements made without a memory forecast (a GPU of their own)
    not_placed: int
    step_seconds: float
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    per_pod: PodShares | None = None

    def report(self, reference_gpu_hours: float | None = None) -> dict:
        hours = self.step_seconds / 3600.0
        gpu_hours = float(self.gpus.sum() * hours)
        span_hours = len(self.gpus) * hours
        out = {
            "policy": self.policy,
            "gpu_hours": gpu_hours,
            "pod_hours": float(self.pods.sum() * hours),
            "mean_gpus": float(self.gpus.mean()) if len(self.gpus) else 0.0,
            "pod_minutes_over_memory_pct": 100 * float(self.pods_over_memory.sum() / max(self.pods.sum(), 1)),
            "gpu_minutes_over_duty_pct": 100 * float(self.gpus_over_duty.sum() / max(self.gpus.sum(), 1)),
            "moves_per_hour": self.moves / span_hours if span_hours else 0.0,
            "placements_without_forecast": self.no_forecast,
            "not_placed": self.not_placed,
        }
        if reference_gpu_hours:
            out["gpu_hours_saved_pct"] = 100 * (1 - gpu_hours / reference_gpu_hours)
        return out


def _match(old: np.ndarray, new: np.ndarray, next_id: int) -> tuple[np.ndarray, int]:
    """New bin ids renamed to the old ids they share most pods with (-1 in ``old``: not placed before),
    so that a pod whose GPU keeps its id has not moved."""
    from scipy.optimize import linear_sum_assignment

    out = np.full(len(new), -1, dtype=np.int64)
    new_bins = np.unique(new[new >= 0])
    old_bins = np.unique(old[old >= 0])
    if len(old_bins) and len(new_bins):
        overlap = np.zeros((len(new_bins), len(old_bins)))
        both = (old >= 0) & (new >= 0)
        np.add.at(overlap, (np.searchsorted(new_bins, new[both]), np.searchsorted(old_bins, old[both])), 1)
        rows, cols = linear_sum_assignment(-overlap)
        rename = {int(new_bins[r]): int(old_bins[c]) for r, c in zip(rows, cols, strict=True) if overlap[r, c] > 0}
    else:
        rename = {}
    for b in new_bins:
        if int(b) not in rename:
            rename[int(b)] = next_id
            next_id += 1
    for i, b in enumerate(new):
        if b >= 0:
            out[i] = rename[int(b)]
    return out, next_id


def _pack(series: PodSeries, pods: np.ndarray, demand: tuple[np.ndarray, ...], capacity: float,
          settings: PlanSettings, previous: list[int] | None,
          repair: bool = False) -> tuple[list[Workload], Plan, int]:
    """The workloads of one demand, their plan and the GPUs it needs (pods placed nowhere: one each);
    with ``previous``, the pods stay where they are unless packing afresh needs fewer GPUs (``repair``:
    they stay where they still fit, whatever it costs)."""
    mem, duty, burst = demand
    work = [Workload(series.ids[p], float(m) if np.isfinite(m) else None,
                     float(np.clip(d / 100, 0, 1)) if np.isfinite(d) else None, memory_burst_bytes=float(b))
            for p, m, d, b in zip(pods, mem, duty, burst, strict=True)]
    if repair:
        kept = plan(work, capacity, None, settings, previous=previous)
        return work, kept, kept.gpus_used + len(kept.not_placed)
    result = plan(work, capacity, None, settings)
    need = result.gpus_used + len(result.not_placed)
    if previous is not None:
        kept = plan(work, capacity, None, settings, previous=previous)
        kept_need = kept.gpus_used + len(kept.not_placed)
        if kept_need <= need:
            result, need = kept, kept_need
    return work, result, need


def _swap_guarded(assign: np.ndarray, size: np.ndarray, guarded: np.ndarray, duty: np.ndarray, capacity: float,
                  duty_target: float, rounds: int = 50) -> np.ndarray:
    """``assign`` with pods moved or swapped between the GPUs it uses, one at a time while that lowers the
    memory by which guarded sizes overflow their GPUs, every GPU staying within ``capacity`` at ``size``
    and within ``duty_target`` (or its duty before): no GPU more, none over memory by the sizes packed."""
    assign = assign.copy()
    movable = np.isfinite(size) & (assign >= 0)
    if movable.sum() < 2:
        return assign
    fixed = np.unique(assign[~movable & (assign >= 0)])  # GPUs of pods kept on their own
    gpus = np.setdiff1d(np.unique(assign[movable]), fixed)
    movable &= np.isin(assign, gpus)
    pods = np.flatnonzero(movable)
    sz, gd = size[pods], np.where(np.isfinite(guarded[pods]), guarded[pods], size[pods])
    dt = np.nan_to_num(duty[pods])
    at = np.searchsorted(gpus, assign[pods])
    for _ in range(rounds):
        mem = np.bincount(at, sz, len(gpus))
        high = np.bincount(at, gd, len(gpus))
        busy = np.bincount(at, dt, len(gpus))
        over = np.maximum(high - capacity, 0)
        if not over.any():
            break
        limit = np.maximum(busy, duty_target)
        best, move = 0.0, None
        for i in np.flatnonzero(over[at] > 0):  # a pod on a GPU the guard finds over
            a = at[i]
            for b in range(len(gpus)):
                if b == a:
                    continue
                cands = [(None, 0.0, 0.0, 0.0)] + [(j, sz[j], gd[j], dt[j]) for j in np.flatnonzero(at == b)]
                for j, s_j, g_j, d_j in cands:
                    if (mem[b] - s_j + sz[i] > capacity + 1e-6 or mem[a] - sz[i] + s_j > capacity + 1e-6
                            or busy[b] - d_j + dt[i] > limit[b] + 1e-9 or busy[a] - dt[i] + d_j > limit[a] + 1e-9):
                        continue
                    gain = (over[a] + over[b] - max(high[a] - gd[i] + g_j - capacity, 0)
                            - max(high[b] - g_j + gd[i] - capacity, 0))
                    if gain > best + 1e-6:
                        best, move = gain, (i, j, a, b)
        if move is None:
            break
        i, j, a, b = move
        at[i] = b
        if j is not None:
            at[j] = a
    assign[pods] = gpus[at]
    return assign


class _Gpus:
    """Which GPU each pod is on, kept across repacks (a GPU keeps its id where its pods stay together)."""

    def __init__(self, n_pods: int) -> None:
        self.bins = np.full(n_pods, -1, dtype=np.int64)
        self.next_id = 0

    def previous(self, here: np.ndarray) -> list[int] | None:
        """The GPU of each of ``here`` as the planner's ``previous`` (-1: none), None when none has one."""
        b = self.bins[here]
        if not (b >= 0).any():
            return None
        _, prev = np.unique(b, return_inverse=True)
        return np.where(b >= 0, prev - int((b < 0).any()), -1).tolist()

    def repack(self, here: np.ndarray, assign: np.ndarray, present: np.ndarray) -> int:
        """Put ``here`` on the GPUs of ``assign`` (plan indices); the pods moved."""
        new = np.full(len(self.bins), -1, dtype=np.int64)
        new[here] = assign
        renamed, self.next_id = _match(self.bins, new, self.next_id)
        moves = int(((self.bins[here] >= 0) & (renamed[here] != self.bins[here])).sum())
        self.bins = np.where(present, renamed, -1)
        return moves

    def step(self, here: np.ndarray, present: np.ndarray) -> None:
        """Pods that appeared since the last repack get a GPU of their own; those gone leave theirs."""
        for p in here[self.bins[here] < 0]:
            self.bins[p] = self.next_id
            self.next_id += 1
        self.bins[~present & (self.bins >= 0)] = -1


def _own_gpus_for_lost(assign: np.ndarray) -> np.ndarray:
    """``assign`` with each pod the plan placed nowhere (too big for one GPU) on a GPU of its own."""
    assign = assign.copy()
    lost = assign < 0
    if lost.any():
        assign[lost] = assign.max(initial=-1) + 1 + np.arange(int(lost.sum()))
    return assign


def simulate_sharing(series: PodSeries, policy: SharingPolicy, capacity_bytes: float, interval: int,
                     settings: PlanSettings | None = None, filled: tuple[np.ndarray, np.ndarray] | None = None,
                     sticky: bool = True) -> SharingResult:
    """Run ``policy`` over the scored span, repacking every ``interval`` steps on GPUs of ``capacity_bytes``;
    ``sticky``: each repack keeps the pods on their GPUs where they still fit, unless packing afresh
    needs fewer GPUs.

    A policy with ``alternatives`` (:class:`GuardedPeak`, free) packs as the last of them (peak packing)
    would from its own state, tracked alongside, and repairs that plan under the others in turn, keeping
    the first repair that needs no more GPUs: at every repack it uses no more GPUs than that policy."""
    if interval < 1:
        raise ValueError(f"the repacking interval must be at least one step, got {interval}")
    if not (capacity_bytes > 0 and math.isfinite(capacity_bytes)):
        raise ValueError(f"GPU memory must be a positive number of bytes, got {capacity_bytes!r}")
    settings = settings or PlanSettings()
    mem_f, duty_f = filled or (series.filled(series.memory), series.filled(series.duty))
    n_pods = len(series.ids)
    present = np.zeros((n_pods, series.steps), dtype=bool)
    for p in range(n_pods):
        present[p, series.scored_from[p]:series.scored_to[p]] = True
    alternatives = getattr(policy, "alternatives", None)
    gpus_now = _Gpus(n_pods)
    followed = _Gpus(n_pods) if alternatives and getattr(policy, "mode", "") == "free" else None
    moves = no_forecast = not_placed = 0
    steps = range(series.eval_start, series.eval_end)
    gpus, pods_n, over_mem, over_duty = (np.zeros(len(steps), dtype=np.int64) for _ in range(4))
    pod_gpu = np.zeros(n_pods)
    pod_steps, pod_over = np.zeros(n_pods, dtype=np.int64), np.zeros(n_pods, dtype=np.int64)
    for k, t in enumerate(steps):
        here = np.flatnonzero(present[:, t])
        if (t - series.eval_start) % interval == 0 and len(here):
            if isinstance(policy, OnePerGpu):
                assign = np.arange(len(here))
            else:
                options = (alternatives(series, here, t, interval) if alternatives
                           else [policy.demand(series, here, t, interval)])
                state = followed or gpus_now
                prev = state.previous(here) if sticky else None
                work, result, need = _pack(series, here, options[-1], capacity_bytes, settings, prev)
                if followed is not None:
                    followed.repack(here, _own_gpus_for_lost(result.assignment()), present[:, t])
                for d in options[:-1]:  # the first repair of that plan under a guard that needs no more GPUs
                    guarded = _pack(series, here, d, capacity_bytes, settings, result.assignment().tolist(),
                                    repair=True)
                    if guarded[2] <= need:
                        work, result, need = guarded
                        break
                assign = result.assignment()
                if len(options) > 1 and getattr(policy, "swap", False):  # swap pods the guard still finds over
                    assign = _swap_guarded(assign, options[-1][0], options[0][0], options[-1][1],
                                           capacity_bytes, 100 * settings.utilization_target)
                no_forecast += sum(1 for w in work if not w.has_forecast)
                not_placed += int((assign < 0).sum())
                assign = _own_gpus_for_lost(assign)  # too big for one GPU: a GPU of its own (it overflows there too)
            moves += gpus_now.repack(here, assign, present[:, t])
        gpus_now.step(here, present[:, t])
        if followed is not None:
            followed.step(here, present[:, t])
        b = gpus_now.bins[here]
        ids, inv = np.unique(b, return_inverse=True)
        mem_sum = np.bincount(inv, weights=mem_f[here, t], minlength=len(ids))
        duty_sum = np.bincount(inv, weights=duty_f[here, t], minlength=len(ids))
        over = mem_sum[inv] > capacity_bytes
        gpus[k] = len(ids)
        pods_n[k] = len(here)
        over_mem[k] = int(over.sum())
        over_duty[k] = int((duty_sum > 100.0 + 1e-9).sum())
        pod_gpu[here] += 1.0 / np.bincount(inv)[inv]  # each pod's share of its GPU
        pod_steps[here] += 1
        pod_over[here] += over
    return SharingResult(policy.name, gpus, pods_n, over_mem, over_duty, moves, no_forecast, not_placed,
                         series.step_seconds, np.arange(series.eval_start, series.eval_end),
                         PodShares(pod_gpu, pod_steps, pod_over))


def load_forecaster(checkpoint: str | None = None):
    """The forecaster of ``checkpoint`` (None or ``"dprobe"``: the shipped one) for memory and duty cycle, as
    a :class:`~dprobe.forecaster.loading.LoadedModel`."""
    from dprobe.forecaster.loading import checkpoint_path, open_forecaster

    return open_forecaster(checkpoint_path(checkpoint or "dprobe"),
                           metrics=("gpu_memory_bytes", "gpu_duty_cycle_pct"))


def _forecast_policy(name: str, series: PodSeries, settings: SharingSettings, loaded,
                     cache: dict | None) -> ForecastDemand:
    """``settings``' forecast rules on the forecaster of ``loaded`` (None: the last-value baseline)."""
    window = settings.window(series.step_seconds)
    with_rules = functools.partial(ForecastDemand, memory_quantile=settings.memory_quantile,
                                   duty_quantile=settings.duty_quantile, margin=settings.memory_margin,
                                   burst_quantile=settings.burst_quantile, burst_history=window)
    if loaded is None:
        from dprobe.forecaster.baselines import make_baseline

        base = make_baseline("last_value")
        base.residual_window = max(10, 4 * window)
        return with_rules(name, base, base.residual_window + settings.repack_steps)
    model = loaded.forecaster
    _, spec, _ = model.task_for("gpu_memory_bytes", series.step_seconds)
    covariates = tuple(c for c in spec.covariates if c in series.covariate_names)
    max_lead_steps = int(max(spec.leads) * spec.step_seconds / series.step_seconds)
    context = int(math.ceil(model.window_seconds("gpu_memory_bytes") / series.step_seconds))
    return with_rules(name, model, context, covariates=covariates, max_lead_steps=max_lead_steps, cache=cache)


def build_policies(names: list[str] | tuple[str, ...], series: PodSeries, settings: SharingSettings,
                   filled: tuple[np.ndarray, np.ndarray], forecaster=None, cache: dict | None = None
                   ) -> list[SharingPolicy]:
    """The policies ``names`` (of :data:`SHARING_POLICIES`) with ``settings``; ``dprobe`` reads
    ``forecaster`` (a ``LoadedModel``; None: the shipped one, loaded when its rule needs it), ``last-value``
    the last-value baseline, both under ``settings.rule``; ``cache``: the dprobe forecasts of earlier runs
    over the same series."""
    unknown = [n for n in names if n not in SHARING_POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown sharing policy {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(SHARING_POLICIES)}")
    window = settings.window(series.step_seconds)
    label = f"{settings.history_hours:g}h"
    policies: list[SharingPolicy] = []
    for name in names:
        if name == "one-per-gpu":
            policies.append(OnePerGpu())
        elif name == "peak":
            policies.append(PeakOfHistory(window, 0.0, settings.duty_quantile, label))
        elif name == "peak-headroom":
            policies.append(PeakOfHistory(window, settings.headroom, settings.duty_quantile, label))
        elif name == "oracle":
            policies.append(Oracle(*filled, settings.duty_quantile))
        elif settings.rule == "peak":
            peak = PeakOfHistory(window, 0.0, settings.duty_quantile, label)
            peak.name = name
            policies.append(peak)
        else:
            if name == "dprobe" and forecaster is None:
                forecaster = load_forecaster()
            fc = _forecast_policy(name, series, settings, forecaster if name == "dprobe" else None,
                                  cache if name == "dprobe" else None)
            if settings.rule == "forecast":
                policies.append(fc)
            else:
                policies.append(GuardedPeak(name, PeakOfHistory(window, 0.0, settings.duty_quantile, label), fc,
                                            settings.guard_quantile, settings.guard_margin, settings.guard_mode,
                                            swap=settings.guard_swap))
    return policies


def simulate_policies(series: PodSeries, settings: SharingSettings | None = None,
                      names: list[str] | tuple[str, ...] = SHARING_POLICIES, forecaster=None,
                      filled: tuple[np.ndarray, np.ndarray] | None = None, cache: dict | None = None
                      ) -> list[SharingResult]:
    """Every policy of ``names`` packed on ``series`` with ``settings`` (default: the shipped ones), one
    :class:`SharingResult` each: what ``dprobe simulate sharing``, ``benchmarks/simulate_sharing.py`` and
    the cross-validation run. ``forecaster``, ``filled`` and ``cache`` only save work across calls."""
    settings = settings or SharingSettings()
    filled = filled or (series.filled(series.memory), series.filled(series.duty))
    policies = build_policies(names, series, settings, filled, forecaster, cache)
    return [simulate_sharing(series, p, settings.gpu_memory_bytes, settings.repack_steps, settings.plan_settings(),
                             filled, settings.sticky) for p in policies]
