"""Job scale: from a run's model graph and its first second of NVML samples, where its memory and
utilisation are heading over the next ten seconds (the allocator's ramp to its plateau).

Targets per run of h200-profiles: the memory plateau (90th percentile of NVML used memory over
the horizon) and the mean GPU utilisation over the horizon. Predictions are p50 / p90 / p99 of
residuals to an anchor (:func:`anchors`: what the first second shows, or for the graph variant's
utilisation the cold-start prediction; log-ratio for memory, logit difference for utilisation).
Three ways to predict are compared, leave-model-family-out:

- ``persist``: the plateau is the largest memory seen so far, utilisation stays at its mean;
- ``no_graph``: a learned model of the first second and the job's static features
  (batch, precision, optimizer);
- ``graph``: memory from the model graph: the plateau is the larger of what the first second
  showed and the cold-start profiler's device-memory estimate (the training step replayed on
  the graph, plus the CUDA context; :mod:`dprobe.profiling.coldstart`), with quantiles from the same
  rule's errors on the training runs; utilisation as a learned correction to the cold-start
  profiler's prediction of the job's utilisation while it trains (most runs are past their first,
  slow step after a second, so that is where they are heading), given the graph-derived
  features too (the roofline's GPU and host time of a step, the cold-start prediction;
  optionally a GNN embedding of the graph). The cold-start predictions the model learns from are
  leave-family-out ones, as it will meet them for a new architecture.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch

from dprobe.core.conformal import conformal_shift, family_folds, held_out_groups
from dprobe.graph.encoder import GraphEncoder
from dprobe.profiling.coldstart.features import BF16
from dprobe.profiling.coldstart.model import fit_standardisation, standardise
from dprobe.profiling.coldstart.replay import TWO_STATE_OPTIMIZERS

log = logging.getLogger(__name__)

FIRST_SECONDS = 1.0
HORIZON_SECONDS = 10.0
LEVELS = (0.5, 0.9, 0.99)
OBS_FEATURES = ["log_mem_last", "log_mem_max", "util_mean", "util_last", "util_busy_share", "log_mem_total",
                "log_batch", "bf16", "fp16", "adamw", "util_max", "util_recent", "util_trend", "busy_onset",
                "host_stall_ms"]
# the cold-start profiler's graph-derived features used for utilisation: the per-kernel roofline's GPU
# busy time and host issue time of one step (more overfit on the few runs there are); the graph
# variant's inputs add the logit of the cold-start utilisation prediction (COLDSTART_FEATURE)
GRAPH_FEATURES = ["log_t_gpu", "log_t_host"]
COLDSTART_FEATURE = "logit_coldstart_util"
VARIANTS = ("persist", "no_graph", "graph")
KIND = "dprobe-jobscale"
DEFAULT_CHECKPOINT = Path(__file__).with_name("default_jobscale.pt")  # shipped: `python train.py +exp=gnn`


def _logit(u: np.ndarray) -> np.ndarray:
    u = np.clip(u, 0.01, 0.99)
    return np.log(u / (1 - u))


def first_second_features(first: Any, batch: int, precision: str, optimizer: str, host_stall_s: float = 0.0
                          ) -> list[float]:
    """The ``OBS_FEATURES`` of a job's NVML samples from its first second (``mem_used_bytes``,
    ``mem_total_bytes``, ``gpu_util_pct``; at least one row).

    ``host_stall_s``: seconds per step the job waits on the host (data loading, evaluation), as known.
    """
    mem = first["mem_used_bytes"].to_numpy(dtype=float)
    util = first["gpu_util_pct"].to_numpy(dtype=float) / 100
    return [np.log(mem[-1]), np.log(mem.max()), util.mean(), util[-1], float((util > 0).mean()),
            np.log(float(first["mem_total_bytes"].iloc[0])), np.log(batch), float(precision in BF16),
            float(precision == "fp16"), float(optimizer in TWO_STATE_OPTIMIZERS),
            # how far the job has got: its busiest sample, the last three, their rise over the earlier
            # ones, and when (share of the second) utilisation first passed 50 %
            util.max(), util[-3:].mean(), util[-3:].mean() - util[:-3].mean(),
            float(np.argmax(util > 0.5)) / len(util) if (util > 0.5).any() else 1.0, 1000.0 * host_stall_s]


def observe_run(samples: Any, batch: int, precision: str, optimizer: str, host_stall_s: float = 0.0
                ) -> tuple[list[float], list[float]] | None:
    """First-second features (:func:`first_second_features`) and horizon targets of one run's NVML
    samples (``t_rel``: seconds since the first), or None if too short."""
    t = samples["t_rel"].to_numpy()
    first = samples[t <= FIRST_SECONDS]
    later = samples[(t > FIRST_SECONDS) & (t <= FIRST_SECONDS + HORIZON_SECONDS)]
    if len(first) < 3 or len(later) < 3:
        return None
    obs = first_second_features(first, batch, precision, optimizer, host_stall_s)
    target = [float(np.quantile(later["mem_used_bytes"], 0.9)), float(later["gpu_util_pct"].mean() / 100)]
    return obs, target


def load_job_dataset(data_dir: str, cache_dir: str | Path, with_graphs: bool = True,
                     coldstart_util: dict[str, float] | None = None, seed: int = 0, folds: int | None = None,
                     progress: bool = True) -> dict[str, Any]:
    """First-second observations and horizon targets of every run; with ``with_graphs`` also each run's
    model graph, the cold-start profiler's graph-derived features and its leave-family-out prediction
    of the run's utilisation (``coldstart_util``, by run id, where the caller has them, e.g. from
    :func:`dprobe.profiling.coldstart.train_coldstart`; else cross-validated here, in ``folds`` groups of
    families)."""
    from dprobe.data import load_h200_profiles
    from dprobe.profiling.coldstart.features import family_of

    profiles = load_h200_profiles(data_dir)
    runs = profiles.train_runs()
    graph_ds = None
    if with_graphs:
        from dprobe.profiling.coldstart.train import load_dataset

        graph_ds = load_dataset(data_dir, cache_dir, progress=progress)
        index = {rid: i for i, rid in enumerate(graph_ds["run_ids"])}
    keep, obs, ys, fams, ids = [], [], [], [], []
    for _, row in runs.iterrows():
        rid = str(row["run_id"])
        got = observe_run(profiles.run_samples(rid), int(row["batch"]), str(row["precision"]),
                          str(row["optimizer"]), host_stall_s=float(row["host_stall_s"]))
        if got is None or (graph_ds is not None and rid not in index):
            continue
        obs.append(got[0])
        ys.append(got[1])
        fams.append(family_of(str(row["model"])))
        ids.append(rid)
        if graph_ds is not None:
            keep.append(index[rid])
    if not ids:
        raise ValueError(f"{data_dir}: no run has {FIRST_SECONDS:g} s of samples and more after it")
    out = {"obs": np.array(obs), "y": np.array(ys), "families": fams, "run_ids": ids,
           "graphs": None, "graph_feats": None, "device_estimate": None, "coldstart_util": None}
    if graph_ds is not None:
        from dprobe.profiling.coldstart.features import FEATURES

        if coldstart_util is None:
            coldstart_util = coldstart_utilisation(data_dir, cache_dir, graph_ds, seed, folds, progress)
        missing = [rid for rid in ids if rid not in coldstart_util]
        if missing:
            raise ValueError(f"{data_dir}: no cold-start utilisation prediction for runs {missing[:5]}")
        cols = [FEATURES.index(f) for f in GRAPH_FEATURES]
        out["graphs"] = [graph_ds["graphs"][i] for i in keep]
        out["coldstart_util"] = np.array([coldstart_util[rid] for rid in ids], dtype=np.float64)
        out["graph_feats"] = np.concatenate([graph_ds["feats"][keep][:, cols],
                                             _logit(out["coldstart_util"])[:, None]], axis=1)
        out["device_estimate"] = graph_ds["base"][keep, 1]  # replayed reserved memory + CUDA context
    return out


def coldstart_utilisation(data_dir: str, cache_dir: str | Path, graph_ds: dict[str, Any], seed: int = 0,
                          folds: int | None = None, progress: bool = True) -> dict[str, float]:
    """The cold-start profiler's leave-family-out utilisation prediction of every run, by run id."""
    from dprobe.profiling.coldstart.train import cross_validate, utilisation_by_run

    log.info("cold-start utilisation of %d runs, leave-family-out", len(graph_ds["run_ids"]))
    return utilisation_by_run(cross_validate(data_dir, cache_dir, seed=seed, ds=graph_ds, progress=progress,
                                             calibrate=False, folds=folds))


def persist(obs: np.ndarray) -> np.ndarray:
    """The plateau is the largest memory seen so far; utilisation stays at its first-second mean."""
    return np.stack([np.exp(obs[:, OBS_FEATURES.index("log_mem_max")]), obs[:, OBS_FEATURES.index("util_mean")]],
                    axis=1)


def graph_anchor(ds: dict[str, Any], idx: np.ndarray) -> np.ndarray:
    """Memory plateau from the graph: the larger of the memory seen so far and the replayed estimate."""
    return np.maximum(persist(ds["obs"][idx])[:, 0], ds["device_estimate"][idx])


def fit_memory_quantiles(ds: dict[str, Any], idx: np.ndarray) -> np.ndarray:
    """Empirical quantiles (``LEVELS``) of log(plateau / graph anchor) over the runs ``idx``."""
    r = np.log(ds["y"][idx, 0] / graph_anchor(ds, idx))
    return np.quantile(r, LEVELS)


def anchors(ds: dict[str, Any], idx: np.ndarray, variant: str) -> np.ndarray:
    """``(N, 2)``: what the network's residuals are taken from: :func:`persist`, but with the graph
    the cold-start profiler's utilisation prediction for utilisation (where the dataset has one)."""
    out = persist(ds["obs"][idx])
    if variant == "graph" and ds.get("coldstart_util") is not None:
        out[:, 1] = ds["coldstart_util"][idx]
    return out


def to_residual(y: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """``y`` ``(N, 2)`` against ``anchor`` ``(N, 2)`` (:func:`anchors`): log ratio of memory, logit
    difference of utilisation."""
    return np.stack([np.log(y[:, 0] / anchor[:, 0]), _logit(y[:, 1]) - _logit(anchor[:, 1])], axis=1)


def from_residual(r: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """``r`` ``(N, 2, Q)`` -> bytes and utilisation ratio ``(N, 2, Q)``."""
    mem = anchor[:, 0, None] * np.exp(r[:, 0])
    util = 1 / (1 + np.exp(-(_logit(anchor[:, 1])[:, None] + r[:, 1])))
    return np.stack([mem, util], axis=1)


class JobScaleNet(nn.Module):
    """Features ``[N, F]`` (+ graphs) -> ordered residual quantiles ``[N, 2, Q]``."""

    def __init__(self, n_features: int, hidden: int = 32, graph_dim: int = 0) -> None:
        super().__init__()
        self.encoder = GraphEncoder(hidden=hidden, out_dim=graph_dim, layers=2) if graph_dim else None
        self.register_buffer("mu", torch.zeros(n_features))
        self.register_buffer("sd", torch.ones(n_features))
        self.mlp = nn.Sequential(nn.Linear(n_features + graph_dim, hidden), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, 2 * len(LEVELS)))
        self.linear = nn.Linear(n_features, 2)  # a linear path keeps extrapolation tame

    def forward(self, feats: torch.Tensor, graphs: Batch | None = None) -> torch.Tensor:
        f = standardise(feats, self.mu, self.sd)
        z = self.encoder(graphs) if self.encoder is not None and graphs is not None else f[:, :0]
        out = self.mlp(torch.cat([f, z], dim=1)).view(-1, 2, len(LEVELS))
        p50 = out[..., :1] + self.linear(f).unsqueeze(-1)
        return torch.cat([p50, p50 + torch.cumsum(nn.functional.softplus(out[..., 1:]), dim=-1)], dim=-1)


def _inputs(ds: dict[str, Any], idx: np.ndarray, variant: str) -> np.ndarray:
    parts = [ds["obs"][idx]]
    if variant == "graph":
        parts.append(ds["graph_feats"][idx])
    return np.concatenate(parts, axis=1)


def fit(ds: dict[str, Any], idx: np.ndarray, variant: str, epochs: int = 300, seed: int = 0,
        graph_dim: int = 0) -> JobScaleNet:
    torch.manual_seed(seed)
    x = torch.tensor(_inputs(ds, idx, variant), dtype=torch.float32)
    r = torch.tensor(to_residual(ds["y"][idx], anchors(ds, idx, variant)), dtype=torch.float32)
    use_gnn = variant == "graph" and graph_dim > 0
    graphs = Batch.from_data_list([ds["graphs"][i] for i in idx]) if use_gnn else None
    net = JobScaleNet(x.shape[1], graph_dim=graph_dim if use_gnn else 0)
    mu, sd = fit_standardisation(x)
    net.mu.copy_(mu)
    net.sd.copy_(sd)
    levels = torch.tensor(LEVELS)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-3)
    net.train()
    for _ in range(epochs):
        opt.zero_grad()
        diff = r.unsqueeze(-1) - net(x, graphs)
        loss = torch.maximum(levels * diff, (levels - 1) * diff).mean()
        loss.backward()
        opt.step()
    return net.eval()


@torch.no_grad()
def residual_quantiles(net: JobScaleNet, ds: dict[str, Any], idx: np.ndarray, variant: str) -> np.ndarray:
    """The network's residual quantiles ``(N, 2, Q)`` (see :func:`to_residual`)."""
    x = torch.tensor(_inputs(ds, idx, variant), dtype=torch.float32)
    graphs = Batch.from_data_list([ds["graphs"][i] for i in idx]) if net.encoder is not None else None
    return net(x, graphs).numpy().astype(np.float64)


def predict(net: JobScaleNet, ds: dict[str, Any], idx: np.ndarray, variant: str,
            shifts: np.ndarray | None = None) -> np.ndarray:
    """Quantiles ``(N, 2, Q)``: memory plateau (bytes), mean utilisation (0-1).

    ``shifts`` ``(2, Q)`` are added to the residual quantiles (see :func:`calibrate_upper`).
    """
    r = residual_quantiles(net, ds, idx, variant)
    if shifts is not None:
        r = np.maximum.accumulate(r + np.asarray(shifts)[None], axis=-1)
    return from_residual(r, anchors(ds, idx, variant))


def calibrate_upper(ds: dict[str, Any], idx: np.ndarray, variant: str, epochs: int = 300, seed: int = 0,
                    graph_dim: int = 0, folds: int = 3) -> np.ndarray:
    """Shifts ``(2, Q)`` of the upper residual quantiles that make them cover families held out *within*
    ``idx`` at their levels (split-conformal over families, as the cold-start profiler's p90); p50 stays.

    The runs' families are dealt into ``folds`` groups; a network fitted without each group is scored on it.
    """
    shifts = np.zeros((2, len(LEVELS)))
    fold = family_folds([ds["families"][i] for i in idx], folds, seed)
    if fold is None:
        return shifts
    scores = []
    for g in range(folds):
        held = fold == g
        net = fit(ds, idx[~held], variant, epochs, seed, graph_dim=graph_dim)
        r = to_residual(ds["y"][idx[held]], anchors(ds, idx[held], variant))
        scores.append(r[:, :, None] - residual_quantiles(net, ds, idx[held], variant))
    s = np.concatenate(scores)  # (N, 2, Q)
    for t in range(2):
        for k, level in enumerate(LEVELS[1:], start=1):
            shifts[t, k] = conformal_shift(s[:, t, k], level)
    return shifts


def scores(y: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """Plateau MAPE (%), worst APE, utilisation MAE (points), p90 / p99 coverage of both targets."""
    ape = np.abs(q[:, 0, 0] - y[:, 0]) / y[:, 0] * 100
    out = {"plateau_mape": float(ape.mean()), "plateau_worst_ape": float(ape.max()),
           "util_mae_points": float(np.abs(q[:, 1, 0] - y[:, 1]).mean() * 100)}
    if q.shape[2] == len(LEVELS):
        out["p90_coverage"] = float((y <= q[:, :, 1]).mean())
        out["p99_coverage"] = float((y <= q[:, :, 2]).mean())
    return out


def _fold_predictions(test: np.ndarray, ds: dict[str, Any], variants: list[str], epochs: int, seed: int,
                      graph_dim: int) -> dict[str, np.ndarray]:
    """Every variant's predictions ``(len(test), 2, len(LEVELS))`` of the runs ``test``, fitted on the
    runs of the other families."""
    fams = np.array(ds["families"])
    train = np.flatnonzero(~np.isin(fams, fams[test]))
    out = {}
    for variant in variants:
        net = fit(ds, train, variant, epochs, seed, graph_dim=graph_dim)
        shifts = calibrate_upper(ds, train, variant, epochs, seed, graph_dim=graph_dim)
        out[variant] = predict(net, ds, test, variant, shifts)
        if variant == "graph":  # memory: the graph rule, its quantiles from the training runs' errors
            offsets = fit_memory_quantiles(ds, train)
            out[variant][:, 0] = graph_anchor(ds, test)[:, None] * np.exp(offsets)[None, :]
    return out


def cross_validate_predictions(ds: dict[str, Any], epochs: int = 300, seed: int = 0, graph_dim: int = 0,
                               progress: bool = True, folds: int | None = None,
                               workers: int | None = 1) -> dict[str, np.ndarray]:
    """Leave-model-family-out predictions ``(runs, 2, len(LEVELS))`` of every variant: a family is
    never in its own training set (``progress``: a bar over the folds; ``folds``: families dealt into
    that many held-out groups instead of one fold per family; ``workers``: folds fitted in that many
    processes at once, None: one per core, at most four)."""
    from dprobe.core.workers import map_folds, resolve_workers

    n = len(ds["families"])
    variants = [v for v in VARIANTS if v != "graph" or ds["graph_feats"] is not None]
    preds = {v: np.zeros((n, 2, len(LEVELS))) for v in variants}
    preds["persist"] = np.repeat(persist(ds["obs"])[:, :, None], len(LEVELS), axis=2)
    groups = held_out_groups(np.array(ds["families"]), folds, seed)
    fold = partial(_fold_predictions, ds=ds, variants=variants[1:], epochs=epochs, seed=seed, graph_dim=graph_dim)
    for test, got in zip(groups, map_folds(fold, [(t,) for t in groups], resolve_workers(workers),
                                           "job scale, leave-family-out", progress), strict=True):
        for variant, q in got.items():
            preds[variant][test] = q
    return preds


def score_variants(ds: dict[str, Any], preds: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """:func:`scores` of each variant's predictions (``persist`` has no quantiles to cover with)."""
    result = {v: scores(ds["y"], q) for v, q in preds.items()}
    result["persist"].pop("p90_coverage", None)
    result["persist"].pop("p99_coverage", None)
    return result


def cross_validate(ds: dict[str, Any], epochs: int = 300, seed: int = 0, graph_dim: int = 0,
                   folds: int | None = None, workers: int | None = 1) -> dict[str, dict[str, float]]:
    """Leave-model-family-out scores of every variant (:func:`cross_validate_predictions`)."""
    return score_variants(ds, cross_validate_predictions(ds, epochs, seed, graph_dim, folds=folds, workers=workers))


def plot_cross_validation(ds: dict[str, Any], preds: dict[str, np.ndarray], variant: str,
                          path: str | Path) -> Path:
    """Plateau and utilisation of each run against ``variant``'s p50 (a bar up to its p90) and *persist*."""
    from dprobe.core.plots import predicted_vs_measured, save_figure, subplots

    fig, axes = subplots(2, f"Job scale, leave-model-family-out: {len(ds['run_ids'])} runs, "
                            f"{len(set(ds['families']))} families (what the next {HORIZON_SECONDS:g} s bring, "
                            f"after {FIRST_SECONDS:g} s of samples)")
    q, ref = preds[variant], preds["persist"]
    predicted_vs_measured(axes[0], "memory plateau", ds["y"][:, 0] / 2**30, q[:, 0, 0] / 2**30,
                          q[:, 0, 1] / 2**30, ref[:, 0, 0] / 2**30, variant, "persist", "GiB", log=True)
    predicted_vs_measured(axes[1], "mean GPU utilisation", 100 * ds["y"][:, 1], 100 * q[:, 1, 0],
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


def train_jobscale(data_dir: str, out_dir: str, use_graph: bool = True, epochs: int = 300, seed: int = 0,
                   graph_dim: int = 0, cache_dir: str | Path | None = None,
                   folds: int | None = None, coldstart_util: dict[str, float] | None = None,
                   workers: int | None = 1, progress: bool = True) -> dict[str, Any]:
    """Cross-validate every variant, fit the chosen one on all runs, save ``jobscale.pt`` and a report.
    ``folds``: leave out that many groups of families in turn, not one family at a time; ``workers``:
    processes fitting the folds side by side (None: one per core, at most four); ``progress``: bars over
    the replays and the folds.

    ``graph_dim > 0`` adds a GNN embedding of the model graph to the graph-derived features
    (slow on a CPU: about a second an epoch over all graphs). ``coldstart_util``: the cold-start
    profiler's leave-family-out utilisation predictions by run id (:func:`load_job_dataset`).
    At inference the graph variant's utilisation anchor and input is the cold-start profiler's
    prediction for the job (``dprobe predict``), as the checkpoint records (``util_anchor``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_job_dataset(data_dir, cache_dir or out / "cache", with_graphs=use_graph,
                          coldstart_util=coldstart_util, seed=seed, folds=folds, progress=progress)
    preds = cross_validate_predictions(ds, epochs, seed, graph_dim=graph_dim, progress=progress, folds=folds,
                                       workers=workers)
    result = score_variants(ds, preds)
    table = format_table(result, len(ds["run_ids"]), len(set(ds["families"])), folds)
    variant = "graph" if use_graph else "no_graph"
    plot = plot_cross_validation(ds, preds, variant, out / "lofo.png")
    (out / "report.md").write_text(table + f"\n![{variant} against persist, run by run]({plot.name})\n")
    every = np.arange(len(ds["run_ids"]))
    net = fit(ds, every, variant, epochs, seed, graph_dim=graph_dim)
    shifts = calibrate_upper(ds, every, variant, epochs, seed, graph_dim=graph_dim)
    ckpt = {"kind": KIND, "format": 1, "variant": variant, "obs_features": OBS_FEATURES,
            "graph_features": [*GRAPH_FEATURES, COLDSTART_FEATURE] if variant == "graph" else [],
            # utilisation residuals are taken from this: the first second's mean, or the cold-start prediction
            "util_anchor": "coldstart_util" if variant == "graph" else "util_mean",
            "n_features": int(_inputs(ds, np.arange(1), variant).shape[1]),
            "graph_dim": int(net.encoder.out.out_features) if net.encoder is not None else 0,
            "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}, "cv": result,
            "quantile_shifts": shifts.tolist(),  # for predict(..., shifts)
            "memory_log_offsets": (fit_memory_quantiles(ds, every).tolist()
                                   if variant == "graph" else None)}
    torch.save(ckpt, out / "jobscale.pt")
    return {"checkpoint": str(out / "jobscale.pt"), "report": str(out / "report.md"), "table": table,
            "metrics": result, "plot": str(plot)}


def first_second(samples: Any) -> Any:
    """The rows of ``samples`` (``t_rel``: seconds since the job's first sample) in its first second;
    a ValueError if they do not cover it with at least 3 samples."""
    t = samples["t_rel"].to_numpy(dtype=float)
    first = samples[t <= FIRST_SECONDS]
    if len(first) < 3 or t.max() < 0.9 * FIRST_SECONDS:
        span = min(float(t.max()), FIRST_SECONDS) if len(t) else 0.0
        raise ValueError(f"job scale needs the job's first {FIRST_SECONDS:g} s of samples, at least 3 of them "
                         f"(it learnt from one every 0.1 s); got {len(first)} over {span:.2f} s")
    return first


def load_jobscale(path: str | Path) -> tuple[JobScaleNet, dict[str, Any]]:
    """A ``jobscale.pt`` from :func:`train_jobscale` (loaded with ``weights_only=True``) and its network."""
    from dprobe.forecaster.loading import load_torch_dict

    ckpt = load_torch_dict(path)
    if ckpt.get("kind") != KIND:
        raise ValueError(f"{path}: not a dprobe job-scale checkpoint (train one with `python train.py +exp=gnn`)")
    if ckpt.get("format") != 1 or ckpt.get("obs_features") != OBS_FEATURES:
        raise ValueError(f"{path}: job-scale checkpoint format {ckpt.get('format')} or its features differ "
                         "from this dprobe's; retrain it with `python train.py +exp=gnn`")
    net = JobScaleNet(ckpt["n_features"], graph_dim=ckpt["graph_dim"])
    net.load_state_dict(ckpt["state_dict"])
    return net.eval(), ckpt


def predict_next(checkpoint: str | Path, samples: Any, batch: int, precision: str, optimizer: str,
                 coldstart: dict[str, float] | None = None, host_stall_s: float = 0.0,
                 graph: Any = None, loaded: tuple[JobScaleNet, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Where a job that has just started is heading over the next ``HORIZON_SECONDS``: its memory
    plateau (bytes) and mean GPU utilisation (0-1), p50 / p90 / p99, from its first second of samples.

    ``samples``: a frame with ``t_rel`` (seconds since the job's first sample), ``mem_used_bytes``,
    ``mem_total_bytes`` and ``gpu_util_pct`` (:func:`dprobe.data.gpu_samples.read_gpu_samples`); rows
    after the first second are not used. ``coldstart``: what the graph variant needs from the cold-start
    profiler (:func:`dprobe.profiling.coldstart.predict.predict_job`): ``gpu_seconds`` and ``host_seconds`` (the
    roofline's GPU busy and host issue time of a step), ``gpu_utilization`` (its p50) and
    ``device_memory_bytes`` (the replayed estimate); ``graph``: the model graph as PyG ``Data``, for a
    checkpoint with a GNN embedding. ``loaded``: ``checkpoint`` as :func:`load_jobscale` already read it.
    """
    net, ckpt = loaded or load_jobscale(checkpoint)
    first = first_second(samples)
    obs = np.array([first_second_features(first, batch, precision, optimizer, host_stall_s)])
    ds: dict[str, Any] = {"obs": obs}
    variant = ckpt["variant"]
    if variant == "graph":
        if coldstart is None:
            raise ValueError(f"{checkpoint}: the graph variant needs the cold-start prediction of the job")
        util = np.array([coldstart["gpu_utilization"]], dtype=np.float64)
        graph_feats = [np.log(max(coldstart["gpu_seconds"], 1e-7)), np.log(max(coldstart["host_seconds"], 1e-7))]
        ds.update(coldstart_util=util, graph_feats=np.array([[*graph_feats, *_logit(util)]]),
                  device_estimate=np.array([coldstart["device_memory_bytes"]], dtype=np.float64),
                  graphs=[graph])
        if net.encoder is not None and graph is None:
            raise ValueError(f"{checkpoint}: this checkpoint embeds the model graph; give the graph")
    q = predict(net, ds, np.arange(1), variant, np.array(ckpt["quantile_shifts"]))[0]  # (2, Q)
    if variant == "graph":  # memory: the graph rule (see cross_validate_predictions)
        q[0] = graph_anchor(ds, np.arange(1))[0] * np.exp(np.asarray(ckpt["memory_log_offsets"]))
    names = [f"p{round(100 * level)}" for level in LEVELS]
    return {"after_seconds": FIRST_SECONDS, "horizon_seconds": HORIZON_SECONDS, "variant": variant,
            "samples_used": int(len(first)), "checkpoint": str(checkpoint),
            "memory_plateau_bytes": {k: int(v) for k, v in zip(names, q[0], strict=True)},
            "gpu_utilization": {k: round(float(np.clip(v, 0, 1)), 4) for k, v in zip(names, q[1], strict=True)}}
