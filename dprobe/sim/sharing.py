"""Pods packed onto shared GPUs by policy and scored against what they did afterwards (``dprobe simulate
--sharing``).

Every ``interval`` steps the present pods are repacked (:func:`dprobe.sharing.planner.plan`) from the
demand a policy sees at that moment: GPU memory (hard: the sum on a GPU stays under its memory) and duty
cycle (soft: the sum stays under 100 %). Until the next repack each pod stays where it was put, and every
step is scored with the pods' measured memory and duty cycle: GPUs in use, pods on a GPU whose measured
memory adds up to more than its capacity, GPUs whose measured duty cycles add up to more than 100 %, and
pods moved at each repack. A pod that appears between repacks gets a GPU of its own until the next.

Only each pod's test span is scored (from ``Split.test_start`` of its own series on, and not before the
same share of the whole trace): the forecaster never trained or validated on it. History before it is
what the policies read. The validation span (``span="validation"``) is there to choose settings on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dprobe.core.split import Split
from dprobe.forecaster.base import Forecaster, ForecastInput
from dprobe.sharing.planner import PlanSettings, Workload, plan

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

    @property
    def steps(self) -> int:
        return self.memory.shape[1]

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
            raise ValueError(f"{dataset.name}: --sharing needs per-pod {col} (missing)")
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
    if span == "test":
        eval_start, eval_end, scored_from, scored_to = split.test_index(n_steps), n_steps, test_from, end
    else:
        eval_start, eval_end = split.validation_index(n_steps), split.test_index(n_steps)
        scored_from = np.maximum(first + np.array([split.validation_index(int(n)) for n in lengths]), eval_start)
        scored_to = np.minimum(np.minimum(test_from, end), eval_end)
    return PodSeries(ids, memory, duty, cov, names, first, end, scored_from, scored_to, eval_start, eval_end, step)


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
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mem = np.nanmax(series.memory[pods, lo:t], 1) if t > lo else np.full(len(pods), np.nan)
                duty = (np.nanquantile(series.duty[pods, lo:t], self.duty_quantile, 1) if t > lo
                        else np.full(len(pods), np.nan))
        return mem * (1 + self.headroom), duty, np.zeros(len(pods))


class ForecastDemand(SharingPolicy):
    """The ``memory_quantile`` (and ``duty_quantile``) of a forecaster's forecasts over the next interval,
    its largest over the leads; plus ``margin`` on memory. With ``burst_quantile``, each pod's burst is
    the larger of that quantile of its forecast (plus the margin) and its own peak over the last
    ``burst_history`` steps, less its memory demand: the GPU keeps room for its tenants' largest burst."""

    def __init__(self, name: str, forecaster: Forecaster, context: int, memory_quantile: float,
                 duty_quantile: float, margin: float = 0.0, covariates: tuple[str, ...] = (),
                 max_lead: int | None = None, burst_quantile: float | None = None, burst_history: int = 0) -> None:
        self.burst_quantile = burst_quantile
        self.burst_history = int(burst_history)
        self.name = name
        self.forecaster = forecaster
        self.context = int(context)
        self.memory_quantile, self.duty_quantile = memory_quantile, duty_quantile
        self.margin = float(margin)
        self.covariates = covariates
        self.max_lead = max_lead

    def _quantile(self, series: PodSeries, values: np.ndarray, pods: np.ndarray, t: int, interval: int,
                  metric: str, level: float) -> np.ndarray:
        lo = max(0, t - self.context)
        window = values[pods, lo:t]
        leads = tuple(range(1, min(interval, self.max_lead or interval) + 1))
        cov = None
        if self.covariates:
            idx = [series.covariate_names.index(c) for c in self.covariates]
            cov = series.covariates[pods, lo:t][..., idx]
        out = np.full(len(pods), np.nan)
        has = np.isfinite(window).any(1)
        if not has.any():
            return out
        fc = self.forecaster.predict(ForecastInput(values=window[has], metric=metric, leads=leads,
                                                   step_seconds=series.step_seconds,
                                                   covariates=None if cov is None else cov[has]))
        k = int(np.argmin(np.abs(np.asarray(fc.quantile_levels) - level)))
        out[has] = fc.quantiles[:, :, k].max(1)
        return out

    def demand(self, series, pods, t, interval):
        mem = self._quantile(series, series.memory, pods, t, interval, "gpu_memory_bytes", self.memory_quantile)
        duty = self._quantile(series, series.duty, pods, t, interval, "gpu_duty_cycle_pct", self.duty_quantile)
        mem = np.clip(mem, 0, None) * (1 + self.margin)
        burst = np.zeros(len(pods))
        if self.burst_quantile is not None:
            high = self._quantile(series, series.memory, pods, t, interval, "gpu_memory_bytes", self.burst_quantile)
            lo = max(0, t - self.burst_history)
            seen = (np.where(np.isfinite(series.memory[pods, lo:t]), series.memory[pods, lo:t], 0.0).max(1)
                    if t > lo else np.zeros(len(pods)))
            burst = np.nan_to_num(np.maximum(high * (1 + self.margin), seen) - mem).clip(0, None)
        return mem, np.clip(duty, 0, 100), burst


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
class SharingResult:
    """One policy's run: per scored step the GPUs in use, pods over memory, GPUs over 100 % duty."""

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


def simulate_sharing(series: PodSeries, policy: SharingPolicy, capacity_bytes: float, interval: int,
                     settings: PlanSettings | None = None, filled: tuple[np.ndarray, np.ndarray] | None = None,
                     sticky: bool = True) -> SharingResult:
    """Run ``policy`` over the scored span, repacking every ``interval`` steps on GPUs of ``capacity_bytes``;
    ``sticky``: each repack keeps the pods on their GPUs where they still fit, unless packing afresh
    needs fewer GPUs."""
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
    bins = np.full(n_pods, -1, dtype=np.int64)
    next_id = 0
    moves = no_forecast = not_placed = 0
    steps = range(series.eval_start, series.eval_end)
    gpus, pods_n, over_mem, over_duty = (np.zeros(len(steps), dtype=np.int64) for _ in range(4))
    for k, t in enumerate(steps):
        here = np.flatnonzero(present[:, t])
        if (t - series.eval_start) % interval == 0 and len(here):
            new = np.full(n_pods, -1, dtype=np.int64)
            if isinstance(policy, OnePerGpu):
                new[here] = np.arange(len(here))
            else:
                mem, duty, burst = policy.demand(series, here, t, interval)
                work = [Workload(series.ids[p], float(m) if np.isfinite(m) else None,
                                 float(np.clip(d / 100, 0, 1)) if np.isfinite(d) else None,
                                 memory_burst_bytes=float(b))
                        for p, m, d, b in zip(here, mem, duty, burst, strict=True)]
                result = plan(work, capacity_bytes, None, settings)
                if sticky and (bins[here] >= 0).any():  # keep pods where they are unless that costs GPUs
                    _, prev = np.unique(bins[here], return_inverse=True)
                    prev = np.where(bins[here] >= 0, prev - int((bins[here] < 0).any()), -1)
                    kept = plan(work, capacity_bytes, None, settings, previous=prev.tolist())
                    if kept.gpus_used <= result.gpus_used:
                        result = kept
                assign = result.assignment()
                no_forecast += sum(1 for w in work if not w.has_forecast)
                lost = assign < 0  # too big for one GPU: a GPU of its own (it overflows there too)
                not_placed += int(lost.sum())
                if lost.any():
                    assign[lost] = assign.max(initial=-1) + 1 + np.arange(int(lost.sum()))
                new[here] = assign
            renamed, next_id = _match(bins, new, next_id)
            moves += int(((bins[here] >= 0) & (renamed[here] != bins[here])).sum())
            bins = np.where(present[:, t], renamed, -1)
        arrived = here[bins[here] < 0]
        for p in arrived:  # appeared since the last repack: a GPU of its own
            bins[p] = next_id
            next_id += 1
        gone = ~present[:, t] & (bins >= 0)
        bins[gone] = -1
        b = bins[here]
        ids, inv = np.unique(b, return_inverse=True)
        mem_sum = np.bincount(inv, weights=mem_f[here, t], minlength=len(ids))
        duty_sum = np.bincount(inv, weights=duty_f[here, t], minlength=len(ids))
        gpus[k] = len(ids)
        pods_n[k] = len(here)
        over_mem[k] = int((mem_sum[inv] > capacity_bytes).sum())
        over_duty[k] = int((duty_sum > 100.0 + 1e-9).sum())
    return SharingResult(policy.name, gpus, pods_n, over_mem, over_duty, moves, no_forecast, not_placed,
                         series.step_seconds, np.arange(series.eval_start, series.eval_end))
