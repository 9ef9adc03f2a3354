"""Training throughput tables of timm's ``benchmark.py`` (e.g. datasets/timm-train-rtx3090): one row per
model at the largest batch of timm's batch ladder that fitted, each replayed on meta tensors as it ran.

A row gives two kinds of label: the step time at its batch, and whether the job fits the GPU's memory
(it fitted at ``train_batch_size``; below 512, the next batch up the ladder did not). The replays are
cached in one compressed file beside the tables (``python -m dprobe.profiling.coldstart.timm_bench DIR``),
so that training and the benchmark do not replay 900 jobs again.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

COLUMNS = ("model", "timm_module", "train_step_time", "train_batch_size", "train_img_size")
TOP_BATCH = 512  # timm's benchmark starts here and steps down on out-of-memory
REPLAYS = "replays.jsonl.gz"
STACK = "stack.json"


class TimmBenchError(ValueError):
    """A table or stack file that cannot be read as a timm training benchmark (names file, column, row)."""


def next_batch_up(batch: int) -> int | None:
    """The batch timm's benchmark tried before ``batch`` (its ladder 512, 384, 256, 192, ...; None at the top)."""
    from timm.utils.decay_batch import decay_batch_step

    b, prev = TOP_BATCH, None
    while b > batch:
        prev, b = b, decay_batch_step(b)
    return prev if b == batch else None


@dataclass
class TimmBench:
    """One GPU's timm training benchmark: the table (nchw unless ``memory_format`` says otherwise) and its stack."""

    runs: pd.DataFrame  # model, family (timm_module), batch, image, step_time_s, batch_up (NaN: fitted at 512)
    stack: dict[str, Any]  # gpu, gpu_memory_bytes, driver, cuda, pytorch, precision, optimizer, memory_format
    directory: Path


def load_stack(directory: str | Path) -> dict[str, Any]:
    """``stack.json`` of a benchmark folder: the GPU (a key of GPUS or a spec file beside it), its memory,
    driver, CUDA, PyTorch, precision, optimizer and the table per memory format."""
    path = Path(directory) / STACK
    try:
        stack = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TimmBenchError(f"{path}: cannot read the benchmark's stack ({exc})") from exc
    for key in ("gpu", "gpu_memory_bytes", "precision", "optimizer", "tables"):
        if key not in stack:
            raise TimmBenchError(f"{path}: field {key!r} missing")
    if not isinstance(stack["tables"], dict) or not stack["tables"]:
        raise TimmBenchError(f"{path}: 'tables' must map a memory format (nchw, nhwc) to a CSV file")
    mem = stack["gpu_memory_bytes"]
    if not isinstance(mem, int | float) or not 2**28 <= mem <= 2**42:
        raise TimmBenchError(f"{path}: 'gpu_memory_bytes' must be a byte count (256 MiB to 4 TiB), not {mem!r}")
    return stack


def load_timm_bench(directory: str | Path, memory_format: str = "nchw") -> TimmBench:
    """The table of ``memory_format`` in ``directory`` (laid out as datasets/timm-train-rtx3090), checked:
    a missing column, a step time or batch that is not a positive number, an image side below 1, or a
    batch off timm's ladder raises :class:`TimmBenchError` naming the file, column and row."""
    directory = Path(directory)
    stack = load_stack(directory)
    if memory_format not in stack["tables"]:
        raise TimmBenchError(f"{directory / STACK}: no table for memory format {memory_format!r} "
                             f"(it has {', '.join(stack['tables'])})")
    path = directory / stack["tables"][memory_format]
    df = read_checked_csv(path, COLUMNS, "train_step_time", ("train_batch_size", "train_img_size"), TimmBenchError)
    batches = df["train_batch_size"].astype(int)
    off = [b for b in batches if b != TOP_BATCH and next_batch_up(b) is None]
    if off:
        row = int(np.flatnonzero(batches.to_numpy() == off[0])[0])
        raise TimmBenchError(f"{path}: column 'train_batch_size', row {row + 2}: {off[0]} is not on timm's "
                             "batch ladder (512, 384, 256, 192, ...)")
    dup = df["model"].duplicated()
    if dup.any():
        raise TimmBenchError(f"{path}: model {df['model'][dup].iloc[0]!r} listed twice")
    runs = pd.DataFrame({"model": df["model"].astype(str), "family": df["timm_module"].astype(str),
                         "batch": batches, "image": df["train_img_size"].astype(int),
                         "step_time_s": df["train_step_time"].astype(float) / 1000.0})  # the table's ms
    runs["batch_up"] = [float(next_batch_up(b) or "nan") for b in runs["batch"]]
    return TimmBench(runs=runs, stack={**stack, "memory_format": memory_format}, directory=directory)


def read_checked_csv(path: Path, columns: tuple[str, ...], number: str, whole: tuple[str, ...],
                     error: type[ValueError]) -> pd.DataFrame:
    """A timm benchmark table, checked: unreadable, a column of ``columns`` missing, ``number`` not a positive
    number or one of ``whole`` not a positive whole number raises ``error`` naming the file, column and row."""
    try:
        df = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as exc:
        raise error(f"{path}: {exc}") from exc
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise error(f"{path}: column {missing[0]!r} missing")
    for col in (number, *whole):
        values = pd.to_numeric(df[col], errors="coerce")
        bad = ~(np.isfinite(values) & (values > 0))
        if col != number:
            bad |= values % 1 != 0
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise error(f"{path}: column {col!r}, row {row + 2}: {df[col].iloc[row]!r} is not a "
                        f"positive {'number' if col == number else 'whole number'}")
    return df


def fused_attention(stack: dict[str, Any]) -> bool:
    """Whether the stack's attention is fused (:func:`~dprobe.profiling.coldstart.stack.stack_of_record`: its
    PyTorch has ``scaled_dot_product_attention``, 2.0 on, which timm's attention calls where it can; before
    it, timm computes attention as matrix products and a softmax)."""
    from dprobe.profiling.coldstart.stack import stack_of_record

    return stack_of_record({**stack, "pytorch": stack.get("pytorch") or "2"}).attention == "fused"


def replay_key(model: str, batch: int, image: int, precision: str, optimizer: str, fused: bool = True) -> str:
    """The cache key of a replay (the replay cache's own: it changes when the replay does)."""
    from dprobe.profiling.coldstart.features import replay_cache_key

    return replay_cache_key(f"timm:{model}", batch, precision, optimizer, image, None, None,
                            attention="fused" if fused else "unfused")


def read_replays(path: str | Path) -> dict[str, dict[str, Any]]:
    """The cached replays by key (each ``{"est": ...}`` or ``{"error": ...}``); empty where the file is not there."""
    path = Path(path)
    if not path.is_file():
        return {}
    out = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            out[rec["key"]] = rec
    return out


def replay_jobs(bench: TimmBench) -> list[tuple[str, int, int]]:
    """(model, batch, image) of every job a benchmark's labels need: each row's batch and the batch above."""
    jobs = []
    for r in bench.runs.itertuples():
        jobs.append((r.model, int(r.batch), int(r.image)))
        if not math.isnan(r.batch_up):
            jobs.append((r.model, int(r.batch_up), int(r.image)))
    return jobs


def replay_one(model: str, batch: int, image: int, precision: str, optimizer: str,
               fused: bool = True) -> dict[str, Any]:
    """One job's cache record: its replay, or the error that stopped it (first line). ``fused``: attention
    runs as ``scaled_dot_product_attention``, else as matrix products and a softmax (see
    :func:`fused_attention`)."""
    from dprobe.profiling.coldstart.features import analytical_for

    rec: dict[str, Any] = {"key": replay_key(model, batch, image, precision, optimizer, fused), "model": model,
                           "batch": batch, "image": image, "precision": precision, "optimizer": optimizer,
                           "fused_attention": fused}
    try:
        est = analytical_for(f"timm:{model}", batch, precision, optimizer, image=image,
                             attention="fused" if fused else "unfused")
    except Exception as exc:  # noqa: BLE001 - a model this timm cannot build or replay: recorded, left out
        rec["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        return rec
    d = est.to_dict()
    d["ops"] = [[int(o[0]), int(o[1]), int(o[2]), float(f"{o[3]:.5g}"), float(f"{o[4]:.5g}")] for o in d["ops"]]
    rec["est"] = d
    return rec


def build_replays(directory: str | Path, memory_format: str = "nchw", limit: int | None = None,
                  progress: bool = True) -> Path:
    """Replay every job of the benchmark not yet in ``directory/replays.jsonl.gz`` and rewrite the file
    (records whose key no longer matches, from an older replay, are dropped). Returns the file's path."""
    from tqdm.auto import tqdm

    bench = load_timm_bench(directory, memory_format)
    path = Path(directory) / REPLAYS
    have = read_replays(path)
    precision, optimizer = bench.stack["precision"], bench.stack["optimizer"]
    fused = fused_attention(bench.stack)
    jobs = replay_jobs(bench)[:limit]
    wanted = {replay_key(m, b, i, precision, optimizer, fused): (m, b, i) for m, b, i in jobs}
    kept = {k: v for k, v in have.items() if k in wanted}
    t0 = time.time()
    for key, (m, b, i) in tqdm(wanted.items(), desc="replaying benchmark jobs", unit="job", disable=not progress):
        if key not in kept:
            kept[key] = replay_one(m, b, i, precision, optimizer, fused)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        for key in sorted(kept):
            f.write(json.dumps(kept[key], separators=(",", ":")) + "\n")
    tmp.replace(path)
    errors = sum("error" in r for r in kept.values())
    log.info("%d replays (%d failed) in %.0f s -> %s", len(kept), errors, time.time() - t0, path)
    return path


def fit_memory_factor(peak_at: np.ndarray, peak_up: np.ndarray, gpu_bytes: float, context_bytes: float) -> float:
    """The factor on predicted allocator peaks that gets the most fit labels right on one GPU's stack: a job
    fits where ``factor * peak + context <= gpu_bytes``; each model ran at a batch whose peak is
    ``peak_at`` and ran out of memory one batch up (``peak_up``, NaN where it ran at the top batch).
    The middle of the best range of factors between 0.7 and 1.6 (1 without labels)."""
    peak_at, peak_up = np.asarray(peak_at, dtype=np.float64), np.asarray(peak_up, dtype=np.float64)
    if not len(peak_at):
        return 1.0
    grid = np.arange(0.7, 1.6001, 0.005)
    room = gpu_bytes - context_bytes
    fits = grid[:, None] * peak_at[None, :] <= room
    fails = np.isnan(peak_up)[None, :] | (grid[:, None] * np.nan_to_num(peak_up)[None, :] > room)
    right = (fits & fails).sum(axis=1)
    best = np.flatnonzero(right == right.max())
    return float(np.median(grid[best]))


def fit_label_peaks(directory: str | Path, models: list[str], peak_at: np.ndarray,
                    base_at: np.ndarray) -> np.ndarray:
    """The predicted allocator peak one batch up of each of ``models`` (rows of the benchmark in
    ``directory``): its cached replay there times the prediction's ratio to the replay at the batch that
    ran (``peak_at / base_at``); NaN for a model that ran at the top batch or has no replay there."""
    bench = load_timm_bench(directory)
    stack = bench.stack
    replays = read_replays(Path(directory) / REPLAYS)
    fused = fused_attention(stack)
    runs = bench.runs.set_index("model")
    out = np.full(len(models), np.nan)
    for i, model in enumerate(models):
        up = runs.loc[model, "batch_up"]
        if math.isnan(up):
            continue
        rec = replays.get(replay_key(model, int(up), int(runs.loc[model, "image"]), stack["precision"],
                                     stack["optimizer"], fused))
        if rec is not None and "est" in rec:
            out[i] = rec["est"]["peak_bytes"] * peak_at[i] / base_at[i]
    return out


def timm_module(model: str) -> str | None:
    """The timm module that defines ``model`` ("resnet50" -> "resnet"; None where timm has no such model)."""
    import timm

    try:
        return timm.models.model_entrypoint(model).__module__.rsplit(".", 1)[-1]
    except (RuntimeError, KeyError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dprobe.profiling.coldstart.timm_bench",
                                description="Replay every job of a timm training benchmark folder (e.g. "
                                "datasets/timm-train-rtx3090) on meta tensors and cache the replays in its "
                                f"{REPLAYS}, which training and benchmarks/coldstart_gpus.py read.")
    p.add_argument("directory", help="the benchmark folder (stack.json and its tables)")
    p.add_argument("--memory-format", default="nchw", help="the table to replay (default nchw)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs (a quick check)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build_replays(args.directory, args.memory_format, args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
