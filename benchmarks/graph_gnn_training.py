"""Does the kernel-graph GNN earn its place on *training* steps? H200 step time of h200-profiles' runs on
families never seen, on the folds and rows of the cold-start cross-validation, from three predictors:

* **rule**: the run's analytical step (the replay's per-kernel roofline, GPU or host time, the larger, on
  its machine's host factor) times one factor, the median measured / analytical of the fold's H200
  training runs; its p90 the 90th percentile of that ratio there;
* **vector**: the shipped cold-start model (:mod:`dprobe.profiling.coldstart`, a network on the hand-made
  feature vector), cross-validated by :func:`~dprobe.profiling.coldstart.crossval.cross_validate` exactly
  as ``benchmarks/coldstart_gpus.py`` does (both GPUs' runs in training, training's settings);
* **GNN**: :class:`~dprobe.profiling.coldstart.kernel_gnn.KernelGNN` on the training step's kernel graph
  (:func:`~dprobe.profiling.coldstart.kernel_gnn.training_graph`: forward, backward and optimizer kernels,
  the phase a node feature, the machine's host factor scaling the host time), the inference GNN's recipe
  unchanged (3 GIN layers, 32 wide, 20 epochs, Huber), fitted on the fold's H200 training runs (``--bench``:
  the RTX 3090's too); and the same with no message passing (``--layers 3,0``: the ablation).

    .venv/bin/python benchmarks/graph_gnn_training.py [--data datasets/h200-profiles]
        [--bench datasets/timm-train-rtx3090] [--gnn-bench] [--folds 20] [--seed 0] [--layers 3,0]
        [--epochs 20] [--workers 2] [--json PATH]

Folds: :func:`dprobe.core.conformal.held_out_groups` of the joint family list (H200 runs and the
benchmark's, families by timm module), as ``cross_validate`` deals them; every predictor is fitted on the
other families' runs only, nothing chosen on a test fold. Scored on the H200 runs: MAPE (%) over all of
them, its mean and min-max over the folds, Spearman, and p90 coverage. The GNN's p90 is its p50 times the
90th percentile of measured / predicted over the H200 runs of the *other* folds (each scored by the model
that left it out). The issue's target: H200 step time MAPE <= 12 % on families never seen. About 20 minutes on 2 busy cores
(the vector's cross-validation 9, the GNN 7.5, the ablation 3.5; ``--layers 3``: without the ablation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprobe.profiling.coldstart.kernel_gnn import scores, training_graph
from dprobe.profiling.coldstart.kernel_gnn_train import crossval_training_gnn, training_step_rows

ROOT = Path(__file__).resolve().parents[1]
TARGET_MAPE = 12.0


def rule(ds: Any, groups: list[np.ndarray], scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule's p50 and p90 of each scored row, from the other families' runs of its GPU."""
    from dprobe.profiling.coldstart.fit import for_machines, host_factors
    from dprobe.profiling.coldstart.model import TARGETS

    si = TARGETS.index("step_time_seconds")
    fams, gpus, y = np.asarray(ds.families), np.asarray(ds.gpus), ds.y[:, si]
    p50, p90 = np.full(len(y), np.nan), np.full(len(y), np.nan)
    for test in groups:
        test = test[scored[test]]
        train = np.flatnonzero(~np.isin(fams, fams[test]) & np.isfinite(y) & (y > 0))
        base = for_machines(ds, host_factors(ds, train)).base[:, si]
        for g in set(gpus[test]):
            fit = train[gpus[train] == g]
            ratio = y[fit] / base[fit]
            rows = test[gpus[test] == g]
            p50[rows] = base[rows] * np.median(ratio)
            p90[rows] = base[rows] * np.quantile(ratio, 0.9)
    return p50, p90


def other_folds_p90(y: np.ndarray, p50: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """Each row's p90: its p50 times the 90th percentile of measured / predicted over the other folds' rows."""
    p90 = np.full(len(y), np.nan)
    ok = np.isfinite(p50)
    for test in groups:
        others = ok.copy()
        others[test] = False
        p90[test] = p50[test] * np.quantile(y[others] / p50[others], 0.9)
    return p90


def fold_table(y: np.ndarray, preds: dict[str, tuple[np.ndarray, np.ndarray]], groups: list[np.ndarray],
               scored: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per predictor: its scores over every scored row, and the MAPE of each fold (with scored rows)."""
    out = {}
    for name, (p50, p90) in preds.items():
        per = [scores(y[t], p50[t])["mape"] for t in (g[scored[g]] for g in groups) if len(t)]
        out[name] = {**scores(y[scored], p50[scored], p90[scored] if p90 is not None else None),
                     "fold_mean": float(np.mean(per)), "fold_min": float(np.min(per)),
                     "fold_max": float(np.max(per)), "folds_scored": len(per)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "datasets" / "h200-profiles"))
    p.add_argument("--bench", default=str(ROOT / "datasets" / "timm-train-rtx3090"),
                   help="a timm training benchmark folder joined to the runs, as training joins it ('': none)")
    p.add_argument("--gnn-bench", action="store_true", help="fit the GNN on the benchmark's runs too")
    p.add_argument("--cache", default=str(ROOT / ".cache" / "coldstart"), help="replay cache")
    p.add_argument("--folds", type=int, default=20, help="groups of families (coldstart_gpus.py's: 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default="3,0", help="GNN message-passing layers, one cross-validation each")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--ensemble", type=int, default=None, help="vector model members (default: training's)")
    p.add_argument("--vector-epochs", type=int, default=400, help="(default: training's, %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="processes for the folds")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ds, ests, precisions = training_step_rows(args.data, args.cache, (args.bench,) if args.bench else ())
    gpus = np.asarray(ds.gpus)
    h200 = gpus == "h200"
    y = ds.y[:, 3]
    t = time.perf_counter()
    graphs = [training_graph(e, pr, g) for e, pr, g in zip(ests, precisions, ds.gpus, strict=True)]
    nodes = np.array([g.num_nodes for g in graphs])
    kernels = np.array([float(g.n_kernels) for g in graphs])
    print(f"{int(h200.sum())} H200 runs, {int((~h200).sum())} benchmark runs, {len(set(ds.families))} families in "
          f"{args.folds} groups (seed {args.seed}); H200 training-step graphs: {np.median(kernels[h200]):.0f} kernels, "
          f"{np.median(nodes[h200]):.0f} nodes (median), max {nodes[h200].max()}; built in "
          f"{time.perf_counter() - t:.1f} s (rows loaded in {t - t0:.0f} s)", flush=True)

    from dprobe.core.conformal import held_out_groups
    from dprobe.profiling.coldstart.crossval import cross_validate

    groups = held_out_groups(np.asarray(ds.families), args.folds, args.seed)
    preds: dict[str, tuple[np.ndarray, np.ndarray | None]] = {"rule": rule(ds, groups, h200)}
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    hp = {"ensemble": args.ensemble} if args.ensemble else {}
    cv = cross_validate(args.data, args.cache, ds=ds, folds=args.folds, max_epochs=args.vector_epochs,
                        seed=args.seed, progress=False, workers=args.workers, **hp)
    preds["vector"] = (cv.p50[:, 3], cv.p90[:, 3])
    seconds["vector"] = time.perf_counter() - t
    print(f"vector: cross-validated in {seconds['vector']:.0f} s", flush=True)
    for layers in (int(v) for v in args.layers.split(",")):
        t = time.perf_counter()
        res = crossval_training_gnn(ds, graphs, folds=args.folds, seed=args.seed,
                                    trainable=None if args.gnn_bench else h200, scored=h200,
                                    workers=args.workers, epochs=args.epochs, hidden=args.hidden, layers=layers)
        name = f"gnn_{layers}_layers"
        preds[name] = (res["pred"], other_folds_p90(y, res["pred"], [g[h200[g]] for g in groups]))
        seconds[name] = time.perf_counter() - t
        print(f"{name}: cross-validated in {seconds[name]:.0f} s ({np.mean([f['seconds'] for f in res['folds']]):.0f} s "
              f"a fit, {np.mean([f['epochs'] for f in res['folds']]):.0f} epochs)", flush=True)

    table = fold_table(y, preds, groups, h200)
    n_folds = table["rule"]["folds_scored"]
    print(f"\nH200 training step time, families never seen ({int(h200.sum())} runs, {n_folds} folds with H200 runs; "
          f"GNN fitted on {'both GPUs' if args.gnn_bench else 'H200'} runs, vector on both GPUs' runs):")
    print(f"  {'predictor':<14} {'MAPE':>7} {'folds: mean (min-max)':>24} {'Spearman':>9} {'p90 cover':>10}")
    for name, s in table.items():
        print(f"  {name:<14} {s['mape']:6.1f} % {s['fold_mean']:9.1f} % ({s['fold_min']:4.1f}-{s['fold_max']:4.1f})"
              f" {s['spearman']:9.3f} {s['p90_coverage']:8.0f} %")
    vec = table["vector"]
    for name in (k for k in table if k.startswith("gnn")):
        better = table[name]["mape"] < vec["mape"] and table[name]["fold_mean"] < vec["fold_mean"]
        print(f"  {name} against the vector: MAPE {table[name]['mape']:.1f} % against {vec['mape']:.1f} % "
              f"({'better' if better else 'not better'})")
    print(f"  target <= {TARGET_MAPE:g} %: "
          + ", ".join(f"{k} {'PASS' if s['mape'] <= TARGET_MAPE else 'MISS'}" for k, s in table.items()))
    print(f"done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "seconds": seconds, "folds": args.folds,
                                               "seed": args.seed, "gnn_bench": args.gnn_bench}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
