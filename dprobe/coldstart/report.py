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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ds = cv["dataset"]
    y = np.where(ds["valid"], ds["y"], np.nan)
    base = ds["base"].copy()
    from dprobe.coldstart.train import apply_stall

    apply_stall(base, base.copy(), ds["stall"])  # what the benchmark scores as "analytical"
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.6))
    for ax, (k, title, unit, label, log) in zip(axes, PANELS, strict=True):
        ok = ~np.isnan(y[:, k])
        meas, p50, p90, ana = (a[ok, k] / unit for a in (y, cv["p50"], cv["p90"], base))
        ax.scatter(meas, ana, s=14, marker="x", color="0.6", label="analytical", zorder=2)
        ax.errorbar(meas, p50, yerr=[np.zeros_like(p50), np.maximum(p90 - p50, 0)], fmt="o", ms=3.5,
                    color="tab:blue", ecolor="tab:blue", elinewidth=0.6, alpha=0.8, label="learned p50 (bar: p90)",
                    zorder=3)
        lo = np.nanmin([meas.min(), p50.min(), ana.min()])
        hi = np.nanmax([meas.max(), p90.max(), ana.max()])
        lo, hi = (max(lo, 1e-9) / 1.2, hi * 1.2) if log else (min(lo, 0) - 2, max(hi, 100) + 2)
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", zorder=1)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(FormatStrFormatter("%g"))
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        if k == 2:
            err = f"MAE {np.mean(np.abs(p50 - meas)):.1f} points (analytical {np.mean(np.abs(ana - meas)):.1f})"
        else:
            err = (f"MAPE {100 * np.mean(np.abs(p50 / meas - 1)):.1f} % "
                   f"(analytical {100 * np.mean(np.abs(ana / meas - 1)):.1f} %)")
        ax.set_title(f"{title}\n{err}", fontsize=10)
        ax.set_xlabel(f"measured ({label})")
        ax.set_ylabel(f"predicted ({label})")
        ax.grid(alpha=0.3, which="both" if log else "major")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Cold start, leave-model-family-out: {cv['runs']} runs, {cv['families']} families "
                 "(each scored by a model that never saw its family)", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
