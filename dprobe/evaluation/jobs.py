"""Scoring forecasts of whole jobs (h200-profiles' training runs, one short series each), leave-family-out.

A data set of whole jobs is split by model family (:meth:`~dprobe.core.split.Split.group_role`): the runs
of the test families, which the forecaster never trained or calibrated on, are forecast from their first
second on at the data set's horizons (1, 5 and 10 s). Beside the forecaster given each run's model graph:

- the same forecaster told nothing of the workload (its learned "unknown workload" embedding),
- *last_value* (persistence), with quantiles from the training families' own errors at each lead,
- from the first second only, the job-scale model (:mod:`dprobe.profiling.jobscale`): its memory
  plateau and mean utilisation over the next ten seconds, taken as the forecast at every lead, from
  its leave-family-out predictions (each run predicted by a fold that never saw its family).

The memory plateau (90th percentile of the run's memory over the ten seconds after its first) is
scored as the job-scale report scores it: a forecaster's plateau is the largest of its p50s over
the leads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from dprobe.core import metrics
from dprobe.core.names import QUANTILES
from dprobe.core.split import Split
from dprobe.data.common import SeriesDataset
from dprobe.evaluation.scoring import EvalResult, SeriesForecasts
from dprobe.forecaster.base import Forecaster, ForecastInput
from dprobe.forecaster.baselines import ffill

UNKNOWN_SUFFIX = "_unknown_workload"
JOBSCALE = "jobscale"
# the job-scale model's targets, as this data set's metrics: memory in bytes, utilisation 0-1 -> percent
JOBSCALE_TARGETS = {"gpu_memory_bytes": (0, 1.0), "gpu_duty_cycle_pct": (1, 100.0)}
PLATEAU_SECONDS = 10.0


def _families(ds: SeriesDataset) -> dict[str, str]:
    """Each run's family (``ds.groups``); a ValueError for a data set split in time."""
    if ds.groups is None:
        raise ValueError(f"{ds.name} is split in time, not by family: score it with evaluate_dataset")
    return ds.groups


def held_out_runs(ds: SeriesDataset, split: Split) -> list[str]:
    """The runs of the families ``split`` leaves for testing."""
    groups = _families(ds)
    return [u for u in ds.series_ids if split.group_role(groups.get(u, u)) == "test"]


def _origins(y: np.ndarray, first: int, lead: int) -> np.ndarray:
    return np.arange(first, max(first, len(y) - lead))


def persistence_offsets(ds: SeriesDataset, target: str, split: Split) -> np.ndarray:
    """``(H, Q)``: quantiles of ``y[t + h] - y[t]`` over the training families' runs, per lead: what the
    last value plus them gives as persistence's quantiles."""
    series = ds.arrays(target)
    groups = _families(ds)
    train = [u for u in series if split.group_role(groups.get(u, u)) == "train"]
    out = np.zeros((len(ds.lead_steps), len(QUANTILES)))
    for j, h in enumerate(ds.lead_steps):
        diffs = []
        for u in train:
            y = series[u]
            t = _origins(y, ds.first_origin, h)
            t = t[t + h < len(y)]
            d = y[t + h] - y[t]
            diffs.append(d[np.isfinite(d)])
        d = np.concatenate(diffs) if diffs else np.zeros(1)
        out[j] = np.quantile(d, QUANTILES) if len(d) else 0.0
    return out


def _model_forecasts(model: Forecaster, ds: SeriesDataset, target: str, y: np.ndarray, origins: np.ndarray,
                     graph: Any) -> SeriesForecasts:
    context = int(getattr(model, "context_length", 128))
    padded = np.concatenate([np.full(context - 1, np.nan), y])
    windows = np.stack([padded[t: t + context] for t in origins])  # (N, context), ending at each origin
    f = model.predict(ForecastInput(values=windows, metric=target, leads=ds.lead_steps,
                                    step_seconds=ds.freq.total_seconds(),
                                    graphs=[graph] * len(origins) if graph is not None else None))
    return SeriesForecasts(origins=origins, point=f.point, quantiles=f.quantiles)


def evaluate_jobs(ds: SeriesDataset, models: dict[str, Forecaster] | None = None, split: Split | None = None,
                  graphs: dict[str, Any] | None = None,
                  on_method: Callable[[str, float], None] | None = None) -> EvalResult:
    """An :class:`~dprobe.evaluation.harness.EvalResult` of persistence and every forecaster in ``models`` on
    the test families' runs of ``ds`` (a data set of whole jobs), from each run's first second on; a
    forecaster that takes workloads is scored twice, with each run's graph (``graphs``: run id -> model
    graph) and without (``<name>_unknown_workload``)."""
    split = split or Split()
    models = models or {}
    for name, model in models.items():  # a model of other series would average a job's seconds into minutes
        tasks = getattr(model, "tasks", None)
        if tasks is not None and not any(t.dataset == ds.name for t in tasks):
            raise ValueError(f"forecaster {name!r} was trained without {ds.name}'s job series (its tasks: "
                             f"{', '.join(sorted({t.dataset for t in tasks}))}): train one with "
                             "`python train.py +exp=jobs`, or score the baselines alone (--checkpoint none)")
    runs = held_out_runs(ds, split)
    result = EvalResult(dataset=ds.name, rows=[])
    if not runs:
        return result
    for target in ds.targets:
        series = {u: y for u, y in ds.arrays(target).items() if u in runs and len(y) > ds.first_origin}
        origins = {u: _origins(y, ds.first_origin, min(ds.lead_steps)) for u, y in series.items()}
        series = {u: y for u, y in series.items() if len(origins[u])}
        starts = dict.fromkeys(series, 0)  # nothing before a job: no MASE scale
        result.actuals[target] = series
        result.test_start.update({f"{target}/{u}": ds.first_origin for u in series})
        offsets = persistence_offsets(ds, target, split)
        # method -> (forecaster or None for persistence, whether it is given each run's graph)
        methods: dict[str, tuple[Forecaster | None, bool]] = {"last_value": (None, False)}
        for name, model in models.items():
            methods[name] = (model, True)
            if getattr(model, "conditioned", False):
                methods[name + UNKNOWN_SUFFIX] = (model, False)
        for method, (forecaster, with_graph) in methods.items():
            t0 = time.perf_counter()
            per = {u: _persist(y, origins[u], offsets) if forecaster is None else
                   _model_forecasts(forecaster, ds, target, y, origins[u],
                                    (graphs or {}).get(u) if with_graph else None)
                   for u, y in series.items()}
            elapsed = time.perf_counter() - t0
            result.record(method, target, ds, per, series, starts, elapsed)
            if on_method:
                on_method(method, elapsed)
    return result


def _persist(y: np.ndarray, origins: np.ndarray, offsets: np.ndarray) -> SeriesForecasts:
    last = ffill(y)[origins]  # the last value observed at each origin
    point = np.repeat(last[:, None], offsets.shape[0], axis=1)
    return SeriesForecasts(origins=origins, point=point, quantiles=point[..., None] + offsets[None])


def read_jobscale_predictions(path: str, variant: str = "graph") -> dict[str, np.ndarray]:
    """Run id -> ``(2, 3)`` leave-family-out quantiles (memory plateau bytes, utilisation 0-1; p50 / p90 /
    p99) of the job-scale model's ``variant``, from the ``lofo.csv`` its training writes."""
    table = pd.read_csv(path, dtype={"run_id": str})
    missing = {"run_id", "variant", "target", "p50", "p90", "p99"} - set(table.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    table = table[table["variant"] == variant]
    if table.empty:
        raise ValueError(f"{path}: no predictions of variant {variant!r}")
    out: dict[str, np.ndarray] = {}
    for run_id, rows in table.groupby("run_id"):
        q = np.full((2, 3), np.nan)
        for _, r in rows.iterrows():
            q[0 if r["target"] == "memory_plateau_bytes" else 1] = [r["p50"], r["p90"], r["p99"]]
        out[str(run_id)] = q
    return out


def first_second_rows(result: EvalResult, ds: SeriesDataset,
                      jobscale: dict[str, np.ndarray] | None = None) -> list[dict]:
    """Rows (method, target, lead, MAE, pinball, runs) of every method's forecasts made at each test run's
    first second, the job-scale model's among them where ``jobscale`` has the run; and per method a
    ``memory plateau MAPE %`` row (the largest p50 over the leads against the measured plateau)."""
    first = ds.first_origin
    plateau_steps = int(round(PLATEAU_SECONDS / ds.freq.total_seconds()))
    rows = []
    methods = list(result.forecasts)
    for target, series in result.actuals.items():
        candidates = dict(result.forecasts.items())
        if jobscale:
            index, factor = JOBSCALE_TARGETS[target]
            candidates[JOBSCALE] = {target: {
                u: SeriesForecasts(origins=np.array([first]),
                                point=np.full((1, len(ds.lead_steps)), jobscale[u][index, 0] * factor),
                                quantiles=np.repeat(jobscale[u][index][None, None] * factor, len(ds.lead_steps), 1))
                for u in series if u in jobscale and np.isfinite(jobscale[u][index]).all()}}
        for method, per_target in candidates.items():
            per = per_target.get(target, {})
            common = [u for u in series if u in per and per[u].origins[0] == first
                      and (not jobscale or u in jobscale)]
            for j, h in enumerate(ds.lead_steps):
                act, pt, qs = [], [], []
                for u in common:
                    y = series[u]
                    if first + h < len(y) and np.isfinite(y[first + h]):
                        act.append(y[first + h])
                        pt.append(per[u].point[0, j])
                        quantiles = per[u].quantiles
                        if quantiles is None:
                            raise ValueError(f"{method} gave no quantiles of {u} to score its pinball loss "
                                             "with")
                        qs.append(quantiles[0, j])
                if act:
                    a, q = np.asarray(act), np.asarray(qs)
                    rows.append({"method": method, "target": target, "horizon_seconds": h * ds.freq.total_seconds(),
                                 "mae": metrics.mae(a, np.asarray(pt)), "pinball": metrics.pinball(a, q, QUANTILES),
                                 "runs": len(a)})
            if target == "gpu_memory_bytes" and common:
                ape = []
                for u in common:
                    later = series[u][first + 1: first + 1 + plateau_steps]
                    later = later[np.isfinite(later)]
                    if len(later) < 3:
                        continue
                    measured = float(np.quantile(later, 0.9))
                    predicted = float(np.max(per[u].point[0]))
                    ape.append(abs(predicted - measured) / measured)
                if ape:
                    rows.append({"method": method, "target": "memory plateau", "horizon_seconds": PLATEAU_SECONDS,
                                 "mape_pct": 100 * float(np.mean(ape)), "runs": len(ape)})
    order = {m: i for i, m in enumerate([*methods, JOBSCALE])}
    return sorted(rows, key=lambda r: (r["target"], r["horizon_seconds"], order.get(r["method"], 99)))


def job_table(result: EvalResult, first_rows: list[dict]) -> str:
    """Markdown: pinball and MAE per method, metric and lead over every origin from the first second on,
    the same from the first second alone (with the job-scale model), and the memory plateau's MAPE."""
    def fmt(target: str, v: float) -> str:
        return f"{v / 2**30:.3f} GiB" if target == "gpu_memory_bytes" else f"{v:.2f} pts"

    lines = [f"### {result.dataset}: test families' runs, every origin from the first second on", "",
             "| target | horizon (s) | method | MAE | pinball | forecasts | runs |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in sorted(result.rows, key=lambda r: (r["target"], r["lead_steps"], r["pinball"] or np.inf)):
        lines.append(f"| {r['target']} | {r['horizon_seconds']:g} | {r['method']} | {fmt(r['target'], r['mae'])} | "
                     f"{fmt(r['target'], r['pinball'])} | {r['n_forecasts']} | {r['n_series']} |")
    lines += ["", "### From each test run's first second (the job-scale model's view)", "",
              "| target | horizon (s) | method | MAE | pinball | runs |", "|---|---:|---|---:|---:|---:|"]
    for r in first_rows:
        if "mape_pct" in r:
            continue
        lines.append(f"| {r['target']} | {r['horizon_seconds']:g} | {r['method']} | {fmt(r['target'], r['mae'])} | "
                     f"{fmt(r['target'], r['pinball'])} | {r['runs']} |")
    plateau = [r for r in first_rows if "mape_pct" in r]
    if plateau:
        lines += ["", "| memory plateau over the next 10 s | MAPE | runs |", "|---|---:|---:|"]
        lines += [f"| {r['method']} | {r['mape_pct']:.1f} % | {r['runs']} |" for r in plateau]
    return "\n".join(lines) + "\n"


def ratios(result: EvalResult, baseline: str, method: str) -> dict[tuple[str, float], float]:
    """``(target, horizon seconds) -> 1 - pinball(method) / pinball(baseline)``: how much lower ``method``'s
    pinball is, over every origin (what the targets are stated in)."""
    pin = {(r["method"], r["target"], r["horizon_seconds"]): r["pinball"] for r in result.rows}
    out = {}
    for (m, target, horizon_seconds), p in pin.items():
        b = pin.get((baseline, target, horizon_seconds))
        if m == method and b:
            out[(target, horizon_seconds)] = 1 - p / b
    return out


def target_lines(result: EvalResult, first_rows: list[dict], method: str = "dprobe") -> list[str]:
    """The job series' targets, met or not: pinball at 5 and 10 s at least 15 % below the unknown-workload
    embedding's and 30 % below persistence's; the memory plateau's MAPE no worse than the job-scale
    model's."""
    lines = []
    for baseline, goal in ((method + UNKNOWN_SUFFIX, 0.15), ("last_value", 0.30)):
        for (target, horizon_seconds), gain in sorted(ratios(result, baseline, method).items()):
            if horizon_seconds < 5:
                continue
            verdict = "met" if gain >= goal else "MISSED"
            change = f"{100 * gain:.1f} % lower than" if gain >= 0 else f"{-100 * gain:.1f} % higher than"
            lines.append(f"- {target} at {horizon_seconds:g} s: pinball {change} {baseline}'s (target: at least "
                         f"{100 * goal:.0f} % lower): {verdict}")
    plateau = {r["method"]: r["mape_pct"] for r in first_rows if "mape_pct" in r}
    if method in plateau and JOBSCALE in plateau:
        verdict = "met" if plateau[method] <= plateau[JOBSCALE] else "MISSED"
        lines.append(f"- memory plateau MAPE {plateau[method]:.1f} % against the job-scale model's "
                     f"{plateau[JOBSCALE]:.1f} % on the same runs: {verdict}")
    return lines


def job_report(forecaster: Forecaster, data_dir: str, jobscale_predictions: str | None = None,
               cache_dir: str | None = None, variant: str = "graph") -> tuple[str, dict]:
    """Markdown and a JSON-able summary of ``forecaster`` on the job series of ``data_dir`` (h200-profiles
    layout), leave-family-out by the split it records, beside persistence, its unknown-workload
    embedding and (``jobscale_predictions``: a job-scale training's ``lofo.csv``) the job-scale model."""
    from dprobe.data.registry import load_series_dataset
    from dprobe.data.workloads import workload_graphs

    ds = load_series_dataset(data_dir)
    if ds.groups is None:
        raise ValueError(f"{data_dir}: not a data set of whole jobs (h200-profiles layout)")
    split = getattr(forecaster, "split", None) or Split()
    graphs = workload_graphs(data_dir, held_out_runs(ds, split), cache_dir)
    result = evaluate_jobs(ds, {"dprobe": forecaster}, split, graphs)
    jobscale = read_jobscale_predictions(jobscale_predictions, variant) if jobscale_predictions else None
    first = first_second_rows(result, ds, jobscale)
    targets = target_lines(result, first)
    families = sorted({ds.groups[u] for u in held_out_runs(ds, split)})
    runs = held_out_runs(ds, split)
    text = (job_table(result, first) + f"\n{len(runs)} run{'s' * (len(runs) != 1)} of {len(families)} model "
            f"famil{'y' if len(families) == 1 else 'ies'} never trained on ({', '.join(families)}).\n"
            + ("\n" + "\n".join(targets) + "\n" if targets else ""))
    return text, {"rows": result.rows, "first_second": first, "targets": targets, "test_families": families}
