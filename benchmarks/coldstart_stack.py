"""What the software stack a prediction assumes does to the RTX 3090's step times: timm families held out
(leave-family-out by timm module, as benchmarks/coldstart_gpus.py), each held-out 3090 job predicted by the
fold's model as ``dprobe predict --gpu rtx3090`` predicts it, once on the stack its row was measured on
(timm-2022, the 3090's default) and once on another (``--other``, default h200-profiles: cudnn.benchmark off,
fused attention, what ``dprobe predict`` assumed on every GPU before the stack was an input).

    .venv/bin/python benchmarks/coldstart_stack.py [--other h200-profiles] [--folds 20] [--epochs 400]
        [--ensemble 10] [--cache .cache/coldstart] [--data datasets/h200-profiles]
        [--bench datasets/timm-train-rtx3090]

Every feature row comes from ``job_inputs``, the function ``dprobe predict`` builds its features with, and
every prediction from ``predict_runs``, the cross-validation's; the 3090 rows of the other stack are replayed
with its attention (cached under ``--cache``; a first run replays the jobs of models with attention layers,
the others' replays being the same on either stack). Also: the
shipped checkpoint on both stacks (it learnt from every 3090 row: in-sample), and the NHWC table's step
times against the NCHW prediction of the same job (the features do not model the memory format).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import numpy as np
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from dprobe.core.conformal import held_out_groups
from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.crossval import predict_runs
from dprobe.profiling.coldstart.dataset import (
    ProfileDataset,
    concat_datasets,
    load_benchmark_dataset,
    load_dataset,
)
from dprobe.profiling.coldstart.features import FEATURES
from dprobe.profiling.coldstart.fit import DEFAULTS, fit, for_machines, host_factors
from dprobe.profiling.coldstart.job import job_inputs
from dprobe.profiling.coldstart.model import TARGETS
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.coldstart.stack import STACKS, SoftwareStack, resolve_stack, stack_of_record
from dprobe.profiling.coldstart.timm_bench import REPLAYS, load_timm_bench, read_replays, replay_key

STEP = TARGETS.index("step_time_seconds")


def has_attention(model: str) -> bool:
    """Whether a timm model has a layer whose kernels the stack's attention setting chooses (timm's
    ``fused_attn`` switch, or PyTorch's multi-head attention); without one, its replay is the same on
    either setting. Built on the meta device."""
    from torch import nn

    from dprobe.graph.zoo import build_module, parse_spec

    modules = build_module(parse_spec(f"timm:{model}")).modules()
    return any(hasattr(m, "fused_attn") or isinstance(m, nn.MultiheadAttention) for m in modules)


def rows_on_stack(ds: ProfileDataset, rows: np.ndarray, bench_dir: str, stack: SoftwareStack,
                  cache_dir: str) -> ProfileDataset:
    """``ds`` with the benchmark rows ``rows`` built on ``stack`` by :func:`job_inputs` (replays from the
    benchmark's cache where its attention is the stack's or the model has none, else replayed under
    ``cache_dir``)."""
    bench = load_timm_bench(bench_dir)
    recorded = stack_of_record(bench.stack)
    runs = bench.runs.set_index("model")
    cached = read_replays(f"{bench_dir}/{REPLAYS}")
    gpu = replace(GPUS[str(bench.stack["gpu"])], memory_bytes=float(bench.stack["gpu_memory_bytes"]))
    precision, optimizer = str(bench.stack["precision"]), str(bench.stack["optimizer"])
    feats, base = ds.feats.copy(), ds.base.copy()
    for i in tqdm(rows, desc=f"3090 jobs on {stack.preset}", unit="job", leave=False):
        model = ds.models[i]
        batch, image = int(runs.loc[model, "batch"]), int(runs.loc[model, "image"])
        est = None
        if stack.attention == recorded.attention or not has_attention(model):
            rec = cached[replay_key(model, batch, image, precision, optimizer, recorded.attention == "fused")]
            est = ReplayEstimate.from_dict(rec["est"])
        inputs = job_inputs(f"timm:{model}", batch, precision, optimizer, gpu=gpu, stack=stack, image=image,
                            cache_dir=cache_dir, est=est)
        feats[i], base[i] = inputs.feats, inputs.base
    return replace(ds, feats=feats, base=base)


def scores(y: np.ndarray, p: np.ndarray) -> str:
    """MAPE, median ratio predicted / measured, Spearman."""
    ratio = p / y
    return (f"MAPE {100 * np.mean(np.abs(ratio - 1)):5.1f} %  median ratio {np.median(ratio):.2f}  "
            f"Spearman {spearmanr(p, y)[0]:.3f}  [{len(y)} jobs]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="datasets/h200-profiles", help="h200-profiles layout (default: %(default)s)")
    ap.add_argument("--bench", default="datasets/timm-train-rtx3090", help="timm benchmark folder (default: %(default)s)")
    ap.add_argument("--other", default="h200-profiles", choices=list(STACKS),
                    help="the stack to compare the recorded one with (default: %(default)s)")
    ap.add_argument("--folds", type=int, default=20, help="groups of families held out (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=400, help="training epochs of each member (default: %(default)s)")
    ap.add_argument("--ensemble", type=int, default=DEFAULTS["ensemble"], help="members (default: %(default)s)")
    ap.add_argument("--cache", default=".cache/coldstart", help="replay cache (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    h200 = load_dataset(args.data, args.cache, progress=False)
    bench = load_benchmark_dataset(args.bench, progress=False)
    ds = concat_datasets([h200, bench])
    gpu = bench.gpus[0]
    rows = np.flatnonzero(np.asarray(ds.gpus) == gpu)
    recorded = stack_of_record(load_timm_bench(args.bench).stack)
    default = resolve_stack(gpu)
    other = resolve_stack(gpu, args.other)
    same = rows_on_stack(ds, rows, args.bench, default, args.cache)
    assert np.array_equal(same.feats[rows], ds.feats[rows]), "the training rows are not dprobe predict's features"
    alt = rows_on_stack(ds, rows, args.bench, other, args.cache)
    change = alt.feats[rows] != ds.feats[rows]
    differs = change.any(axis=1)
    replayed = np.delete(change, FEATURES.index("cudnn_benchmark"), axis=1).any(axis=1)  # attention's doing
    print(f"{len(h200.run_ids)} H200 runs, {len(rows)} {gpu} jobs; recorded stack {recorded.as_dict()}; "
          f"{gpu}'s default {default.preset}; other {other.as_dict()}: {int(differs.sum())} jobs' features "
          f"differ, {int(replayed.sum())} replays ({time.time() - t0:.0f} s)")

    hp = {**DEFAULTS, "ensemble": args.ensemble}
    y = ds.y[rows, STEP]
    p_rec, p_alt = np.zeros(len(rows)), np.zeros(len(rows))
    where = {r: j for j, r in enumerate(rows)}
    groups = held_out_groups(np.array(ds.families), args.folds, args.seed)
    t1 = time.time()
    for test in tqdm(groups, desc="folds", unit="fold", leave=False):
        train = np.setdiff1d(np.arange(len(ds.run_ids)), test)
        model = fit(for_machines(ds, host_factors(ds, train)), train, args.epochs, args.seed, hp, calibrate=False)
        mine = np.array([i for i in test if i in where], dtype=int)
        if not len(mine):
            continue
        j = np.array([where[i] for i in mine])
        p_rec[j] = predict_runs(model, ds, mine)[0][:, STEP]  # host factor 1, as dprobe predict
        p_alt[j] = predict_runs(model, alt, mine)[0][:, STEP]
    print(f"\n{gpu} step time, timm families held out ({args.folds} groups; {args.ensemble} members, "
          f"{args.epochs} epochs; {time.time() - t1:.0f} s):")
    print(f"  on {default.preset:14s} (default now)  {scores(y, p_rec)}")
    print(f"  on {other.preset:14s} (--stack)       {scores(y, p_alt)}")
    for label, on in (("  attention jobs (replay differs)", replayed), ("  the others", ~replayed)):
        if on.any():
            print(f"{label}: {default.preset} {scores(y[on], p_rec[on])}\n{'':{len(label)}}  "
                  f"{other.preset} {scores(y[on], p_alt[on])}")

    from dprobe.profiling.coldstart.checkpoint import load_checkpoint
    from dprobe.profiling.coldstart.predict import DEFAULT_CHECKPOINT

    shipped, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    s_rec, s_alt = (predict_runs(shipped, d, rows)[0][:, STEP] for d in (ds, alt))
    print(f"\nshipped checkpoint (learnt from every {gpu} job: in-sample):")
    print(f"  on {default.preset:14s} {scores(y, s_rec)}")
    print(f"  on {other.preset:14s} {scores(y, s_alt)}")

    nhwc = load_timm_bench(args.bench, "nhwc").runs.set_index("model")
    nchw = load_timm_bench(args.bench).runs.set_index("model")
    both = [j for j, i in enumerate(rows) if ds.models[i] in nhwc.index
            and nhwc.loc[ds.models[i], "batch"] == nchw.loc[ds.models[i], "batch"]]
    y_nhwc = np.array([nhwc.loc[ds.models[rows[j]], "step_time_s"] for j in both])
    print(f"\nNHWC table, same batch as NCHW, predicted as NCHW (held out, {default.preset}): "
          f"{scores(y_nhwc, p_rec[both])}")
    print(f"({time.time() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
