"""The job-scale model's leave-family-out scores: by variant, as a table, and as a picture."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.profiling.jobscale.features import FIRST_SECONDS, HORIZON_SECONDS, JobScaleDataset
from dprobe.profiling.jobscale.model import LEVELS


def scores(y: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """Plateau MAPE (%), worst APE, utilisation MAE (points), p90 / p99 coverage of both targets."""
    ape = np.abs(q[:, 0, 0] - y[:, 0]) / y[:, 0] * 100
    out = {"plateau_mape": float(ape.mean()), "plateau_worst_ape": float(ape.max()),
           "util_mae_points": float(np.abs(q[:, 1, 0] - y[:, 1]).mean() * 100)}
    if q.shape[2] == len(LEVELS):
        out["p90_coverage"] = float((y <= q[:, :, 1]).mean())
        out["p99_coverage"] = float((y <= q[:, :, 2]).mean())
    return out


def plot_cross_validation(ds: JobScaleDataset, preds: dict[str, np.ndarray], variant: str,
                          path: str | Path) -> Path:
    """Plateau and utilisation of each run against ``variant``'s p50 (a bar up to its p90) and *persist*."""
    from dprobe.core.plots import predicted_vs_measured, save_figure, subplots

    fig, axes = subplots(2, f"Job scale, leave-model-family-out: {len(ds.run_ids)} runs, "
                            f"{len(set(ds.families))} families (what the next {HORIZON_SECONDS:g} s bring, "
                            f"after {FIRST_SECONDS:g} s of samples)")
    q, ref = preds[variant], preds["persist"]
    predicted_vs_measured(axes[0], "memory plateau", ds.measured[:, 0] / 2**30, q[:, 0, 0] / 2**30,
                          q[:, 0, 1] / 2**30, ref[:, 0, 0] / 2**30, variant, "persist", "GiB", log=True)
    predicted_vs_measured(axes[1], "mean GPU utilisation", 100 * ds.measured[:, 1], 100 * q[:, 1, 0],
                          100 * q[:, 1, 1], 100 * ref[:, 1, 0], variant, "persist", "%", log=False)
    return save_figure(fig, path)


def format_table(result: dict[str, dict[str, float]], n_runs: int, n_families: int, folds: int | None = None) -> str:
    grouped = f" in {folds} folds" if folds is not None and folds < n_families else ""
    lines = [f"### job scale: h200-profiles, {n_runs} runs, {n_families} families, leave-family-out{grouped}",
             "", "| method | plateau MAPE | worst APE | util MAE (points) | p90 cover | p99 cover |",
             "|---|---:|---:|---:|---:|---:|"]
    for v, m in result.items():
        cov90 = f"{m['p90_coverage']:.0%}" if "p90_coverage" in m else "–"
        cov99 = f"{m['p99_coverage']:.0%}" if "p99_coverage" in m else "–"
        lines.append(f"| {v} | {m['plateau_mape']:.1f}% | {m['plateau_worst_ape']:.1f}% | "
                     f"{m['util_mae_points']:.1f} | {cov90} | {cov99} |")
    return "\n".join(lines) + "\n"
