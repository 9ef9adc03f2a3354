"""Pretrain the graph encoder on the graph corpus (:mod:`dprobe.pretrain.corpus`): regress each architecture's
replayed labels (log allocator peak per sample in fp32 and bf16, log bytes saved for backward, log FLOPs and
bytes moved, log kernels and parameter bytes, FLOPs and bytes-moved shares by kernel class) through a linear
head, so that the embedding carries them linearly; score it by leave-family-out linear probes beside the
hand-made graph vector (:func:`dprobe.data.workloads.graph_vector`) and the meta replay.

``python train.py +exp=pretrain_gnn`` runs :func:`pretrain_stage` (``conf/pretrain/gnn.yaml``).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch, Data

from dprobe.graph.embed import CHECKPOINT_VERSION, default_encoder_path
from dprobe.graph.encoder import CONVS, GraphEncoder
from dprobe.pretrain.corpus import PRECISIONS, load_corpus

log = logging.getLogger(__name__)

OP_CLASSES = ("elementwise", "norm", "matmul", "conv", "conv_grouped", "optimizer")  # memtrack.OP_CLASSES' order
LOG_TARGETS = ["peak_per_sample_fp32", "peak_per_sample_bf16", "saved_per_sample", "flops_per_sample",
               "bytes_moved_per_sample", "kernels", "param_bytes"]
TARGETS = [f"log_{t}" for t in LOG_TARGETS] + [f"flops_share_{c}" for c in OP_CLASSES] \
    + [f"moved_share_{c}" for c in OP_CLASSES]
PROBE_TARGETS = [f"peak_per_sample_{p}" for p in PRECISIONS]  # what the linear probes predict
DEV_ITEMS = 16  # architectures a fast_dev_run pretrains on
TRAIN_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def item_targets(item: dict[str, Any]) -> np.ndarray:
    """The pretraining targets of a corpus item (order of :data:`TARGETS`)."""
    lab = item["labels"]
    return np.array([math.log(max(float(lab[t]), 1.0)) for t in LOG_TARGETS]
                    + list(lab["flops_share"]) + list(lab["moved_share"]), dtype=np.float32)


def item_data(item: dict[str, Any]) -> Data:
    """A corpus item as PyG ``Data`` (the encoder's inputs)."""
    return Data(x=item["x"].float(), kind=item["kind"].long(), edge_index=item["edge_index"].long(),
                edge_attr=item["edge_attr"].float(), num_nodes=int(item["x"].shape[0]))


def family_folds(families: list[str], folds: int, seed: int) -> list[np.ndarray]:
    """Row indices of each fold's held-out families: the families dealt at random into ``folds`` groups."""
    fams = np.array(families)
    unique = sorted(set(families))
    if folds < 2 or folds > len(unique):
        raise ValueError(f"folds must be between 2 and the number of families ({len(unique)}), got {folds}")
    order = np.random.default_rng(seed).permutation(len(unique))
    groups = [set(np.array(unique)[order[i::folds]]) for i in range(folds)]
    return [np.flatnonzero(np.isin(fams, sorted(g))) for g in groups]


class PretrainModel(nn.Module):
    """The encoder and one linear head over its embedding for every target."""

    def __init__(self, n_targets: int, **hparams: Any) -> None:
        super().__init__()
        self.encoder = GraphEncoder(**hparams)
        self.head = nn.Linear(hparams.get("out_dim", 64), n_targets)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.head(self.encoder(batch))


def fit_encoder(datas: list[Data], y: np.ndarray, hparams: dict[str, Any], epochs: int = 150, batch_size: int = 32,
                precision: str = "fp32", lr: float = 2e-3, seed: int = 0, device: str = "cpu") -> PretrainModel:
    """Fit a :class:`PretrainModel` on standardised targets ``y`` ``[n, len(TARGETS)]`` (AdamW, cosine
    schedule; ``precision``: fp32, or bf16 autocast)."""
    if precision not in TRAIN_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(TRAIN_PRECISIONS)}, got {precision!r}")
    if batch_size < 1 or epochs < 1:
        raise ValueError(f"batch_size and epochs must be at least 1, got {batch_size} and {epochs}")
    torch.manual_seed(seed)
    model = PretrainModel(y.shape[1], **hparams).to(device)
    target = torch.tensor(y, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * math.ceil(len(datas) / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(seed)
    dtype = TRAIN_PRECISIONS[precision]
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(datas))
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            batch = Batch.from_data_list([datas[j] for j in idx]).to(device)
            with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                pred = model(batch)
            loss = nn.functional.mse_loss(pred.float(), target[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    return model.cpu().eval()


@torch.no_grad()
def embed(model: PretrainModel, datas: list[Data], chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings and head outputs of ``datas``."""
    z, p = [], []
    for i in range(0, len(datas), chunk):
        e = model.encoder(Batch.from_data_list(datas[i:i + chunk]))
        z.append(e)
        p.append(model.head(e))
    return torch.cat(z).numpy(), torch.cat(p).numpy()


def ridge_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, alpha: float = 1e-2) -> np.ndarray:
    """A linear probe: ridge regression on standardised columns (closed form), its predictions on ``test_x``."""
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a, b = (train_x - mu) / sd, (test_x - mu) / sd
    a1 = np.hstack([a, np.ones((len(a), 1))])
    reg = alpha * len(a) * np.eye(a1.shape[1])
    reg[-1, -1] = 0.0
    w = np.linalg.solve(a1.T @ a1 + reg, a1.T @ train_y)
    return np.hstack([b, np.ones((len(b), 1))]) @ w


def mape(pred_log: np.ndarray, y: np.ndarray) -> float:
    """Mean absolute percentage error of ``exp(pred_log)`` against ``y``."""
    return float(100 * np.mean(np.abs(np.exp(pred_log) - y) / y))


def median_ape(pred_log: np.ndarray, y: np.ndarray) -> float:
    """Median absolute percentage error of ``exp(pred_log)`` against ``y`` (what a typical architecture sees;
    the mean is led by the few a family alone resembles)."""
    return float(100 * np.median(np.abs(np.exp(pred_log) - y) / y))


@dataclass
class ProbeResult:
    """Leave-family-out linear probes of one encoder kind: per probe target, MAPE of each input block."""

    conv: str
    mape: dict[str, dict[str, float]]  # target -> {"gnn": ..., "handmade": ..., "both": ..., "head": ...}
    seconds: float
    median: dict[str, dict[str, float]] | None = None  # the same, median APE


def cross_probe(items: list[dict[str, Any]], conv: str, hparams: dict[str, Any], folds: int, seed: int,
                train_kw: dict[str, Any], alpha: float = 1e-2) -> ProbeResult:
    """Per fold of held-out families: pretrain on the other families' items, then linear probes (fitted on
    the same training items) of the held-out items' allocator peak per sample from the frozen embedding,
    the hand-made vector, both, and the pretraining head's own output."""
    started = time.perf_counter()
    datas = [item_data(it) for it in items]
    y = np.stack([item_targets(it) for it in items])
    hand = np.stack([it["handmade"].numpy() for it in items]).astype(np.float64)
    truth = {t: np.array([it["labels"][t] for it in items]) for t in PROBE_TARGETS}
    preds = {t: {k: np.zeros(len(items)) for k in ("gnn", "handmade", "both", "head")} for t in PROBE_TARGETS}
    for test in family_folds([it["spec"]["family"] for it in items], folds, seed):
        train = np.setdiff1d(np.arange(len(items)), test)
        mu, sd = y[train].mean(0), y[train].std(0) + 1e-6
        model = fit_encoder([datas[i] for i in train], (y[train] - mu) / sd, {**hparams, "conv": conv},
                            seed=seed, **train_kw)
        z, head = embed(model, datas)
        z = z.astype(np.float64)
        for t in PROBE_TARGETS:
            col = TARGETS.index(f"log_{t}")
            target = y[train, col].astype(np.float64)
            blocks = {"gnn": z, "handmade": hand, "both": np.hstack([z, hand])}
            for name, x in blocks.items():
                preds[t][name][test] = ridge_probe(x[train], target, x[test], alpha)
            preds[t]["head"][test] = head[test, col] * sd[col] + mu[col]
    scores = {t: {k: mape(v, truth[t]) for k, v in preds[t].items()} for t in PROBE_TARGETS}
    medians = {t: {k: median_ape(v, truth[t]) for k, v in preds[t].items()} for t in PROBE_TARGETS}
    return ProbeResult(conv=conv, mape=scores, seconds=time.perf_counter() - started, median=medians)


def save_encoder(model: PretrainModel, hparams: dict[str, Any], path: str | Path, meta: dict[str, Any]) -> Path:
    """Write the encoder's checkpoint (loaded by :class:`dprobe.graph.embed.PretrainedGraphEncoder`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"version": CHECKPOINT_VERSION, "hparams": dict(hparams), "encoder": model.encoder.state_dict(),
                "meta": meta}, path)
    return path


def report_table(results: list[ProbeResult], replay_s: float, n: int, families: int) -> str:
    """Markdown table of the probes, beside the meta replay (the labels themselves)."""
    lines = [f"Linear probes, leave-family-out ({n} architectures, {families} families): MAPE of the allocator "
             "peak per sample of architectures whose family was left out of pretraining", "",
             "| input of the probe | " + " | ".join(f"{t} MAPE % (median APE %)" for t in PROBE_TARGETS) + " |",
             "|---|" + "---|" * len(PROBE_TARGETS)]

    def cells(r: ProbeResult, key: str) -> str:
        med = r.median or r.mape
        return " | ".join(f"{r.mape[t][key]:.1f} ({med[t][key]:.1f})" for t in PROBE_TARGETS)

    for r in results:
        for key, label in (("gnn", f"{r.conv} embedding (frozen)"), ("both", f"{r.conv} embedding + hand-made"),
                           ("head", f"{r.conv} pretraining head")):
            lines.append(f"| {label} | {cells(r, key)} |")
    lines.append(f"| hand-made graph vector | {cells(results[0], 'handmade')} |")
    lines.append(f"| meta replay (the label; {replay_s:.2f} s per architecture and precision) | "
                 + " | ".join("0.0 (0.0)" for _ in PROBE_TARGETS) + " |")
    return "\n".join(lines)


def pretrain_stage(out_dir: str | Path, corpus_dir: str | Path, convs: list[str] | tuple[str, ...] = CONVS,
                   hidden: int = 64, out_dim: int = 64, layers: int = 3, heads: int = 4, epochs: int = 150,
                   batch_size: int = 32, precision: str = "fp32", lr: float = 2e-3, folds: int = 5,
                   alpha: float = 1e-2, seed: int = 0, device: str = "cpu", build_missing: bool = True,
                   limit: int | None = None, per_module: int = 3, ship: bool = False,
                   threads: int | None = 1, fast_dev_run: bool = False) -> dict[str, Any]:
    """Pretrain and score each of ``convs`` (leave-family-out probes over ``folds`` groups of families), then
    pretrain the best (lowest fp32 probe MAPE) on the whole corpus and write ``out_dir/pretrained_encoder.pt``
    (``ship``: also over the package's copy). ``build_missing``: trace the corpus first where
    ``corpus_dir`` has none (``limit``, ``per_module``: :func:`dprobe.pretrain.corpus.build_corpus`'s).
    ``threads``: torch threads while it trains (None: as they are). ``fast_dev_run``: a check that the stage runs
    end to end (at most :data:`DEV_ITEMS` architectures, two folds, one epoch, the first of ``convs``)."""
    from dprobe.pretrain.corpus import build_corpus

    if fast_dev_run:
        convs, epochs, folds, limit = list(convs)[:1], 1, 2, DEV_ITEMS if limit is None else min(limit, DEV_ITEMS)
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _pretrain(out_dir, corpus_dir, convs, hidden, out_dim, layers, heads, epochs, batch_size, precision,
                         lr, folds, alpha, seed, device, build_missing, limit, per_module, ship, build_corpus)
    finally:
        torch.set_num_threads(previous)


def _pretrain(out_dir: str | Path, corpus_dir: str | Path, convs: Any, hidden: int, out_dim: int, layers: int,
              heads: int, epochs: int, batch_size: int, precision: str, lr: float, folds: int, alpha: float,
              seed: int, device: str, build_missing: bool, limit: int | None, per_module: int, ship: bool,
              build_corpus: Any) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bad = [c for c in convs if c not in CONVS]
    if bad or not convs:
        raise ValueError(f"convs: each of {', '.join(CONVS)}, got {list(convs)}")
    if build_missing and not (Path(corpus_dir) / "items").is_dir():
        build_corpus(corpus_dir, limit=limit, per_module=per_module)
    items = load_corpus(corpus_dir)[:limit]
    families = sorted({it["spec"]["family"] for it in items})
    if len(items) < 10 or len(families) < folds:
        raise ValueError(f"{corpus_dir}: {len(items)} architectures of {len(families)} families is too few to "
                         f"pretrain on in {folds} folds (trace more: python -m dprobe.pretrain.corpus --out {corpus_dir})")
    hparams = {"hidden": hidden, "out_dim": out_dim, "layers": layers, "heads": heads}
    train_kw: dict[str, Any] = {"epochs": epochs, "batch_size": batch_size, "precision": precision, "lr": lr,
                                "device": device}
    results = []
    for conv in convs:
        log.info("pretraining %s on %d architectures, leave-family-out in %d folds", conv, len(items), folds)
        results.append(cross_probe(items, conv, hparams, folds, seed, train_kw, alpha))
    best = min(results, key=lambda r: r.mape[PROBE_TARGETS[0]]["gnn"])
    replay_s = float(np.mean([s for it in items for s in it["replay_seconds"].values()]))
    table = report_table(results, replay_s, len(items), len(families))
    y = np.stack([item_targets(it) for it in items])
    mu, sd = y.mean(0), y.std(0) + 1e-6
    started = time.perf_counter()
    final = fit_encoder([item_data(it) for it in items], (y - mu) / sd, {**hparams, "conv": best.conv}, seed=seed,
                        **train_kw)
    meta = {"targets": TARGETS, "target_mean": mu.tolist(), "target_std": sd.tolist(), "architectures": len(items),
            "families": len(families), "probe_mape": best.mape, "train_seconds": time.perf_counter() - started}
    path = save_encoder(final, {**hparams, "conv": best.conv}, out / "pretrained_encoder.pt", meta)
    if ship:
        shutil.copyfile(path, default_encoder_path())
    summary = {"table": table, "checkpoint": str(path), "best_conv": best.conv, "architectures": len(items),
               "families": len(families), "replay_seconds": replay_s,
               "probes": {r.conv: {"mape": r.mape, "median_ape": r.median, "seconds": r.seconds} for r in results}}
    (out / "report.md").write_text(table + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    print(table)
    return summary
