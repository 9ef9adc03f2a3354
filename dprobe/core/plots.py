"""Predicted-against-measured pictures shared by the cold-start and job-scale reports, and the check every
``--plot`` option makes of its file before any work is done."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def subplots(n: int, title: str):
    """A row of ``n`` square-ish panels with a title, drawn off-screen (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 4.6))
    fig.suptitle(title, fontsize=11)
    return fig, np.atleast_1d(axes)


def predicted_vs_measured(ax, title: str, measured: np.ndarray, p50: np.ndarray, p90: np.ndarray | None,
                          reference: np.ndarray | None, label: str, reference_label: str, unit: str,
                          log: bool = False, legend: bool = True) -> None:
    """One panel: each run's measured value against ``p50`` (a bar up to ``p90``) and ``reference``
    (grey crosses), the diagonal, and both errors in the title (MAPE, or MAE in points for %).
    NaN measurements are left out."""
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ok = ~np.isnan(measured)
    meas, p50 = measured[ok], p50[ok]
    if reference is not None:
        ax.scatter(meas, reference[ok], s=14, marker="x", color="0.6", label=reference_label, zorder=2)
    upper = np.zeros_like(p50) if p90 is None else np.maximum(p90[ok] - p50, 0)
    ax.errorbar(meas, p50, yerr=[np.zeros_like(p50), upper], fmt="o", ms=3.5, color="tab:blue",
                elinewidth=0.6, alpha=0.8, label=f"{label} p50" + (" (bar: p90)" if p90 is not None else ""),
                zorder=3)
    values = [meas, p50 + upper] + ([reference[ok]] if reference is not None else [])
    lo, hi = min(np.nanmin(v) for v in values), max(np.nanmax(v) for v in values)
    lo, hi = (max(lo, 1e-12) / 1.2, hi * 1.2) if log else (min(lo, 0.0) - 2, max(hi, 100.0) + 2)
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", zorder=1)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)

    def error(pred: np.ndarray) -> str:
        if unit == "%":
            return f"MAE {np.mean(np.abs(pred - meas)):.1f} points"
        return f"MAPE {100 * np.mean(np.abs(pred / meas - 1)):.1f} %"

    errors = f"{label}: {error(p50)}" + (f", {reference_label}: {error(reference[ok])}" if reference is not None
                                         else "")
    ax.set_title(f"{title}\n{errors}", fontsize=9.5)
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ax.grid(alpha=0.3, which="both" if log else "major")
    if legend:
        ax.legend(fontsize=8, loc="upper left")


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write as PNG (creating the directory) and close ``fig``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_plot_path(path: str | Path, flag: str = "--plot") -> None:
    """A ValueError, before any work is done, for a plot that could not be written to ``path``: a folder
    that does not exist or cannot be written to, or a file type matplotlib does not write."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise ValueError(f"{flag} {path}: name a file ending in .png, .pdf or .svg (matplotlib writes "
                         f"{', '.join(sorted(formats))})")
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        why = "is a folder" if path.is_dir() else (f"no folder {folder}" if not folder.is_dir()
                                                   else f"cannot write to {folder}")
        raise ValueError(f"{flag} {path}: {why}")
