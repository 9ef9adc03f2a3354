"""Inference throughput tables of timm's ``benchmark.py`` (e.g. datasets/timm-infer-gpus): one row per
model and image size on one GPU and software stack, forward pass only, eval mode, AMP autocast.

Each file is named as timm names it, ``infer-{amp|fp32}-{nchw|nhwc}-pt{VERSION}-cu{VERSION}-{gpu}.csv``:
the name gives the GPU (a key of :data:`~dprobe.core.gpus.GPUS`), the stack and the
precision. Each (model, batch, image) is replayed once on meta tensors, forward only
(:func:`~dprobe.profiling.coldstart.replay.replay_inference_step`), and cached in one compressed file
beside the tables (``python -m dprobe.profiling.coldstart.timm_infer DIR``), which the inference
cross-validation and ``benchmarks/coldstart_inference.py`` read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.timm_bench import read_checked_csv

log = logging.getLogger(__name__)

COLUMNS = ("model", "timm_module", "infer_img_size", "infer_step_time", "infer_batch_size")
REPLAYS = "replays-infer.jsonl.gz"
FILE_NAME = re.compile(r"infer-(?P<amp>amp|fp32|fp16|bf16)-(?P<fmt>nchw|nhwc)-pt(?P<pt>\d+)-cu(?P<cu>\d+)-"
                       r"(?P<gpu>[a-z0-9]+)\.csv")
PRECISION = {"amp": "fp16", "fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}  # timm's --amp: fp16 autocast


class TimmInferError(ValueError):
    """A folder or table that cannot be read as timm inference benchmarks (names file, column, row)."""


def _version(digits: str) -> str:
    """timm's file-name version ("291" -> "2.9.1", "240" -> "2.4.0", "124" -> "12.4")."""
    return f"{digits[0]}.{digits[1]}.{digits[2:]}" if len(digits) >= 3 else ".".join(digits)


def read_table(path: str | Path) -> pd.DataFrame:
    """One benchmark file as rows ``model, family, image, batch, step_time_s, gpu, precision, memory_format,
    pytorch, table`` (the table's ms turned to seconds), checked: a file name timm does not write, a GPU dprobe
    has no spec for, a missing column or a value that is not a positive number raises
    :class:`TimmInferError` naming the file, column and row."""
    path = Path(path)
    m = FILE_NAME.fullmatch(path.name)
    if m is None:
        raise TimmInferError(f"{path}: not a timm inference benchmark's name "
                             "(infer-amp-nchw-pt240-cu124-rtx3090.csv and the like)")
    if m["gpu"] not in GPUS:
        raise TimmInferError(f"{path}: no GPU spec for {m['gpu']!r} (dprobe knows {', '.join(GPUS)})")
    df = read_checked_csv(path, COLUMNS, "infer_step_time", ("infer_batch_size", "infer_img_size"),
                          TimmInferError)
    return pd.DataFrame({
        "model": df["model"].astype(str), "family": df["timm_module"].astype(str),
        "image": df["infer_img_size"].astype(int), "batch": df["infer_batch_size"].astype(int),
        "step_time_s": df["infer_step_time"].astype(float) / 1000.0,
        "gpu": m["gpu"], "precision": PRECISION[m["amp"]], "memory_format": m["fmt"],
        "pytorch": _version(m["pt"]), "table": path.name})


def load_timm_infer(directory: str | Path, memory_format: str | None = "nchw") -> pd.DataFrame:
    """Every table in ``directory`` (of ``memory_format``; None: all), concatenated; rows repeated within a
    table (same model and image) are refused."""
    directory = Path(directory)
    paths = sorted(directory.glob("infer-*.csv"))
    if not paths:
        raise TimmInferError(f"{directory}: no timm inference tables (infer-*.csv)")
    tables = [read_table(p) for p in paths]
    for t in tables:
        dup = t.duplicated(["model", "image"])
        if dup.any():
            raise TimmInferError(f"{directory / t['table'].iloc[0]}: model {t['model'][dup].iloc[0]!r} at image "
                                 f"{t['image'][dup].iloc[0]} listed twice")
    runs = pd.concat(tables, ignore_index=True)
    if memory_format is not None:
        runs = runs[runs["memory_format"] == memory_format].reset_index(drop=True)
    return runs


def replay_key(model: str, batch: int, image: int, precision: str) -> str:
    """The cache key of one inference replay (the replay cache's own: it changes when the replay does)."""
    from dprobe.profiling.coldstart.features import replay_cache_key

    return replay_cache_key(f"timm:{model}", batch, precision, "none", image, None, None, mode="inference")


def read_replays(path: str | Path) -> dict[str, dict[str, Any]]:
    """The cached replays by key (each ``{"est": ...}`` or ``{"error": ...}``); empty where there is no file."""
    from dprobe.profiling.coldstart.timm_bench import read_replays as read

    return read(path)


def replay_one(model: str, batch: int, image: int, precision: str) -> dict[str, Any]:
    """One job's cache record: its forward replay, or the error that stopped it (first line)."""
    from dprobe.profiling.coldstart.features import analytical_for

    rec: dict[str, Any] = {"key": replay_key(model, batch, image, precision), "model": model, "batch": batch,
                           "image": image, "precision": precision}
    try:
        est = analytical_for(f"timm:{model}", batch, precision, "none", image=image, mode="inference")
    except Exception as exc:  # noqa: BLE001 - a model this timm cannot build or replay: recorded, left out
        rec["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        return rec
    d = est.to_dict()
    d["ops"] = [[int(o[0]), int(o[1]), int(o[2]), float(f"{o[3]:.5g}"), float(f"{o[4]:.5g}")] for o in d["ops"]]
    rec["est"] = d
    return rec


def build_replays(directory: str | Path, limit: int | None = None, progress: bool = True) -> Path:
    """Replay every (model, batch, image, precision) of the folder's tables not yet in
    ``directory/replays-infer.jsonl.gz`` and rewrite the file (records of an older replay are dropped).
    The file is rewritten every 100 new replays, so that a stopped build keeps what it did."""
    from tqdm.auto import tqdm

    runs = load_timm_infer(directory, memory_format=None)
    path = Path(directory) / REPLAYS
    have = read_replays(path)
    jobs = runs[["model", "batch", "image", "precision"]].drop_duplicates().itertuples(index=False)
    wanted = {replay_key(m, b, i, p): (m, b, i, p) for m, b, i, p in list(jobs)[:limit]}
    kept = {k: v for k, v in have.items() if k in wanted}
    t0, new = time.time(), 0
    for key, (m, b, i, p) in tqdm(wanted.items(), desc="replaying inference jobs", unit="job",
                                  disable=not progress):
        if key not in kept:
            kept[key] = replay_one(m, b, i, p)
            new += 1
            if new % 100 == 0:
                _write(path, kept)
    _write(path, kept)
    errors = sum("error" in r for r in kept.values())
    log.info("%d replays (%d failed) in %.0f s -> %s", len(kept), errors, time.time() - t0, path)
    return path


def _write(path: Path, records: dict[str, dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        for key in sorted(records):
            f.write(json.dumps(records[key], separators=(",", ":")) + "\n")
    tmp.replace(path)


def with_replays(runs: pd.DataFrame, replays: dict[str, dict[str, Any]]) -> tuple[pd.DataFrame, list[Any]]:
    """The rows of ``runs`` whose job has a replay in ``replays``, and each row's
    :class:`~dprobe.profiling.coldstart.replay.ReplayEstimate` (rows whose replay failed are left out)."""
    from dprobe.profiling.coldstart.replay import ReplayEstimate

    keep, ests, cache = [], [], {}
    for i, r in enumerate(runs.itertuples(index=False)):
        key = replay_key(r.model, int(r.batch), int(r.image), r.precision)
        rec = replays.get(key)
        if rec is None or "est" not in rec:
            continue
        if key not in cache:
            cache[key] = ReplayEstimate.from_dict(rec["est"])
        keep.append(i)
        ests.append(cache[key])
    return runs.iloc[keep].reset_index(drop=True), ests


def family_fold(family: str, folds: int = 5) -> int:
    """The fold of a model family in leave-family-out cross-validation: a hash of its name, so that a
    family keeps its fold whatever else the data holds."""
    import zlib

    return zlib.crc32(family.encode()) % folds


def cv_folds(runs: pd.DataFrame, by: str, folds: int = 5) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(name, train rows, test rows)`` of each fold: ``by="gpu"`` leaves each GPU out (all its stacks),
    ``by="family"`` leaves a fifth of the model families (timm modules) out, by :func:`family_fold`."""
    if by == "gpu":
        keys = runs["gpu"].to_numpy()
        names = sorted(set(keys))
    elif by == "family":
        keys = np.array([family_fold(f, folds) for f in runs["family"]])
        names = sorted(set(keys))
    else:
        raise ValueError(f"unknown grouping {by!r} (gpu, family)")
    out = []
    for name in names:
        test = np.flatnonzero(keys == name)
        train = np.flatnonzero(keys != name)
        out.append((f"{by}={name}", train, test))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dprobe.profiling.coldstart.timm_infer",
                                description="Replay the forward pass of every model of a folder of timm "
                                "inference benchmarks (e.g. datasets/timm-infer-gpus) on meta tensors and cache "
                                f"the replays in its {REPLAYS}, which the inference cross-validation reads.")
    p.add_argument("directory", help="the folder of infer-*.csv tables")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs (a quick check)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build_replays(args.directory, args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
