"""Figures of a quota simulation run (:mod:`dprobe.sim.quota.cluster`): per policy (and per VC) summaries, a
Markdown table, a plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.sim.jobs import DAY
from dprobe.sim.quota.cluster import SimResult
from dprobe.sim.report import WAIT_COLUMNS, cell, footer, long_wait_share, plot_wait_cdf, spread

TABLE_COLUMNS = (  # (key, header, format)
    ("jobs", "jobs", "{:d}"),
    ("rejected_jobs", "rejected", "{:d}"),
    *WAIT_COLUMNS,
    ("waited_over_10min_share", "waited > 10 min", "{:.1%}"),
    ("gpu_hours_provisioned", "GPU-h provisioned", "{:,.0f}"),
    ("gpu_hours_used", "GPU-h used", "{:,.0f}"),
    ("utilization_of_provisioned", "used / provisioned", "{:.1%}"),
    ("scale_events", "scale events", "{:d}"),
)


def summarise(result: SimResult, vc: int | None = None) -> dict:
    """The figures of one run, over all VCs or over VC index ``vc``."""
    jobs = result.jobs
    mine = np.ones(len(jobs), dtype=bool) if vc is None else jobs.vc == vc
    vcs = slice(None) if vc is None else slice(vc, vc + 1)
    waits = result.waits()[mine]
    provisioned = float(result.provisioned_gpu_seconds[vcs].sum()) / 3600
    used = float(result.used_gpu_seconds[vcs].sum()) / 3600
    return {
        "jobs": int(mine.sum()),
        "rejected_jobs": int(result.rejected[mine].sum()),
        "unstarted_jobs": int(result.unstarted[mine].sum()),
        **spread(waits, "wait"),
        "waited_over_10min_share": long_wait_share(waits),
        "gpu_hours_provisioned": provisioned,
        "gpu_hours_used": used,
        "utilization_of_provisioned": used / provisioned if provisioned > 0 else None,
        "scale_events": int(result.scale_events[vcs].sum()),
    }


def policy_report(result: SimResult, per_vc: bool = False) -> dict:
    """``summarise`` over all VCs, with the simulated span, and one entry per VC with ``per_vc``."""
    start = float(result.jobs.submit[0]) if len(result.jobs) else 0.0
    out = {"policy": result.policy, **summarise(result),
           "simulated_days": (result.end_time - start) / DAY, "wall_seconds": result.wall_seconds}
    if per_vc:
        out["vcs"] = [{"vc": name, **summarise(result, v)} for v, name in enumerate(result.jobs.vc_names)]
    return out


def markdown_table(report: dict) -> str:
    """One row per policy (and per policy and VC when the report has them)."""
    per_vc = any("vcs" in p for p in report["policies"])
    head = ["policy", *(["vc"] if per_vc else []), *(h for _, h, _ in TABLE_COLUMNS)]
    lines = [f"### {report['dataset']}: {report['jobs']} jobs, {len(report['vcs'])} VCs, "
             f"{report['log_days']:.1f} days of submissions", "",
             "| " + " | ".join(head) + " |",
             "|---|" + ("---|" if per_vc else "") + "---:|" * len(TABLE_COLUMNS)]
    for p in report["policies"]:
        rows = [("all", p)] + [(v["vc"], v) for v in p.get("vcs", [])]
        for name, row in rows:
            cells = [p["policy"], *([name] if per_vc else []), *(cell(row[k], f) for k, _, f in TABLE_COLUMNS)]
            lines.append("| " + " | ".join(cells) + " |")
    s = report["settings"]
    setting = (f"Decisions every {s['interval_seconds']:g} s, quota increases in service after "
               f"{s['provision_delay_seconds']:g} s, queue {s['queue']}")
    if s.get("scaler_config"):
        setting += f"; the scaler's policy from {s['scaler_config']}"
    labelled = [(p["policy"], p) for p in report["policies"]]
    return "\n".join(lines + footer(setting, report, labelled, "policy"))


def plot_results(results: list[SimResult], path: str | Path) -> Path:
    """Demand against the quota set, over time, for the busiest VC under each policy; and the CDF of
    queueing delay per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results) + 1, 1, figsize=(11, 2.6 * (len(results) + 1)), squeeze=False)
    axes = axes[:, 0]
    jobs = results[0].jobs
    busiest = int(np.argmax(np.bincount(jobs.vc, weights=jobs.duration * jobs.gpus, minlength=len(jobs.vc_names))))
    start = float(jobs.submit[0]) if len(jobs) else 0.0
    for ax, r in zip(axes, results, strict=False):
        days = (r.decision_times - start) / DAY
        ax.step(days, r.demand_at_decision[busiest], where="post", color="black", lw=0.8,
                label="demand (held + queued GPUs)")
        ax.step(days, r.quota_at_decision[busiest], where="post", color="tab:blue", lw=0.8,
                label="quota set (incl. coming up)")
        ax.set_title(f"{r.policy}: VC {jobs.vc_names[busiest]}", fontsize=9)
        ax.set_ylabel("GPUs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
    axes[len(results) - 1].set_xlabel("day", fontsize=8)
    plot_wait_cdf(axes[-1], [(r.policy, r.waits()[~r.rejected]) for r in results], "queueing delay CDF")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
