"""Figures of a fixed-size cluster run (:mod:`dprobe.sim.fixed.cluster`): per scheduling x quota policy summaries,
reductions against static quotas and against lending, the issue's targets, a Markdown table and a plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.sim.fixed.cluster import INCLUDED, OVER_CLUSTER, OVER_VC, FixedResult
from dprobe.sim.jobs import DAY
from dprobe.sim.report import WAIT_COLUMNS as ALL_WAIT_COLUMNS
from dprobe.sim.report import cell, footer, long_wait_share, plot_wait_cdf, spread

WAIT_COLUMNS = tuple(c for c in ALL_WAIT_COLUMNS if c[0] in ("mean_wait_seconds", "p95_wait_seconds",
                                                              "p99_wait_seconds"))
TABLE_COLUMNS = (  # (key, header, format): the waits as the quota table shows them, then this mode's own
    ("excluded_jobs", "excluded", "{:d}"), *WAIT_COLUMNS, ("mean_jct_seconds", "mean JCT (s)", "{:.0f}"),
    ("gpu_utilization", "GPU util.", "{:.1%}"), ("preemptions", "preemptions", "{:d}"),
    ("gpus_moved", "GPUs moved", "{:d}"), ("lent_gpu_hours", "lent GPU-h", "{:,.0f}"),
)
TARGET_CUT = 0.5  # forecast-driven quotas should cut the mean queueing delay of static quotas by this much


def summarise_fixed(result: FixedResult, vc: int | None = None) -> dict:
    """The figures of one run, over all VCs or over VC index ``vc``."""
    jobs = result.jobs
    mine = np.ones(len(jobs), dtype=bool) if vc is None else jobs.vc == vc
    waits = result.waits()[mine]
    span = result.end_time - (float(jobs.submit[0]) if len(jobs) else 0.0)
    used = float(result.used_gpu_seconds.sum() if vc is None else result.used_gpu_seconds[vc])

    out = {
        "jobs": int(mine.sum()),
        "excluded_jobs": int((result.excluded[mine] != INCLUDED).sum()),
        "excluded_over_cluster": int((result.excluded[mine] == OVER_CLUSTER).sum()),
        "excluded_over_vc": int((result.excluded[mine] == OVER_VC).sum()),
        "unstarted_jobs": int(result.unstarted[mine].sum()),
        **spread(waits, "wait"),
        "waited_over_10min_share": long_wait_share(waits),
        **spread(result.completion_times()[mine], "jct"),
        "preemptions": int(result.preemptions[mine].sum()),
        "preempted_jobs": int((result.preemptions[mine] > 0).sum()),
        "gpu_hours_used": used / 3600,
    }
    if vc is None:
        out.update({
            "gpu_utilization": used / (result.gpus * span) if span > 0 else None,
            "reclaim_preemptions": result.reclaim_preemptions,
            "las_preemptions": result.las_preemptions,
            "starvation_promotions": result.promotions,
            "restart_gpu_hours": result.restart_gpu_seconds / 3600,
            "quota_changes": int(result.quota_changes.sum()),
            "gpus_moved": result.gpus_moved,
            "lent_gpu_hours": result.lent_gpu_seconds / 3600,
            "simulated_days": span / DAY,
        })
    else:
        out["quota_changes"] = int(result.quota_changes[vc])
    return out


def run_report(result: FixedResult, per_vc: bool = False) -> dict:
    """``summarise_fixed`` over all VCs, named by its policies, with one entry per VC with ``per_vc``."""
    out = {"scheduling": result.scheduling, "quota": result.quota, **summarise_fixed(result),
           "wall_seconds": result.wall_seconds}
    if per_vc:
        out["vcs"] = [{"vc": name, **summarise_fixed(result, v)}
                      for v, name in enumerate(result.jobs.vc_names)]
    return out


def reduction(better: FixedResult, base: FixedResult) -> dict:
    """How much ``better`` cuts ``base``'s queueing delay (1 - better / base), over the jobs both ran."""
    both = (better.excluded == INCLUDED) & (base.excluded == INCLUDED)
    a, b = better.queued_seconds[both], base.queued_seconds[both]
    out: dict[str, float | int | None] = {"jobs": int(both.sum())}
    figures = {"mean": [float(x.mean()) if len(x) else 0.0 for x in (a, b)],
               "p95": [float(np.percentile(x, 95)) if len(x) else 0.0 for x in (a, b)]}
    for key, (fa, fb) in figures.items():
        out[key] = float(1.0 - fa / fb) if fb > 0 else None
    return out


PAIRS = (("forecast", "static"), ("forecast", "reactive"), ("reactive", "static"))


def reductions(results: list[FixedResult]) -> list[dict]:
    """Per scheduling policy, the cuts of each pair in :data:`PAIRS` that the runs have."""
    runs = {(r.scheduling, r.quota): r for r in results}
    out = []
    for sched in dict.fromkeys(r.scheduling for r in results):
        row: dict = {"scheduling": sched}
        for better, base in PAIRS:
            if (sched, better) in runs and (sched, base) in runs:
                row[f"{better}_vs_{base}"] = reduction(runs[sched, better], runs[sched, base])
        out.append(row)
    return out


def targets(rows: list[dict]) -> dict:
    """The issue's targets on these reductions: forecast-driven quotas cut the mean queueing delay of static
    quotas by at least half, and beat lending, under every scheduling policy (None: not measured)."""

    def check(key: str, least: float) -> dict | None:
        cuts = [(r["scheduling"], r[key]["mean"]) for r in rows if key in r]
        if not cuts:
            return None
        worst = min(cuts, key=lambda c: -np.inf if c[1] is None else c[1])
        met = all(c is not None and c >= least and c > 0 for _, c in cuts)
        return {"met": met, "worst_scheduling": worst[0], "worst_cut": worst[1]}

    return {"forecast_halves_static_wait": check("forecast_vs_static", TARGET_CUT),
            "forecast_beats_reactive": check("forecast_vs_reactive", 0.0)}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _cut(cut: dict | None) -> str:
    if cut is None:
        return "–"
    if cut["mean"] is None:
        return "no wait to cut"
    return f"{_pct(cut['mean'])} ({_pct(cut['p95'])})"


def fixed_markdown(report: dict) -> str:
    """One row per scheduling x quota policy, then the reductions and the targets."""
    s = report["settings"]
    per_vc = any("vcs" in r for r in report["runs"])
    head = ["scheduling", "quota", *(["vc"] if per_vc else []), *(h for _, h, _ in TABLE_COLUMNS)]
    lines = [f"### {report['dataset']}: {report['jobs']} jobs, {len(report['vcs'])} VCs, "
             f"{report['log_days']:.1f} days of submissions, {s['gpus']} GPUs fixed "
             f"({s['nodes']} nodes of {s['gpus_per_node']})", "",
             "| " + " | ".join(head) + " |",
             "|---|---|" + ("---|" if per_vc else "") + "---:|" * len(TABLE_COLUMNS)]
    for r in report["runs"]:
        for name, row in [("all", r)] + [(v["vc"], v) for v in r.get("vcs", [])]:
            cells = [r["scheduling"], r["quota"], *([name] if per_vc else []),
                     *(cell(row.get(k), f) for k, _, f in TABLE_COLUMNS)]
            lines.append("| " + " | ".join(cells) + " |")
    pairs = [p for p in (f"{a}_vs_{b}" for a, b in PAIRS) if any(p in row for row in report["reductions"])]
    if pairs:
        lines += ["", "Cut in mean (p95) queueing delay, over the jobs both policies ran:", "",
                  "| scheduling | " + " | ".join(p.replace("_vs_", " vs ") for p in pairs) + " |",
                  "|---|" + "---:|" * len(pairs)]
        for row in report["reductions"]:
            cells = [_cut(row.get(p)) for p in pairs]
            lines.append(f"| {row['scheduling']} | " + " | ".join(cells) + " |")
    lines.append("")
    words = {"forecast_halves_static_wait": "forecast-driven quotas cut the mean queueing delay of static "
             "quotas by at least 50 % under every scheduling policy",
             "forecast_beats_reactive": "forecast-driven quotas wait less than lending under every "
             "scheduling policy"}
    for key, text in words.items():
        t = report["targets"].get(key)
        if t is not None:
            verdict = "met" if t["met"] else "MISSED"
            worst = "the other waits 0 s" if t["worst_cut"] is None else f"least cut {_pct(t['worst_cut'])}"
            lines.append(f"Target, {text}: {verdict} ({worst}, {t['worst_scheduling']}).")
    reclaim = "preempting lent jobs" if s["preempt"] else "waiting for lent jobs to finish"
    setting = (f"Quota decisions every {s['interval_seconds']:g} s; GPUs lent after "
               f"{s['lend_delay_seconds']:g} s idle, reclaimed by {reclaim}; "
               f"restart cost {s['restart_cost_seconds']:g} s")
    labelled = [(f"{r['scheduling']}/{r['quota']}", r) for r in report["runs"]]
    return "\n".join(lines + footer(setting, report, labelled, "run"))


def plot_fixed(results: list[FixedResult], path: str | Path, top_vcs: int = 8) -> Path:
    """The CDF of queueing delay per quota policy, one panel per scheduling policy; then, for the first
    scheduling policy, each VC's quota over time under each quota policy (the ``top_vcs`` busiest VCs,
    the rest together)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scheds = list(dict.fromkeys(r.scheduling for r in results))
    first = [r for r in results if r.scheduling == scheds[0]]
    rows = len(scheds) + len(first)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.5 * rows), squeeze=False)
    axes = axes[:, 0]
    for ax, sched in zip(axes, scheds, strict=False):
        curves = [(r.quota, r.waits()[r.excluded == INCLUDED]) for r in results if r.scheduling == sched]
        plot_wait_cdf(ax, curves, f"{sched}: queueing delay CDF")
    jobs = results[0].jobs
    start = float(jobs.submit[0]) if len(jobs) else 0.0
    work = np.bincount(jobs.vc, weights=jobs.duration * jobs.gpus, minlength=len(jobs.vc_names))
    busiest = list(np.argsort(-work)[:top_vcs])
    rest = [v for v in range(len(jobs.vc_names)) if v not in busiest]
    for ax, r in zip(axes[len(scheds):], first, strict=False):
        days = (r.decision_times - start) / DAY
        layers = [r.quota_at_decision[v] for v in busiest]
        labels = [jobs.vc_names[v] for v in busiest]
        if rest:
            layers.append(r.quota_at_decision[rest].sum(axis=0))
            labels.append(f"{len(rest)} others")
        ax.stackplot(days, *layers, labels=labels, step="post", lw=0)
        ax.set_title(f"{r.quota} quotas per VC ({r.scheduling})", fontsize=9)
        ax.set_ylabel("GPUs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left", ncol=min(len(labels), 5))
    axes[-1].set_xlabel("day", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
