"""Replay the training runs of an h200-profiles directory in this Python environment, and compare two
environments' replays.

The cold-start profiler replays each run's training step on the meta device
(``dprobe.profiling.coldstart.replay``) with whatever torch, torchvision, transformers and timm are
installed. Which ops a model calls (an attention implementation, a fused kernel) depends on those
versions, and so does the replayed allocator peak; a run measured with one stack and replayed with
another can thus be off before any learnt correction. This tool finds such runs:

``replay`` replays every ok training run of DIR (or those given by ``--runs``) with dprobe's own
replay code and writes, per run, the spec, the replay's outputs (allocator peak, reserved bytes,
device memory estimate, parameter, state and activation bytes, FLOPs, kernels, ...) and the
cold-start feature vector, with the environment's library versions::

    python tools/stack_skew.py replay --data datasets/h200-profiles --out /tmp/replays-a.json

Replays are not cached unless ``--cache-dir`` is given; a cache directory is stamped with the versions
that filled it and refused by another environment (dprobe's replay cache key does not name them).

``compare`` pairs two such files by run id and lists the runs whose allocator peak or device memory
estimate differ by more than ``--threshold`` (relative; ratio = B / A), grouped by model, and writes
them as CSV (``--csv``), each row with both environments' versions::

    python tools/stack_skew.py compare /tmp/replays-a.json /tmp/replays-b.json --csv skew.csv
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import math
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

FORMAT = "dprobe-stack-skew-replays/1"
LIBRARIES = ("torch", "torchvision", "transformers", "timm")
# the replay outputs written per run (ReplayEstimate's fields, less its per-kernel op list)
REPLAY_FIELDS = ("peak_bytes", "reserved_bytes", "device_bytes", "param_bytes", "state_bytes", "steady_bytes",
                 "activation_bytes", "flops", "matmul_flops", "bytes_moved", "kernels", "large_allocs",
                 "attention_flops", "values_assumed")
# the outputs that select a run in ``compare`` (CSV column prefix, replay field)
SELECTED = (("peak", "peak_bytes"), ("device", "device_bytes"))
# further ratios the CSV shows beside them
SHOWN = (("reserved", "reserved_bytes"), ("activation", "activation_bytes"), ("flops", "flops"),
         ("kernels", "kernels"))


def library_versions() -> dict[str, str]:
    """Python's and the replay libraries' versions in this environment ("" where one is not installed)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ""
    return versions


def stack_label(versions: dict[str, str]) -> str:
    """The libraries' versions in one line, e.g. ``torch=2.11.0 torchvision=0.26.0 ...``."""
    return " ".join(f"{name}={versions.get(name) or '-'}" for name in LIBRARIES)


def _stamp_cache(cache_dir: Path, versions: dict[str, str]) -> None:
    """Mark ``cache_dir`` as this environment's; refuse one filled by another."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    stamp = cache_dir / "stack.json"
    if stamp.is_file():
        found = json.loads(stamp.read_text())
        if {k: found.get(k) for k in LIBRARIES} != {k: versions[k] for k in LIBRARIES}:
            raise SystemExit(f"{cache_dir}: its replays were made with {stack_label(found)}, this environment "
                             f"has {stack_label(versions)}; give a cache directory of its own")
    else:
        stamp.write_text(json.dumps(versions, indent=1) + "\n")


def replay_runs(data_dir: str | Path, run_ids: list[str] | None = None, cache_dir: str | Path | None = None,
                progress: bool = True) -> dict[str, Any]:
    """Replay the ok training runs of an h200-profiles directory here; the document ``replay`` writes.

    Each run: its spec, ``replay`` (the fields of :data:`REPLAY_FIELDS`), ``features`` (the cold-start
    features by name, with the run's GPU) and ``seconds`` (replay time). A run that cannot be built or
    replayed here goes to ``failed`` with its error."""
    from dprobe.core.gpus import gpu_spec
    from dprobe.data.h200 import load_h200_profiles, run_spec
    from dprobe.profiling.coldstart.features import FEATURES, analytical_for, job_features

    versions = library_versions()
    if cache_dir is not None:
        _stamp_cache(Path(cache_dir), versions)
    runs = load_h200_profiles(data_dir).train_runs()
    if run_ids is not None:
        unknown = sorted(set(run_ids) - set(runs["run_id"].astype(str)))
        if unknown:
            raise SystemExit(f"{data_dir}: no ok training run {', '.join(unknown)}")
        runs = runs[runs["run_id"].astype(str).isin(run_ids)]
    done: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for i, row in enumerate(runs.to_dict("records"), 1):
        run_id, model = str(row["run_id"]), f"{row['lib']}:{row['model']}"
        started = time.perf_counter()
        try:
            spec = run_spec(row)
            est = analytical_for(spec["model"], spec["batch"], str(row["precision"]), str(row["optimizer"]),
                                 image=spec["image"], seq=spec["seq"], config_kwargs=spec["config_kwargs"],
                                 cache_dir=cache_dir)
            gpu = gpu_spec(str(row["gpu"]), float(row["gpu_total_bytes"]))
            feats = job_features(est, spec["batch"], str(row["precision"]), str(row["optimizer"]), gpu,
                                 cudnn_benchmark=bool(row["cudnn_benchmark"]))
        except Exception as exc:  # a model this stack cannot build or replay: recorded, the others go on
            reason = (str(exc).splitlines() or [""])[0][:300]
            failed.append({"run_id": run_id, "model": model, "error": f"{type(exc).__name__}: {reason}"})
            if progress:
                print(f"[{i}/{len(runs)}] {run_id} {model}: failed ({failed[-1]['error']})", file=sys.stderr)
            continue
        seconds = time.perf_counter() - started
        done.append({"run_id": run_id, "collection": int(row["collection"]), "model": model,
                     "spec": spec["model"], "config_kwargs": spec["config_kwargs"], "batch": spec["batch"],
                     "image": spec["image"], "seq": spec["seq"], "precision": str(row["precision"]),
                     "optimizer": str(row["optimizer"]), "seconds": round(seconds, 3),
                     "replay": {k: float(getattr(est, k)) for k in REPLAY_FIELDS},
                     "features": dict(zip(FEATURES, (float(v) for v in feats), strict=True))})
        if progress:
            print(f"[{i}/{len(runs)}] {run_id} {model}: peak {est.peak_bytes / 2**30:.3f} GiB "
                  f"({seconds:.1f} s)", file=sys.stderr)
    return {"format": FORMAT, "versions": versions, "data": str(data_dir), "runs": done, "failed": failed}


def load_replays(path: str | Path) -> dict[str, Any]:
    """A file ``replay`` wrote, checked."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read replays ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("runs"), list):
        raise SystemExit(f"{path}: not a file of `stack_skew.py replay` (expected format {FORMAT!r})")
    for run in doc["runs"]:
        missing = [key for _, key in SELECTED + SHOWN if key not in run.get("replay", {})]
        if missing:
            raise SystemExit(f"{path}: run {run.get('run_id')!r} has no {', '.join(missing)} in its replay")
    return doc


def _ratio(b: float, a: float) -> float:
    """b / a; 1 where both are zero, inf where only ``a`` is."""
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def compare_replays(a: dict[str, Any], b: dict[str, Any], threshold: float = 0.02) -> list[dict[str, Any]]:
    """The runs whose allocator peak or device memory estimate differ between two replay documents by more
    than ``threshold`` (|B / A - 1|), plus the runs replayed in one of them only; one row each, in run
    order. A run id whose spec differs between the two is an error (they replayed different data)."""
    if threshold < 0:
        raise ValueError(f"threshold {threshold}: must be >= 0")
    runs_a = {r["run_id"]: r for r in a["runs"]}
    runs_b = {r["run_id"]: r for r in b["runs"]}
    failed_a = {f["run_id"]: f for f in a.get("failed", [])}
    failed_b = {f["run_id"]: f for f in b.get("failed", [])}
    label_a, label_b = stack_label(a["versions"]), stack_label(b["versions"])
    rows: list[dict[str, Any]] = []
    for run_id in sorted(set(runs_a) | set(runs_b)):
        ra, rb = runs_a.get(run_id), runs_b.get(run_id)
        base = {"run_id": run_id, "stack_a": label_a, "stack_b": label_b}
        if ra is None or rb is None:
            run = ra or rb
            other = failed_b.get(run_id) if rb is None else failed_a.get(run_id)
            note = f"replayed in {'A' if rb is None else 'B'} only"
            rows.append({**base, "model": run["model"], "precision": run["precision"], "batch": run["batch"],
                         "note": f"{note}: {other['error']}" if other else note})
            continue
        for key in ("spec", "batch", "precision", "optimizer", "image", "seq", "config_kwargs"):
            if ra.get(key) != rb.get(key):
                raise SystemExit(f"run {run_id}: {key} {ra.get(key)!r} in A, {rb.get(key)!r} in B; "
                                 "the two files replayed different data")
        row = {**base, "model": ra["model"], "precision": ra["precision"], "batch": ra["batch"]}
        for prefix, key in SELECTED + SHOWN:
            row[f"{prefix}_ratio"] = _ratio(rb["replay"][key], ra["replay"][key])
        if not any(abs(row[f"{p}_ratio"] - 1.0) > threshold for p, _ in SELECTED):
            continue
        for prefix, key in SELECTED:
            row[f"{prefix}_a_bytes"], row[f"{prefix}_b_bytes"] = ra["replay"][key], rb["replay"][key]
        fa, fb = ra.get("features", {}), rb.get("features", {})
        deltas = {k: fb[k] - fa[k] for k in fa if k in fb}
        if deltas:
            name = max(deltas, key=lambda k: abs(deltas[k]))
            row["largest_feature_change"] = f"{name} {deltas[name]:+.3f}"
        row["note"] = ""
        rows.append(row)
    return rows


CSV_COLUMNS = ["run_id", "model", "precision", "batch", "peak_ratio", "device_ratio", "peak_a_bytes", "peak_b_bytes",
               "device_a_bytes", "device_b_bytes", "reserved_ratio", "activation_ratio", "flops_ratio",
               "kernels_ratio", "largest_feature_change", "note", "stack_a", "stack_b"]


def write_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """The rows of :func:`compare_replays` as CSV (ratios to 4 decimals, bytes as integers)."""
    def cell(key: str, value: Any) -> Any:
        if isinstance(value, float) and key.endswith("_ratio"):
            return f"{value:.4f}"
        if isinstance(value, float) and key.endswith("_bytes"):
            return f"{value:.0f}"
        return value

    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: cell(k, row.get(k, "")) for k in CSV_COLUMNS})


def summary(rows: list[dict[str, Any]], a: dict[str, Any], b: dict[str, Any], threshold: float) -> str:
    """The comparison as text: the two stacks, then the differing runs grouped by model with the range of
    their ratios, then the runs replayed in one stack only."""
    lines = [f"A: {stack_label(a['versions'])} ({len(a['runs'])} runs replayed, {len(a.get('failed', []))} failed)",
             f"B: {stack_label(b['versions'])} ({len(b['runs'])} runs replayed, {len(b.get('failed', []))} failed)"]
    paired = len({r["run_id"] for r in a["runs"]} & {r["run_id"] for r in b["runs"]})
    differing = [r for r in rows if not r["note"]]
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in differing:
        by_model[r["model"]].append(r)
    lines.append(f"{len(differing)} of {paired} runs replayed in both differ by more than {threshold:.1%} "
                 f"(allocator peak or device memory, ratio B / A), {len(by_model)} models:")

    def span(values: list[float]) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.3f}" if abs(hi - lo) < 5e-4 else f"{lo:.3f}-{hi:.3f}"

    order = sorted(by_model, key=lambda m: -max(abs(math.log(max(r["peak_ratio"], 1e-12))) for r in by_model[m]))
    for model in order:
        group = by_model[model]
        runs = ", ".join(f"{r['run_id']} {r['precision']} b{r['batch']}" for r in group)
        lines.append(f"  {model:45s} {len(group):2d} runs  peak x{span([r['peak_ratio'] for r in group])}  "
                     f"device x{span([r['device_ratio'] for r in group])}  ({runs})")
    for r in rows:
        if r["note"]:
            lines.append(f"  {r['run_id']} {r['model']}: {r['note']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_skew.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run `replay` in each environment (its own python), then `compare`.")
    sub = parser.add_subparsers(dest="mode", required=True)
    rp = sub.add_parser("replay", help="replay every training run of an h200-profiles directory here")
    rp.add_argument("--data", required=True, help="a directory laid out like datasets/h200-profiles")
    rp.add_argument("--out", required=True, help="the JSON file to write")
    rp.add_argument("--runs", help="comma-separated run ids (default: every ok training run)")
    rp.add_argument("--cache-dir", help="cache replays here (one directory per environment; default: no cache)")
    rp.add_argument("--quiet", action="store_true", help="no line per run on stderr")
    cp = sub.add_parser("compare", help="runs whose replays differ between two `replay` files")
    cp.add_argument("a", help="replays of stack A (e.g. the stack the runs were measured with)")
    cp.add_argument("b", help="replays of stack B; ratios are B / A")
    cp.add_argument("--threshold", type=float, default=0.02,
                    help="relative difference above which a run is listed (default 0.02: 2%%)")
    cp.add_argument("--csv", help="write the listed runs here as CSV")
    args = parser.parse_args(argv)
    if args.mode == "replay":
        run_ids = [r.strip() for r in args.runs.split(",") if r.strip()] if args.runs else None
        doc = replay_runs(args.data, run_ids, args.cache_dir, progress=not args.quiet)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{len(doc['runs'])} runs replayed ({len(doc['failed'])} failed) with "
              f"{stack_label(doc['versions'])}: {args.out}")
        return 0
    if args.threshold < 0:
        parser.error(f"--threshold {args.threshold}: must be >= 0")
    a, b = load_replays(args.a), load_replays(args.b)
    rows = compare_replays(a, b, args.threshold)
    print(summary(rows, a, b, args.threshold))
    if args.csv:
        write_csv(rows, args.csv)
        print(f"{len(rows)} rows: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
