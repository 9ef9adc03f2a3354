"""Choosing and scoring the sharing policy by cross-validation over pods and time.

The pods fall into ``groups`` groups by a stable hash of their id, and the part of the trace no forecaster
trained on (from each pod's validation span on, :data:`SPANS` of the whole trace) into time spans; a
*cell* is one group over one span, packed on its own (:meth:`PodSeries.cell`). Every candidate setting
runs on every cell at every GPU size through :func:`dprobe.sim.sharing.packing.simulate_policies`.

Selection (:func:`choose`) is nested: for the cell it reports on, the setting is chosen on the cells of
the *other* groups over the *other* spans, so no pod and no hour of the reported cell took part in the
choice. The rule: among the candidates that are at least as good as peak packing (no more GPU-steps and
no more pod-steps over memory) in every selection cell at every size, the one with the fewest pod-steps
over memory, then the fewest GPU-steps, then the first listed. The shipped default is the choice on all
cells (:func:`choose` without a held-out cell).

Figures are pooled over cells (GPU-hours saved against one pod per GPU, pod-minutes over memory), with
95 % intervals by bootstrap: over the pods of a cell for one cell, over pods and spans at once (each pod
and each span drawn with replacement) for the whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dprobe.sim.sharing.packing import PodSeries, SharingResult, SharingSettings, simulate_policies

SPANS = ((0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0))  # shares of the trace: each about 2.3 hours
GROUPS = 5
SIZES_BYTES = (80 * 10**9, 141 * 10**9)  # GPUs of 80 GB and 141 GB
REFERENCE = "peak"


def pod_group(pod_id: str, groups: int = GROUPS) -> int:
    """The group of a pod: a stable hash of its id (the same on every machine and in every run)."""
    return zlib.crc32(pod_id.encode()) % groups


@dataclass(frozen=True)
class Cell:
    """One group of pods over one time span: where a fold's figures come from."""

    group: int
    span: int
    series: PodSeries

    @property
    def name(self) -> str:
        return f"g{self.group}/s{self.span}"

    def pods(self) -> np.ndarray:
        return self.series.scored_pods()


def cells(series: PodSeries, groups: int = GROUPS, spans: Sequence[tuple[float, float]] = SPANS) -> list[Cell]:
    """Every group x span of ``series`` (spans as shares of the trace), each pod scored only from its
    ``unseen_from`` on; cells without a scored pod are left out."""
    if groups < 2:
        raise ValueError(f"cross-validation needs at least 2 pod groups, got {groups}")
    group = np.array([pod_group(p, groups) for p in series.ids])
    out = []
    for s, (a, b) in enumerate(spans):
        if not 0 <= a < b <= 1:
            raise ValueError(f"a span is two shares of the trace, 0 <= start < end <= 1, got {(a, b)}")
        start, end = int(round(a * series.steps)), int(round(b * series.steps))
        for g in range(groups):
            c = Cell(g, s, series.cell(np.flatnonzero(group == g), start, end))
            if len(c.pods()):
                out.append(c)
    return out


def selection_cells(all_cells: Sequence[Cell], held_out: Cell | None) -> list[Cell]:
    """The cells a choice reported on ``held_out`` may be made on: other groups over other spans (all
    cells when None)."""
    if held_out is None:
        return list(all_cells)
    return [c for c in all_cells if c.group != held_out.group and c.span != held_out.span]


@dataclass(frozen=True)
class Candidate:
    """A setting of the ``dprobe`` policy to choose among."""

    label: str
    settings: SharingSettings


def candidates(base: SharingSettings | None = None) -> list[Candidate]:
    """The settings the cross-validation chooses among: peak packing (the rule) first, the guarded peak
    at two quantiles and margins (free, free with swaps, always), and the forecast-sized rule."""
    base = base or SharingSettings()
    out = [Candidate("peak", replace(base, rule="peak"))]
    for mode, swap in (("free", False), ("free", True), ("always", False)):
        for q in (0.9, 0.99):
            for margin in (0.0, 0.1):
                kind = f"{mode}{'+swap' if swap else ''}"
                out.append(Candidate(f"guarded-peak {kind} p{round(100 * q)}+{100 * margin:g}%",
                                     replace(base, rule="guarded-peak", guard_mode=mode, guard_quantile=q,
                                             guard_margin=margin, guard_swap=swap)))
    for q in (0.5, 0.9):
        for overlap in (0.0, 0.35):
            out.append(Candidate(f"forecast p{round(100 * q)} overlap {overlap:g}",
                                 replace(base, rule="forecast", memory_quantile=q, burst_overlap=overlap)))
    out.append(Candidate("forecast p50 rss", replace(base, rule="forecast", burst_combine="rss")))
    return out


@dataclass
class Score:
    """One policy on one cell at one size: totals, and per scored pod (for the bootstraps)."""

    pods: np.ndarray  # pod indices
    gpu_steps: np.ndarray  # the pod's share of GPU-steps
    steps: np.ndarray  # its scored steps (its GPU-steps with one pod per GPU)
    over: np.ndarray  # its steps on a GPU over memory

    @classmethod
    def of(cls, result: SharingResult) -> Score:
        shares = result.per_pod
        if shares is None:
            raise ValueError(f"policy {result.policy}: the run kept no per-pod shares to score")
        pods = np.flatnonzero(shares.steps > 0)
        return cls(pods, shares.gpu_steps[pods], shares.steps[pods], shares.over_memory_steps[pods])

    @property
    def total_gpu_steps(self) -> int:
        return int(round(self.gpu_steps.sum()))

    @property
    def total_over(self) -> int:
        return int(self.over.sum())

    def figures(self) -> dict:
        return figures(self.gpu_steps.sum(), self.steps.sum(), self.over.sum())


def figures(gpu_steps: float, steps: float, over: float) -> dict:
    """GPU-hours saved against one pod per GPU and pod-minutes over memory, percent."""
    return {"gpu_hours_saved_pct": 100 * (1 - gpu_steps / steps) if steps else 0.0,
            "pod_minutes_over_memory_pct": 100 * over / steps if steps else 0.0}


Scores = dict[tuple[str, str, int], Score]  # (policy or candidate label, cell name, GPU bytes) -> score


def run_cells(all_cells: Sequence[Cell], runs: Sequence[tuple[str, SharingSettings, str]],
              sizes: Sequence[int] = SIZES_BYTES, forecaster=None, progress: Callable[[str], None] | None = None
              ) -> Scores:
    """``runs`` (label, settings, policy name) on every cell at every size, one :func:`simulate_policies`
    call each, sharing the filled series and the dprobe forecasts."""
    if not all_cells:
        return {}
    series = all_cells[0].series
    filled = (series.filled(series.memory), series.filled(series.duty))
    cache: dict = {}
    out: Scores = {}
    for label, settings, policy in runs:
        if progress:
            progress(label)
        for size in sizes:
            sized = replace(settings, gpu_memory_bytes=int(size))
            for c in all_cells:
                (result,) = simulate_policies(c.series, sized, (policy,), forecaster, filled, cache)
                out[label, c.name, int(size)] = Score.of(result)
    return out


def never_loses(scores: Scores, label: str, on: Sequence[Cell], sizes: Sequence[int],
                reference: str = REFERENCE) -> bool:
    """Whether ``label`` uses no more GPU-steps and has no more pod-steps over memory than ``reference`` in
    every cell of ``on`` at every size."""
    return all(scores[label, c.name, s].total_gpu_steps <= scores[reference, c.name, s].total_gpu_steps
               and scores[label, c.name, s].total_over <= scores[reference, c.name, s].total_over
               for c in on for s in sizes)


def choose(scores: Scores, labels: Sequence[str], all_cells: Sequence[Cell], held_out: Cell | None = None,
           sizes: Sequence[int] = SIZES_BYTES, reference: str = REFERENCE) -> str:
    """The candidate chosen on the selection cells of ``held_out`` (module docstring): never worse than
    ``reference`` there, then the fewest pod-steps over memory, the fewest GPU-steps, the first listed.
    ``reference`` is one of ``labels`` and always eligible, so there is always a choice."""
    if reference not in labels:
        raise ValueError(f"the candidates must include the reference {reference!r}")
    on = selection_cells(all_cells, held_out)
    eligible = [x for x in labels if x == reference or never_loses(scores, x, on, sizes, reference)]
    return min(eligible, key=lambda x: (sum(scores[x, c.name, s].total_over for c in on for s in sizes),
                                        sum(scores[x, c.name, s].total_gpu_steps for c in on for s in sizes),
                                        list(labels).index(x)))


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    lo, hi = np.nanquantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def cell_bootstrap(score: Score, draws: int = 1000, seed: int = 0) -> dict:
    """A cell's figures with 95 % intervals from resampling its pods."""
    rng = np.random.default_rng(seed)
    w = rng.multinomial(len(score.pods), np.full(len(score.pods), 1 / len(score.pods)), size=draws)
    g, n, o = w @ score.gpu_steps, w @ score.steps, w @ score.over
    out = score.figures()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["gpu_hours_saved_ci"] = interval(100 * (1 - g / n))
        out["pod_minutes_over_memory_ci"] = interval(100 * o / n)
    return out


def pooled_bootstrap(per_cell: dict[str, Score], all_cells: Sequence[Cell], n_pods: int,
                     paired: dict[str, Score] | None = None, draws: int = 2000, seed: int = 0) -> dict:
    """Figures pooled over ``all_cells`` (``per_cell``: each cell's score of one policy, or of what was chosen
    for it), with 95 % intervals from drawing pods and spans with replacement; with ``paired``, also the
    differences from that policy (same draws): saved minus its saved, overflow minus its overflow."""
    spans = sorted({c.span for c in all_cells})

    def table(scores: dict[str, Score]) -> np.ndarray:
        t = np.zeros((3, len(spans), n_pods))
        for c in all_cells:
            s = scores[c.name]
            k = spans.index(c.span)
            t[0, k, s.pods] += s.gpu_steps
            t[1, k, s.pods] += s.steps
            t[2, k, s.pods] += s.over
        return t

    rng = np.random.default_rng(seed)
    wp = rng.multinomial(n_pods, np.full(n_pods, 1 / n_pods), size=draws).astype(float)
    ws = rng.multinomial(len(spans), np.full(len(spans), 1 / len(spans)), size=draws).astype(float)

    def draw(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g, n, o = (np.einsum("bs,sp,bp->b", ws, t[i], wp) for i in range(3))
        with np.errstate(invalid="ignore", divide="ignore"):
            return 100 * (1 - g / n), 100 * o / n

    t = table(per_cell)
    out = figures(t[0].sum(), t[1].sum(), t[2].sum())
    saved, over = draw(t)
    out["gpu_hours_saved_ci"], out["pod_minutes_over_memory_ci"] = interval(saved), interval(over)
    if paired is not None:
        r = table(paired)
        ref = figures(r[0].sum(), r[1].sum(), r[2].sum())
        rs, ro = draw(r)
        out["saved_minus_reference"] = out["gpu_hours_saved_pct"] - ref["gpu_hours_saved_pct"]
        out["over_minus_reference"] = out["pod_minutes_over_memory_pct"] - ref["pod_minutes_over_memory_pct"]
        out["saved_minus_reference_ci"] = interval(saved - rs)
        out["over_minus_reference_ci"] = interval(over - ro)
    return out


def cross_validate(series: PodSeries, sizes: Sequence[int] = SIZES_BYTES, groups: int = GROUPS,
                   spans: Sequence[tuple[float, float]] = SPANS, choices: Sequence[Candidate] | None = None,
                   forecaster=None, draws: int = 2000, progress: Callable[[str], None] | None = None,
                   shipped: SharingSettings | None = None) -> dict:
    """Every candidate on every cell; the nested choice per cell and the choice on all cells; figures of
    the shipped default (``shipped``, default :class:`SharingSettings`), peak packing, one pod per GPU, the
    oracle and the nested choice, per cell and pooled, with intervals. A JSON-ready dict."""
    shipped = shipped or SharingSettings()
    choices = list(choices or candidates(shipped))
    labels = [c.label for c in choices]
    if REFERENCE not in labels:
        raise ValueError(f"the candidates must include {REFERENCE!r}")
    default = next((c.label for c in choices if c.settings == shipped), None)
    runs = [("one-per-gpu", shipped, "one-per-gpu"), ("oracle", shipped, "oracle"), (REFERENCE, shipped, "peak")]
    runs += [(c.label, c.settings, "dprobe") for c in choices if c.label != REFERENCE]
    if default is None:
        default = "shipped default"
        runs.append((default, shipped, "dprobe"))
    all_cells = cells(series, groups, spans)
    scores = run_cells(all_cells, runs, sizes, forecaster, progress)
    nested = {c.name: choose(scores, labels, all_cells, c, sizes) for c in all_cells}
    on_all = choose(scores, labels, all_cells, None, sizes)
    shown = ("dprobe", "peak", "one-per-gpu", "oracle")
    label_of = {"dprobe": default, "peak": REFERENCE, "one-per-gpu": "one-per-gpu", "oracle": "oracle"}
    out_cells = []
    for k, c in enumerate(all_cells):
        row: dict[str, Any] = {"cell": c.name, "group": c.group, "span": c.span, "pods": int(len(c.pods())),
                               "hours": (c.series.eval_end - c.series.eval_start) * series.step_seconds / 3600,
                               "sizes": {}}
        for size in sizes:
            figs = {name: cell_bootstrap(scores[label_of[name], c.name, int(size)], seed=k) for name in shown}
            figs["nested"] = {"choice": nested[c.name],
                              **cell_bootstrap(scores[nested[c.name], c.name, int(size)], seed=k)}
            row["sizes"][str(int(size))] = figs
        out_cells.append(row)
    overall = {}
    for size in sizes:
        ref = {c.name: scores[REFERENCE, c.name, int(size)] for c in all_cells}
        figs = {}
        for name in shown:
            own = {c.name: scores[label_of[name], c.name, int(size)] for c in all_cells}
            figs[name] = pooled_bootstrap(own, all_cells, len(series.ids), ref, draws)
        picked = {c.name: scores[nested[c.name], c.name, int(size)] for c in all_cells}
        figs["nested"] = pooled_bootstrap(picked, all_cells, len(series.ids), ref, draws)
        overall[str(int(size))] = figs
    pooled: dict[str, dict[str, Any]] = {}
    for label in labels:
        pooled[label] = {str(int(size)): figures(*(sum(getattr(scores[label, c.name, int(size)], a).sum()
                                                    for c in all_cells) for a in ("gpu_steps", "steps", "over")))
                         for size in sizes}
        pooled[label]["never_loses"] = never_loses(scores, label, all_cells, sizes)
    return {
        "groups": groups, "spans": [list(s) for s in spans], "sizes_bytes": [int(s) for s in sizes],
        "repack_steps": shipped.repack_steps, "shipped": shipped.to_dict(), "shipped_label": default,
        "chosen_on_all_cells": on_all, "shipped_is_chosen": on_all == default,
        "default_never_loses": never_loses(scores, default, all_cells, sizes),
        "nested_never_loses": all(never_loses(scores, nested[c.name], [c], sizes) for c in all_cells),
        "cells": out_cells, "overall": overall, "candidates": pooled,
    }
