"""Adding a collection made by ``tools/collect_gpu_profiles.py`` to a profiles data set.

The collector writes one folder per session on a GPU (``runs.jsonl``, ``samples.csv``, ``steps.csv``,
``steps_pairs.csv`` where it ran co-located pairs, ``env.json``); a data set laid out like
``datasets/h200-profiles`` holds many such sessions side by side, told apart by a ``collection``
column. :func:`add_collection` appends one session as the next collection:

- run ids are renumbered after the data set's own (``r000`` may become ``r089``; the co-located pair
  ``p00`` with its tenants ``p00a`` / ``p00b`` likewise), in runs, samples and steps alike;
- the NVML columns of ``runs.csv`` are derived from the session's samples as the data set's README
  defines them (peak used memory over the run, means over the second half of its samples);
- ``env.json`` gains ``collection_N``: the session's GPU and library versions, and its provenance
  (where it came from, when it was added, a note, the renumbering).

Nothing is written until everything has been read and checked; the files are then replaced whole,
so a failure leaves the data set as it was.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from dprobe.data.common import DatasetError
from dprobe.data.h200 import read_env

RUNS_FIELDS = [
    "collection", "run_id", "kind", "status", "lib", "model", "config", "arch", "config_kwargs", "task", "image",
    "seq", "vocab", "generate", "batch", "precision", "optimizer", "phases", "cudnn_benchmark", "params",
    "param_bytes", "buffer_bytes", "flops_per_step", "flops_per_sample", "steps", "step_time_median_s",
    "samples_per_s", "peak_alloc_bytes", "peak_reserved_bytes", "nvml_peak_used_bytes",
    "nvml_gpu_util_pct_mean_2nd_half", "nvml_mem_util_pct_mean_2nd_half", "nvml_power_w_mean_2nd_half",
    "served", "load", "t_begin", "t_end", "error",
]
SAMPLE_FIELDS = ["t", "epoch", "label", "gpu_util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes",
                 "power_w", "sm_clock_mhz", "temp_c", "procs"]
STEP_FIELDS = ["run_id", "step", "phase", "t_start", "t_end", "batch", "queue", "alloc_bytes", "reserved_bytes",
               "peak_alloc_bytes"]
# (column, sample field, decimals): the NVML means of runs.csv, over the second half of a run's samples
SECOND_HALF_MEANS = [("nvml_gpu_util_pct_mean_2nd_half", "gpu_util_pct", 2),
                     ("nvml_mem_util_pct_mean_2nd_half", "mem_util_pct", 2),
                     ("nvml_power_w_mean_2nd_half", "power_w", 1)]
RUN_ID = re.compile(r"^(?P<prefix>[a-z]+)(?P<number>\d+)(?P<tenant>[a-z]?)$")


@dataclass
class Session:
    """One collector session, read and checked."""

    source: Path
    runs: list[dict[str, Any]]
    samples: pd.DataFrame
    steps: pd.DataFrame
    env: dict[str, Any]


def read_session(source: str | Path) -> Session:
    """Read a collector output folder; a clear :class:`DatasetError` for what is missing or malformed."""
    source = Path(source)
    if not source.is_dir():
        raise DatasetError(f"{source}: no such folder (expected the OUT folder of tools/collect_gpu_profiles.py)")
    for name in ("runs.jsonl", "samples.csv", "steps.csv", "env.json"):
        if not (source / name).is_file():
            raise DatasetError(f"{source}: missing {name}; is this a folder written by tools/collect_gpu_profiles.py?")
    runs = []
    for n, line in enumerate((source / "runs.jsonl").read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{source / 'runs.jsonl'}: line {n} is not JSON ({exc})") from exc
        if not isinstance(rec, dict) or not RUN_ID.match(str(rec.get("run_id", ""))):
            raise DatasetError(f"{source / 'runs.jsonl'}: line {n} has no run_id like r000, s00 or p00a")
        runs.append(rec)
    if not runs:
        raise DatasetError(f"{source / 'runs.jsonl'}: no runs")
    try:
        env = json.loads((source / "env.json").read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{source / 'env.json'}: not JSON ({exc})") from exc
    if env.get("device") != "cuda" or not env.get("gpu"):
        raise DatasetError(f"{source / 'env.json'}: the session ran on {env.get('device', 'no device')!r}, not a "
                           "GPU (a --dry-run has no NVML or allocator measurements to add)")
    samples = _read_table(source / "samples.csv", SAMPLE_FIELDS)
    steps = [_read_table(source / "steps.csv", STEP_FIELDS)]
    if (source / "steps_pairs.csv").is_file():
        steps.append(_read_table(source / "steps_pairs.csv", STEP_FIELDS))
    return Session(source, runs, samples, pd.concat(steps, ignore_index=True), env)


def _read_table(path: Path, fields: list[str]) -> pd.DataFrame:
    """A CSV kept as text (values are copied, not reformatted), with its columns checked."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable CSV ({exc})") from exc
    missing = [f for f in fields if f not in frame.columns]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame[fields]


def renumber(run_ids: list[str], taken: list[str]) -> dict[str, str]:
    """New ids for ``run_ids`` that follow ``taken`` per prefix (r, s, p); a pair's tenants follow their pair."""
    last: dict[str, int] = {}
    for rid in taken:
        m = RUN_ID.match(rid)
        if m:
            last[m["prefix"]] = max(last.get(m["prefix"], -1), int(m["number"]))
    base: dict[tuple[str, str], str] = {}  # (prefix, number) -> new stem
    mapping = {}
    for rid in run_ids:
        m = RUN_ID.match(rid)
        if m is None:
            raise DatasetError(f"run id {rid!r} is not like r000, s00 or p00a")
        key = (m["prefix"], m["number"])
        if key not in base:
            last[m["prefix"]] = last.get(m["prefix"], -1) + 1
            base[key] = f"{m['prefix']}{last[m['prefix']]:0{len(m['number'])}d}"
        mapping[f"{m['prefix']}{m['number']}"] = base[key]
        mapping[rid] = base[key] + m["tenant"]
    return mapping


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True) if value else ""
    return str(value)


def run_row(rec: dict[str, Any], collection: int, run_id: str, samples: pd.DataFrame) -> dict[str, str]:
    """One ``runs.csv`` row of a collector record; NVML columns from the run's ``samples`` (its label's)."""
    tenant = bool(RUN_ID.match(str(rec["run_id"]))["tenant"])
    row = {f: _cell(rec.get(f)) for f in RUNS_FIELDS}
    row.update(collection=str(collection), run_id=run_id, kind="colocated" if tenant else _cell(rec.get("kind")),
               optimizer=_cell(rec.get("optimizer") or (rec.get("optim") if rec.get("kind") == "train" else None)))
    if len(samples):
        numeric = samples.apply(pd.to_numeric, errors="coerce")
        half = numeric.iloc[len(numeric) // 2:]
        row["nvml_peak_used_bytes"] = _cell(int(numeric["mem_used_bytes"].max()))
        for column, field, decimals in SECOND_HALF_MEANS:
            mean = half[field].mean()
            row[column] = "" if math.isnan(mean) else f"{round(float(mean), decimals)}"
    return row


def _csv_text(rows: list[dict[str, str]], fields: list[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, restval="", extrasaction="ignore", lineterminator="\n")
    writer.writerows(rows)
    return out.getvalue()


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


def add_collection(source: str | Path, data_dir: str | Path, note: str = "", dry_run: bool = False
                   ) -> dict[str, Any]:
    """Append the collector session ``source`` to the data set ``data_dir`` as its next collection.

    Returns a summary: the collection number, the GPU, runs added by kind and status, the renumbering.
    ``dry_run``: check and summarise, write nothing.
    """
    session = read_session(source)
    data_dir = Path(data_dir)
    paths = {name: data_dir / f"{name}.csv" for name in ("runs", "samples", "steps")}
    for path in paths.values():
        if not path.is_file():
            raise DatasetError(f"{data_dir}: missing {path.name} (expected a folder laid out like "
                               "datasets/h200-profiles)")
    headers = {name: _header(path) for name, path in paths.items()}
    for name, fields in (("runs", ["collection", "run_id"]), ("samples", ["collection", *SAMPLE_FIELDS]),
                         ("steps", ["collection", *STEP_FIELDS])):
        missing = [f for f in fields if f not in headers[name]]
        if missing:
            raise DatasetError(f"{paths[name]}: missing column(s) {', '.join(missing)}")
    existing = pd.read_csv(paths["runs"], dtype=str, keep_default_na=False)
    env_path = data_dir / "env.json"
    env = read_env(data_dir)
    numbers = [int(c) for c in existing["collection"] if c.strip()] + [
        int(k.split("_")[1]) for k in env if re.fullmatch(r"collection_\d+", k)]
    collection = max(numbers, default=0) + 1
    mapping = renumber([str(r["run_id"]) for r in session.runs], list(existing["run_id"]))

    by_label = dict(list(session.samples.groupby("label")))
    runs_out = []
    for rec in session.runs:
        rid = str(rec["run_id"])
        tenant = RUN_ID.match(rid)["tenant"]
        label = rid[: -len(tenant)] if tenant else rid  # a pair's tenants share their pair's samples
        runs_out.append(run_row(rec, collection, mapping[rid], by_label.get(label, session.samples.iloc[:0])))
    samples = session.samples.copy()
    samples["label"] = samples["label"].map(lambda v: mapping.get(v, v))
    steps = session.steps.copy()
    unknown = sorted(set(steps["run_id"]) - set(mapping))
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise DatasetError(f"{session.source}: steps.csv has steps of run(s) {', '.join(unknown[:5])}{more} that "
                           "runs.jsonl does not list")
    steps["run_id"] = steps["run_id"].map(mapping)
    samples.insert(0, "collection", str(collection))
    steps.insert(0, "collection", str(collection))

    kinds: dict[str, int] = {}
    for row in runs_out:
        kinds[f"{row['kind']} {row['status']}"] = kinds.get(f"{row['kind']} {row['status']}", 0) + 1
    summary = {"collection": collection, "gpu": session.env["gpu"], "source": str(session.source),
               "runs": kinds, "samples": len(samples), "steps": len(steps),
               "renamed": {old: new for old, new in mapping.items() if old != new and old in
                           {str(r["run_id"]) for r in session.runs}}}
    if dry_run:
        return summary
    env[f"collection_{collection}"] = {
        **session.env, "source": str(session.source.resolve()), "note": note,
        "added": datetime.now(UTC).isoformat(timespec="seconds"), "run_ids": summary["renamed"]}
    new_text = {
        paths["runs"]: _csv_text(runs_out, headers["runs"]),
        paths["samples"]: _csv_text(samples.to_dict("records"), headers["samples"]),
        paths["steps"]: _csv_text(steps.to_dict("records"), headers["steps"]),
    }
    staged = []
    try:
        for path, text in new_text.items():
            tmp = path.with_name(f".{path.name}.adding")
            old = path.read_text()
            tmp.write_text(old + ("" if old.endswith("\n") else "\n") + text)
            staged.append((tmp, path))
        tmp = env_path.with_name(".env.json.adding")
        tmp.write_text(json.dumps(env, indent=1) + "\n")
        staged.append((tmp, env_path))
    except OSError:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return summary
