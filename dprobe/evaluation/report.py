"""Render evaluation results: Markdown table, JSON, and a plot of forecasts against actuals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dprobe.evaluation.scoring import EvalResult, against_baselines

GIB = 2**30


def _fmt(value: float | None, target: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    if target.endswith("_bytes"):
        return f"{value / GIB:.3f} GiB"
    return f"{value:.3f}"


def markdown_table(result: EvalResult) -> str:
    """One row per method, target and lead; the best MAE and pinball per (target, lead) in bold."""
    best_mae: dict[tuple, float] = {}
    best_pin: dict[tuple, float] = {}
    for r in result.rows:
        key = (r["target"], r["lead_steps"])
        best_mae[key] = min(best_mae.get(key, np.inf), r["mae"])
        if r["pinball"] is not None:
            best_pin[key] = min(best_pin.get(key, np.inf), r["pinball"])
    lines = [
        f"### {result.dataset}",
        "",
        "| target | lead (steps) | method | MAE | MASE | pinball | cover p90 | cover p99 | forecasts |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(result.rows, key=lambda r: (r["target"], r["lead_steps"], r["mae"])):
        key = (r["target"], r["lead_steps"])
        mae = _fmt(r["mae"], r["target"])
        pin = _fmt(r["pinball"], r["target"])
        if r["mae"] == best_mae[key]:
            mae = f"**{mae}**"
        if r["pinball"] is not None and r["pinball"] == best_pin.get(key):
            pin = f"**{pin}**"
        cov90 = "–" if r["coverage_p90"] is None else f"{r['coverage_p90']:.1%}"
        cov99 = "–" if r.get("coverage_p99") is None else f"{r['coverage_p99']:.1%}"
        mase = "–" if r["mase"] is None else f"{r['mase']:.3f}"
        lines.append(f"| {r['target']} | {r['lead_steps']} | {r['method']} | {mae} | {mase} | {pin} | "
                     f"{cov90} | {cov99} | {r['n_forecasts']} |")
    timing = ", ".join(f"{m} {s:.1f}s" for m, s in result.seconds.items())
    lines += ["", f"Time per method: {timing}", ""]
    summary = against_baselines(result.rows)
    if summary:
        lines += ["dprobe against the best baseline of each row (a ratio below 1: dprobe's error is lower):", "",
                  "| target | lead (steps) | MAE ratio | best baseline MAE | pinball ratio | best baseline pinball "
                  "| dprobe cover p90 / p99 |",
                  "|---|---:|---:|---|---:|---|---:|"]
        for r in summary:
            cover = " / ".join("–" if v is None else f"{v:.1%}" for v in (r["coverage_p90"], r["coverage_p99"]))
            lines.append(f"| {r['target']} | {r['lead_steps']} | {_ratio(r['mae_ratio'])} | {r['best_mae']} | "
                         f"{_ratio(r['pinball_ratio'])} | {r['best_pinball'] or '–'} | {cover} |")
        lines.append("")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "–" if value is None else (f"**{value:.2f}**" if value < 1 else f"{value:.2f}")


def plot_forecasts(result: EvalResult, path: str | Path, methods: list[str] | None = None,
                   n_series: int = 3, lead_index: int = 1) -> Path:
    """Draw actuals and forecasts (p50 with the p50–p90 band) for a few series of each target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = methods or list(result.forecasts)
    targets = list(result.actuals)
    fig, axes = plt.subplots(len(targets), n_series, figsize=(5 * n_series, 3.2 * len(targets)), squeeze=False)
    for i, target in enumerate(targets):
        series = result.actuals[target]
        # the most variable series are the interesting ones
        ids = sorted(series, key=lambda u: -np.nanstd(series[u][-len(series[u]) // 3 :]))[:n_series]
        for k, uid in enumerate(ids):
            ax = axes[i][k]
            scale = GIB if target.endswith("_bytes") else 1.0
            y = series[uid] / scale
            start = result.test_start[f"{target}/{uid}"]
            lo = max(0, start - 100)
            ax.plot(np.arange(lo, len(y)), y[lo:], color="black", lw=1.2, label="actual", zorder=3)
            ax.axvline(start, color="grey", ls=":", lw=1)
            for method in methods:
                f = result.forecasts.get(method, {}).get(target, {}).get(uid)
                if f is None:
                    continue
                j = min(lead_index, f.point.shape[1] - 1)
                h = _lead_of(result, target, j)
                x = f.origins + h
                line = ax.plot(x, f.point[:, j] / scale, lw=0.9, label=f"{method} (+{h})")[0]
                if f.quantiles is not None and method in methods[-1:]:
                    ax.fill_between(x, f.quantiles[:, j, 0] / scale, f.quantiles[:, j, 1] / scale, color=line.get_color(),
                                    alpha=0.2, lw=0)
            unit = " (GiB)" if scale == GIB else ""
            ax.set_title(f"{target}{unit} · {uid[:12]}", fontsize=9)
            ax.set_xlabel("step", fontsize=7)
            ax.tick_params(labelsize=7)
        axes[i][0].legend(fontsize=6, loc="upper left")
    fig.suptitle(f"{result.dataset}: forecasts against actuals (dotted line: test start)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _lead_of(result: EvalResult, target: str, j: int) -> int:
    leads = sorted({r["lead_steps"] for r in result.rows if r["target"] == target})
    return leads[j]
