"""A picture of the leave-family-out scores: predicted against measured, run by run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

GIB = 2**30
# target index -> (title, unit factor, unit, log axes)
PANELS = [(0, "allocator peak", GIB, "GiB", True), (1, "device memory (NVML)", GIB, "GiB", True),
          (2, "GPU utilisation", 0.01, "%", False), (3, "step time", 1e-3, "ms", True)]


def plot_cross_validation(cv: dict[str, Any], path: str | Path) -> Path:
    """Four panels (allocator peak, NVML memory, utilisation, step time), each run's measured value
    against the learned p50 (a bar up to its p90) and the analytical estimate, on unseen families.

    ``cv`` is what :func:`dprobe.coldstart.train.cross_validate` returns.
    """
    from dprobe.coldstart.train import apply_stall
    from dprobe.plots import predicted_vs_measured, save_figure, subplots

    ds = cv["dataset"]
    y = np.where(ds["valid"], ds["y"], np.nan)
    base = ds["base"].copy()
    apply_stall(base, base.copy(), ds["stall"])  # what the benchmark scores as "analytical"
    fig, axes = subplots(len(PANELS), f"Cold start, leave-model-family-out: {cv['runs']} runs, "
                                      f"{cv['families']} families (each scored by a model that never saw its family)")
    for ax, (k, title, unit, label, log) in zip(axes, PANELS, strict=True):
        predicted_vs_measured(ax, title, y[:, k] / unit, cv["p50"][:, k] / unit, cv["p90"][:, k] / unit,
                              base[:, k] / unit, "learned", "analytical", label, log=log, legend=k == 0)
    return save_figure(fig, path)
