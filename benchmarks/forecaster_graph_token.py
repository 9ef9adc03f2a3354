"""Which workload token the forecaster should be given: the graph encoder's embedding and the hand-made vector,
the vector alone, or nothing (the unknown-workload embedding), and what the graph's structure adds.

One run trains the forecaster of ``+exp=gnn`` (``dprobe.training.train_forecaster``, as ``train.py`` does,
with the same config but for the epochs and windows per epoch given here) once per token:

- ``graph``: the pretrained GNN's pooled output over the model graph, then the vector (what ``+exp=gnn`` ships);
- ``vector``: the hand-made vector alone (``+exp=jobs``);
- ``graph_no_mp``: the same encoder with message passing off (its node features pooled as they are);
- ``graph_shuffled``: the encoder over the graph with its edges randomly rewired (as many edges, seeded);
- ``graph_no_token_dropout``: ``graph`` with ``model.token_dropout=0`` (only when named in ``--tokens``: the
  same as ``graph`` while ``+exp=gnn`` leaves it at 0);
- ``series_only``: no job series at all (the GenAI and Helios series alone, as many of their windows): the
  reference for the anonymous series, which must not get worse by more than 1 %; ``--former FILE`` (the
  forecaster shipped before the graph token, trained on those series alone) takes its place as the reference.

Every model is trained as ``+exp=gnn`` is: the epoch kept is chosen on ``val/select`` (the validation families'
runs beside the series' validation span, docs/training.md), with ``model.token_dropout``.

Job series are scored leave-family-out: h200-profiles' runs of the families the split leaves for testing (never
trained on, nor validated), from each run's first second on, at 1, 5 and 10 s. Each token model is also scored
told nothing of the workload (its ``unknown`` token). Per target and lead: the pinball loss (p50 / p90 / p99)
and the p50's absolute error, with 90 % bootstrap intervals over the test families (resampled with
replacement, every method on the same draws), and the ratio of each token to ``vector`` with its interval.
The anonymous series (the GenAI pods and Helios VCs, the last 30 % of each) get the ratio of each model to
the reference (``series_only``, or ``--former``), with intervals over the series. The verdict (:func:`verdict`,
the rule docs/training.md wrote down before its models were scored): ``graph`` ships if its ratio to
``vector``'s pinball on the job series has an interval that reaches 1 or below at every memory and utilisation
lead (it is not surely worse) and it leaves the anonymous series' pinball within 1 % of the reference's at
every task and lead; else, of ``vector`` and ``unknown`` (the graph model told nothing of any workload: its
anonymous forecasts are graph's), the one with the lower mean pinball ratio to ``vector`` on the job series
among those within the 1 % bound; else ``keep`` (the shipped model stays).

    .venv/bin/python benchmarks/forecaster_graph_token.py [--epochs 6] [--samples-per-epoch 20000]
        [--tokens graph,vector,...] [--cache DIR] [--out DIR] [--json FILE]
        [--checkpoints JSON] [--former dprobe/default_forecaster.onnx-of-before] [--verdict-jobs JSON]

About four minutes a token on two cores with the defaults (every run's model graph is traced once into
``--cache``, about 90 s the first time).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKENS = ("graph", "vector", "graph_no_mp", "graph_shuffled", "graph_no_token_dropout")
# variants that are a token with other settings: (the token, its overrides)
VARIANTS = {"graph_no_token_dropout": ("graph", ["model.token_dropout=0"])}
REFERENCE = "series_only"
FORMER = "former"  # --former: the anonymous series' reference in series_only's place
JOBS = "h200-profiles"
ANONYMOUS = ("alibaba-genai-2026", "helios-earth-vc")
QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Errors:
    """Per group (a job family, an anonymous series), per target and lead: summed pinball loss and absolute
    error of the p50, and how many forecasts."""

    pinball: dict[tuple[str, int], dict[str, float]]
    abs_err: dict[tuple[str, int], dict[str, float]]
    count: dict[tuple[str, int], dict[str, float]]


def config(token: str, out: Path, epochs: int, samples: int, cache: str, data_dir: Path) -> object:
    """The ``+exp=gnn`` config with ``token`` (or the series alone), these epochs and windows per epoch."""
    from dprobe.config import compose

    overrides = ["+exp=gnn", f"paths.output_dir={out}", f"data.workload_cache={cache}",
                 f"paths.data_dir={data_dir}", f"trainer.max_epochs={epochs}", "trainer.enable_progress_bar=false",
                 "evaluate.enabled=false", "coldstart.enabled=false", "jobscale.enabled=false",
                 "kernel_gnn.enabled=false"]
    if token == REFERENCE:  # the anonymous series alone, drawn as often as beside the job series
        job_share = 0.2
        overrides += [f"data.datasets=[{data_dir / ANONYMOUS[0]},{data_dir / ANONYMOUS[1]}]",
                      f"data.samples_per_epoch={int(samples * (1 - job_share))}"]
    else:
        token, extra = VARIANTS.get(token, (token, []))
        overrides += [f"model.workload_token={token}", f"data.samples_per_epoch={samples}", *extra]
    return compose(overrides)


def train(token: str, out: Path, epochs: int, samples: int, cache: str, data_dir: Path) -> Path:
    """Train one variant as ``train.py`` does (the forecaster stage alone); its ``dprobe.pt``."""
    from dprobe.training import train_forecaster

    out.mkdir(parents=True, exist_ok=True)
    result = train_forecaster(config(token, out, epochs, samples, cache, data_dir), out)
    return Path(result.outputs["checkpoint"])


def _accumulate(errors: Errors, method: str, key: tuple[str, int], group: str, actual: np.ndarray,
                quantiles: np.ndarray) -> None:
    from dprobe.core.metrics import pinball_terms

    ok = ~np.isnan(actual) & ~np.isnan(quantiles[:, 0])
    if not ok.any():
        return
    a, q = actual[ok], quantiles[ok]
    terms = pinball_terms(a[:, None] - q, np.asarray(QUANTILES)).mean(axis=1)
    for table, value in ((errors.pinball, terms.sum()), (errors.abs_err, np.abs(a - q[:, 0]).sum()),
                         (errors.count, float(ok.sum()))):
        table.setdefault((method, *key), {}).setdefault(group, 0.0)
        table[(method, *key)][group] += float(value)


def collect(result, ds, groups: dict[str, str], errors: Errors) -> None:
    """Every method's errors in an :class:`~dprobe.evaluation.scoring.EvalResult`, summed per group."""
    for method, by_target in result.forecasts.items():
        for target, per in by_target.items():
            series = result.actuals[target]
            for uid, f in per.items():
                y = series[uid]
                for j, h in enumerate(ds.lead_steps):
                    keep = f.origins + h < len(y)
                    _accumulate(errors, method, (target, j), groups.get(uid, uid), y[f.origins[keep] + h],
                                f.quantiles[keep, j])


def bootstrap(errors: Errors, methods: list[str], reference: str, draws: int = 1000, seed: int = 0) -> list[dict]:
    """Per target and lead: each method's mean pinball and p50 error (90 % intervals over groups resampled with
    replacement, the same draws for every method) and its ratios to ``reference`` with their intervals."""
    rng = np.random.default_rng(seed)
    rows = []
    keys = sorted({k[1:] for k in errors.count if k[0] == reference})
    for key in keys:
        groups = sorted(errors.count[(reference, *key)])
        idx = rng.integers(0, len(groups), size=(draws, len(groups)))

        def stat(table: dict, method: str, idx=idx, groups=groups, key=key) -> tuple[float, np.ndarray]:
            sums = np.array([table.get((method, *key), {}).get(g, np.nan) for g in groups])
            counts = np.array([errors.count.get((method, *key), {}).get(g, np.nan) for g in groups])
            return float(np.nansum(sums) / np.nansum(counts)), np.nansum(sums[idx], 1) / np.nansum(counts[idx], 1)

        ref_pin, ref_pin_b = stat(errors.pinball, reference)
        ref_mae, ref_mae_b = stat(errors.abs_err, reference)
        for method in methods:
            if (method, *key) not in errors.count:
                continue
            pin, pin_b = stat(errors.pinball, method)
            mae, mae_b = stat(errors.abs_err, method)
            rows.append({"method": method, "target": key[0], "lead": key[1], "groups": len(groups),
                         "forecasts": int(sum(errors.count[(method, *key)].values())),
                         "pinball": pin, "pinball_ci": _ci(pin_b), "p50_error": mae, "p50_error_ci": _ci(mae_b),
                         "pinball_ratio": pin / ref_pin, "pinball_ratio_ci": _ci(pin_b / ref_pin_b),
                         "p50_ratio": mae / ref_mae, "p50_ratio_ci": _ci(mae_b / ref_mae_b)})
    return rows


def _ci(values: np.ndarray) -> tuple[float, float]:
    return float(np.nanpercentile(values, 5)), float(np.nanpercentile(values, 95))


def score_jobs(checkpoints: dict[str, Path], data_dir: Path, cache: str) -> tuple[Errors, object]:
    """Each token model on the test families' runs, given their graphs and told nothing (``<token>|unknown``)."""
    from dprobe.data.registry import load_series_dataset
    from dprobe.data.workloads import workload_graphs
    from dprobe.evaluation.jobs import UNKNOWN_SUFFIX, evaluate_jobs, held_out_runs
    from dprobe.forecaster.loading import load_forecaster

    ds = load_series_dataset(data_dir / JOBS)
    models = {name: load_forecaster(str(path)) for name, path in checkpoints.items()
              if name not in (REFERENCE, FORMER)}
    split = next(iter(models.values())).split
    graphs = workload_graphs(data_dir / JOBS, held_out_runs(ds, split), cache)
    errors = Errors({}, {}, {})
    result = evaluate_jobs(ds, models, split, graphs)
    result.forecasts = {name.replace(UNKNOWN_SUFFIX, "|unknown"): v for name, v in result.forecasts.items()}
    collect(result, ds, {u: ds.groups[u] for u in ds.series_ids}, errors)
    return errors, ds


def score_anonymous(checkpoints: dict[str, Path], data_dir: Path) -> tuple[Errors, dict]:
    """Every model on the GenAI pods' and Helios VCs' test spans (no graphs: their workloads are not known)."""
    from dprobe.data.registry import load_series_dataset
    from dprobe.evaluation.harness import EvalConfig, evaluate_dataset
    from dprobe.forecaster.loading import load_forecaster

    models = {name: load_forecaster(str(path)) for name, path in checkpoints.items()}
    split = next(m for name, m in models.items() if name != FORMER).split
    errors = Errors({}, {}, {})
    lead_steps = {}
    for name in ANONYMOUS:
        ds = load_series_dataset(data_dir / name)
        result = evaluate_dataset(ds, models, EvalConfig(split=split, baselines=(), progress=False))
        result.actuals = {f"{name}/{t}": v for t, v in result.actuals.items()}
        result.forecasts = {m: {f"{name}/{t}": v for t, v in by.items()} for m, by in result.forecasts.items()}
        collect(result, ds, {}, errors)
        lead_steps[name] = ds.lead_steps
    return errors, lead_steps


def verdict(job_rows: list[dict], anonymous_rows: list[dict] | None = None, bound: float = 1.01
            ) -> tuple[str, list[str]]:
    """What ships by the rule docs/training.md wrote down first, and why not the others: ``graph`` where its
    job-series pinball ratio to ``vector`` has an interval reaching 1 or below at every lead and its anonymous
    series' pinball is at most ``bound`` times the reference's everywhere; else, of ``vector`` and ``unknown``
    (``graph|unknown`` on the job series, graph's forecasts on the anonymous ones), the one within ``bound``
    with the lower mean ratio to ``vector`` on the job series (vector: 1); else ``keep``."""
    reasons = [f"graph surely worse than vector at {r['target']} lead {r['lead']}: {r['pinball_ratio']:.3f} "
               f"[{r['pinball_ratio_ci'][0]:.3f}, {r['pinball_ratio_ci'][1]:.3f}]" for r in job_rows
               if r["method"] == "graph" and r["pinball_ratio_ci"][0] > 1.0]
    worse = {m: [f"{m} makes {r['target']} lead {r['lead']} {100 * (r['pinball_ratio'] - 1):.1f} % worse"
                 for r in anonymous_rows or [] if r["method"] == m and r["pinball_ratio"] > bound]
             for m in ("graph", "vector")}
    if not reasons and not worse["graph"]:
        return "graph", []
    unknown = [r["pinball_ratio"] for r in job_rows if r["method"] == "graph|unknown"]
    scores = {"vector": 1.0, **({"unknown": float(np.mean(unknown))} if unknown else {})}
    allowed = {m: v for m, v in scores.items() if not worse["vector" if m == "vector" else "graph"]}
    why = reasons + worse["graph"] + worse["vector"]
    if not allowed:
        return "keep", why
    best = min(allowed, key=lambda m: (allowed[m], m != "vector"))
    return best, why + [f"{m}: mean pinball ratio to vector {v:.3f}" for m, v in scores.items()]


def table(rows: list[dict], leads: dict[str, tuple], unit: dict[str, tuple[float, str]], reference: str) -> str:
    """A markdown table of :func:`bootstrap`'s rows."""
    out = [f"| target | lead | method | pinball [90 % CI] | p50 error [90 % CI] | pinball / {reference} | "
           f"p50 error / {reference} | forecasts |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        scale, name = unit.get(r["target"].split("/")[-1], (1.0, ""))
        lead = leads[r["target"]][r["lead"]]
        out.append(f"| {r['target']} | {lead} | {r['method']} | {r['pinball'] / scale:.4g} [{r['pinball_ci'][0] / scale:.4g}, "
                   f"{r['pinball_ci'][1] / scale:.4g}] {name} | {r['p50_error'] / scale:.4g} "
                   f"[{r['p50_error_ci'][0] / scale:.4g}, {r['p50_error_ci'][1] / scale:.4g}] | "
                   f"{r['pinball_ratio']:.3f} [{r['pinball_ratio_ci'][0]:.3f}, {r['pinball_ratio_ci'][1]:.3f}] | "
                   f"{r['p50_ratio']:.3f} [{r['p50_ratio_ci'][0]:.3f}, {r['p50_ratio_ci'][1]:.3f}] | "
                   f"{r['forecasts']:,} |")
    return "\n".join(out)


UNITS = {"gpu_memory_bytes": (2**30, "GiB"), "gpu_duty_cycle_pct": (1.0, "pts"), "gpu_demand": (1.0, "GPUs")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6, help="epochs per model (train.py: 25)")
    parser.add_argument("--samples-per-epoch", type=int, default=20000,
                        help="training windows per epoch with the job series (train.py +exp=gnn: 60,000)")
    parser.add_argument("--tokens", default=",".join([*(t for t in TOKENS if t not in VARIANTS), REFERENCE]),
                        help=f"models to train: {', '.join([*TOKENS, REFERENCE])}")
    parser.add_argument("--data", default=str(ROOT / "datasets"), help="the bundled data sets' directory")
    parser.add_argument("--cache", default=str(ROOT / ".cache" / "workload-graphs"),
                        help="model graphs of the runs, kept between runs")
    parser.add_argument("--out", help="where the models go (default: a temporary directory)")
    parser.add_argument("--checkpoints", help="JSON {token: dprobe.pt} of models trained before: scored, not trained")
    parser.add_argument("--former", help="the anonymous series' reference instead of series_only: a forecaster "
                                         "trained on them alone (dprobe.pt or .onnx), e.g. the one shipped before")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--verdict-jobs", help="the --json of an earlier run whose job-series rows the verdict "
                                               "reads (the tokens compared at the benchmark's budget), while the "
                                               "anonymous bound is checked on the models scored here (those "
                                               "train.py makes)")
    args = parser.parse_args(argv)
    tokens = [t.strip() for t in args.tokens.split(",") if t.strip()]
    unknown = sorted(set(tokens) - {*TOKENS, REFERENCE})
    if args.former:
        tokens = [t for t in tokens if t != REFERENCE]
    if unknown or "vector" not in tokens:
        parser.error(f"--tokens: {', '.join(unknown)} not among {', '.join([*TOKENS, REFERENCE])}" if unknown
                     else "--tokens must include vector (the reference of the job series)")
    data_dir = Path(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        checkpoints = {k: Path(v) for k, v in json.loads(Path(args.checkpoints).read_text()).items()} \
            if args.checkpoints else {}
        seconds = {}
        for token in tokens:
            if token in checkpoints:
                continue
            start = time.perf_counter()
            checkpoints[token] = train(token, out / token, args.epochs, args.samples_per_epoch, args.cache, data_dir)
            seconds[token] = time.perf_counter() - start
            print(f"{token}: trained in {seconds[token]:.0f} s -> {checkpoints[token]}", flush=True)
        reference = FORMER if args.former else REFERENCE
        if args.former:
            checkpoints[FORMER] = Path(args.former)
        job_errors, jobs = score_jobs(checkpoints, data_dir, args.cache)
        methods = [m for t in tokens if t != REFERENCE for m in (t, f"{t}|unknown")]
        job_rows = bootstrap(job_errors, methods, "vector")
        anon_errors, anon_leads = (score_anonymous(checkpoints, data_dir) if reference in checkpoints
                                   else (None, {}))
        anon_rows = bootstrap(anon_errors, tokens, reference) if anon_errors is not None else []
    leads = {t: [f"{h * jobs.freq.total_seconds():g} s" for h in jobs.lead_steps] for t in jobs.targets}
    for name, steps in anon_leads.items():
        for target in ("gpu_duty_cycle_pct", "gpu_memory_bytes", "gpu_demand"):
            leads[f"{name}/{target}"] = [f"{h} steps" for h in steps]
    print(f"\nJob series, leave-family-out ({jobs.name}: the split's test families), against the vector token:\n")
    print(table(job_rows, leads, UNITS, "vector"))
    if anon_rows:
        print(f"\nAnonymous series (test spans), against {reference} (trained without the job series):\n")
        print(table(anon_rows, leads, UNITS, reference))
        worse = [f"{r['method']} {r['target']} lead {r['lead']}: {r['pinball_ratio']:.3f}" for r in anon_rows
                 if r["method"] != reference and r["pinball_ratio"] > 1.01]
        print("\nanonymous series more than 1 % worse in pinball: " + ("; ".join(worse) if worse else "none"))
    verdict_rows = json.loads(Path(args.verdict_jobs).read_text())["jobs"] if args.verdict_jobs else job_rows
    ships, reasons = verdict(verdict_rows, anon_rows)
    print(f"\nships: {ships}" + (f" ({'; '.join(reasons)})" if reasons else
                                   " (graph's pinball interval against vector reaches 1 or below at every lead, "
                                   "the anonymous series within 1 %)"))
    if args.json:
        Path(args.json).write_text(json.dumps({"jobs": job_rows, "anonymous": anon_rows, "ships": ships,
                                               "train_seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
