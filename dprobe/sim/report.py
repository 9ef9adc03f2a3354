"""What the simulators' reports share: spreads of waiting times, the JSON or Markdown printout, a table's
cells and footer, and the wait-time CDF of the job-log replays' plots."""

from __future__ import annotations

import numpy as np

LONG_WAIT_SECONDS = 600.0  # "waited more than 10 minutes"
WAIT_COLUMNS = (  # (key, header, format): the queueing delays as the job-log replays' tables show them
    ("mean_wait_seconds", "mean wait (s)", "{:.0f}"),
    ("p50_wait_seconds", "p50 (s)", "{:.0f}"),
    ("p95_wait_seconds", "p95 (s)", "{:.0f}"),
    ("p99_wait_seconds", "p99 (s)", "{:.0f}"),
)


def spread(values: np.ndarray, name: str) -> dict:
    """``mean_{name}_seconds`` and its p50, p95 and p99 over ``values`` (NaNs left out); None if empty."""
    values = values[~np.isnan(values)]
    out = {f"mean_{name}_seconds": float(values.mean()) if len(values) else None}
    for q in (50, 95, 99):
        out[f"p{q}_{name}_seconds"] = float(np.percentile(values, q)) if len(values) else None
    return out


def long_wait_share(waits: np.ndarray) -> float | None:
    """The share of jobs (NaNs left out) that waited more than :data:`LONG_WAIT_SECONDS`."""
    waits = waits[~np.isnan(waits)]
    return float((waits > LONG_WAIT_SECONDS).mean()) if len(waits) else None


def print_report(report: dict, as_json: bool, table) -> None:
    """``report`` as one JSON object on stdout, or as the Markdown ``table(report)``."""
    import json
    import sys

    if as_json:
        json.dump(report, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(table(report))


def cell(value: object, fmt: str) -> str:
    """A table cell: ``value`` in ``fmt``, or a dash for None."""
    return "–" if value is None else fmt.format(value)


def footer(setting: str, report: dict, rows: list[tuple[str, dict]], unit: str) -> list[str]:
    """The lines under a table: ``setting`` and the forecast, jobs never started and the time of each
    ``(label, row)``."""
    s = report["settings"]
    if report.get("forecaster"):
        setting += (f"; forecast {s['horizon_seconds']:g} s ahead at p{s['quantile'] * 100:g} "
                    f"by {report['forecaster']}")
    lines = ["", setting + "."]
    unstarted = [f"{label} {row['unstarted_jobs']}" for label, row in rows if row["unstarted_jobs"]]
    if unstarted:
        lines.append(f"Jobs never started (counted as waiting until the end): {', '.join(unstarted)}.")
    timing = ", ".join(f"{label} {row['wall_seconds']:.1f}s" for label, row in rows)
    return [*lines, f"Time per {unit}: {timing}", ""]


def plot_wait_cdf(ax, curves: list[tuple[str, np.ndarray]], title: str) -> None:
    """One CDF of queueing delay per ``(label, waits)`` on a log scale, 10 minutes dotted."""
    for label, waits in curves:
        waits = np.sort(waits)
        if len(waits):
            ax.step(np.maximum(waits, 1.0), np.arange(1, len(waits) + 1) / len(waits), where="post",
                    label=label, lw=1.0)
    ax.set_xscale("log")
    ax.set_xlabel("queueing delay (s; below 1 s drawn at 1 s)", fontsize=8)
    ax.set_ylabel("share of jobs", fontsize=8)
    ax.axvline(LONG_WAIT_SECONDS, color="grey", ls=":", lw=0.8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{title} (dotted: 10 min)", fontsize=9)
