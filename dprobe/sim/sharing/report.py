"""Tables and pictures of ``dprobe simulate sharing``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.core.plots import save_figure, subplots
from dprobe.core.units import format_bytes


def markdown_table(report: dict) -> str:
    """One row per policy, with the run's settings above."""
    s = report["settings"]
    lines = [
        f"{report['dataset']} ({report['span']} span: {report['scored_pods']} of {report['pods']} pods, "
        f"{report['scored_hours']:.1f} h), GPUs of {format_bytes(s['gpu_memory_bytes'])}, repacked every "
        f"{s['repack_steps']} steps ({s['repack_steps'] * s['step_seconds'] / 60:.1f} min), {s['packing']} packing",
        f"forecaster: {report['forecaster'] or '-'}; {report['note']}",
        "",
        "| policy | GPU-hours | saved vs one per GPU | pod-min over memory | GPU-min over 100 % duty | moves / h |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["policies"]:
        saved = r.get("gpu_hours_saved_pct")
        lines.append(f"| {r['policy']} | {r['gpu_hours']:.1f} | {'–' if saved is None else f'{saved:.1f} %'} | "
                     f"{r['pod_minutes_over_memory_pct']:.3f} % | {r['gpu_minutes_over_duty_pct']:.3f} % | "
                     f"{r['moves_per_hour']:.1f} |")
    notes = [f"{r['policy']}: {r['placements_without_forecast']} placements without a memory forecast (a GPU "
             "of their own)" for r in report["policies"] if r["placements_without_forecast"]]
    return "\n".join(lines + ([""] + notes if notes else []))


def plot_sharing(results: list, path: str | Path, gpu_memory_bytes: float) -> Path:
    """GPUs in use over time per policy (left) and pods on a GPU over its memory (right)."""
    fig, axes = subplots(2, f"GPU sharing, {format_bytes(gpu_memory_bytes)} GPUs")
    for r in results:
        hours = (r.times - r.times[0]) * r.step_seconds / 3600 if len(r.times) else np.zeros(0)
        axes[0].plot(hours, r.gpus, lw=1.2, label=r.policy)
        axes[1].plot(hours, np.cumsum(r.pods_over_memory) * r.step_seconds / 60, lw=1.2, label=r.policy)
    axes[0].set_title("GPUs in use", fontsize=9.5)
    axes[0].set_ylabel("GPUs")
    axes[1].set_title("pods on a GPU over its memory (cumulative)", fontsize=9.5)
    axes[1].set_ylabel("pod-minutes")
    for ax in axes:
        ax.set_xlabel("hours into the scored span")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
