"""A picture of the leave-family-out scores: predicted against measured, run by run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dprobe.profiling.coldstart.crossval import CrossValidation

GIB = 2**30
# the leave-family-out scores as tabulated: (key, label, (low, high) band the learned figure must lie in)
ROWS = [("peak_mape", "allocator peak MAPE %", (0, 1.5)), ("peak_worst_ape", "allocator peak worst APE %", (0, 8)),
        ("nvml_mape", "NVML device memory MAPE %", (0, 3)), ("util_mae_points", "GPU util MAE (points)", (0, 8)),
        ("step_mape", "step time MAPE %", (0, 12)), ("step_spearman", "step time Spearman", (0.9, 1)),
        ("p90_coverage_peak_memory_bytes", "p90 coverage: peak", (0.85, 0.95)),
        ("p90_coverage_device_memory_bytes", "p90 coverage: NVML", (0.85, 0.95)),
        ("p90_coverage_gpu_utilization", "p90 coverage: util", (0.85, 0.95)),
        ("p90_coverage_step_time_seconds", "p90 coverage: step time", (0.85, 0.95))]
# target index -> (title, unit factor, unit, log axes)
PANELS = [(0, "allocator peak", GIB, "GiB", True), (1, "device memory (NVML)", GIB, "GiB", True),
          (2, "GPU utilisation", 0.01, "%", False), (3, "step time", 1e-3, "ms", True)]


def format_scores(learned: dict[str, float], analytical: dict[str, float],
                  typical: dict[str, float] | None = None) -> tuple[str, list[str]]:
    """The learned and analytical leave-family-out scores side by side with the target band, one row per
    metric marked PASS or MISS; and the labels of the rows missed. ``typical``: the learned scores when the
    machine's host factor is not known (a column of their own, not marked)."""
    def cell(scores: dict[str, float] | None, key: str, width: int) -> str:
        return f"{scores[key]:{width}.3f}" if scores and key in scores else f"{'-':>{width}s}"  # no p90 there

    lines = [f"{'metric':34s} {'learned':>10s}" + (f" {'host unknown':>12s}" if typical else "")
             + f" {'analytical':>11s}  target"]
    missed = []
    for key, label, (low, high) in ROWS:
        value = learned[key]
        ok = low <= value <= high
        missed += [] if ok else [label]
        lines.append(f"{label:34s} {value:10.3f}" + (f" {cell(typical, key, 12)}" if typical else "")
                     + f" {cell(analytical, key, 11)}  {low:g}-{high:g} {'PASS' if ok else 'MISS'}")
    return "\n".join(lines), missed


def host_factor_note(cv: CrossValidation) -> str:
    """A line on the machines' host factors, and what "learned" and "host unknown" mean."""
    factors = ", ".join(f"{m} {math.exp(v):.2f}" for m, v in cv.host_factors.items())
    return ("learned: each run told its machine's host factor, from the other families' runs on it; "
            f"host unknown: the same models at the typical factor (1). Host factors: {factors}")


def plot_cross_validation(cv: CrossValidation, path: str | Path) -> Path:
    """Four panels (allocator peak, NVML memory, utilisation, step time), each run's measured value
    against the learned p50 (a bar up to its p90) and the analytical estimate, on unseen families."""
    from dprobe.core.plots import predicted_vs_measured, save_figure, subplots
    from dprobe.profiling.coldstart.residual import apply_stall

    ds = cv.dataset
    y = np.where(ds.valid, ds.y, np.nan)
    base = ds.base.copy()
    apply_stall(base, base.copy(), ds.stall)  # what the benchmark scores as "analytical"
    fig, axes = subplots(len(PANELS), f"Cold start, leave-model-family-out: {cv.runs} runs, "
                                      f"{cv.families} families (each scored by a model that never saw its family)")
    for ax, (k, title, unit, label, log) in zip(axes, PANELS, strict=True):
        predicted_vs_measured(ax, title, y[:, k] / unit, cv.p50[:, k] / unit, cv.p90[:, k] / unit,
                              base[:, k] / unit, "learned", "analytical", label, log=log, legend=k == 0)
    return save_figure(fig, path)
