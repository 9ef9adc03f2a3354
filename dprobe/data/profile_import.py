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

Every column of what is added is checked (numbers where numbers belong, in their ranges: a batch of
at least 1, memory and times that are not negative, utilisation 0-100 %; the known kinds, statuses,
precisions and phases; JSON objects), and the grown data set is loaded, as training loads it, from a
copy in a temporary folder. Only then is it swapped in, in one rename: the data set's ``runs.csv``,
``samples.csv``, ``steps.csv`` and ``env.json`` are symbolic links into ``.versions/current``, itself a
link to the folder of one complete version; the grown set is moved into ``.versions`` beside it and
``current`` is pointed at it by ``os.replace``; then the links become plain files again, one at a time
(each already the new set's) and ``.versions`` goes, so a data set in a git checkout shows only its grown
files. Killed at any moment, the data set is the old one or the new one, never a mix; what the killed addition left (``.adding-*`` staging folders, versions no longer
current) is removed by the next addition. A data set of plain files is first turned into this layout
without changing what its files hold. On a file system without symbolic links the files are replaced
one by one, ``runs.csv`` first (a failure puts back the ones already moved; the mix a kill can leave
there is refused by the loader, :func:`~dprobe.data.h200.check_one_state`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from dprobe.core.names import OPTIMIZERS, PRECISIONS
from dprobe.data.common import (
    COUNT,
    NON_NEGATIVE,
    PERCENT,
    POSITIVE_COUNT,
    TIMESTAMP,
    DatasetError,
    Range,
    check_range,
)
from dprobe.data.h200 import (
    RUN_RANGES,
    SAMPLE_RANGES,
    STEP_RANGES,
    check_gpu_entry,
    load_h200_profiles,
    read_env,
)

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
DATA_FILES = ("runs.csv", "samples.csv", "steps.csv", "env.json")  # one version of a data set, swapped whole
VERSIONS, CURRENT = ".versions", "current"  # data_dir/runs.csv -> .versions/current/runs.csv; current -> a version
STAGING = ".adding-"  # the prefix of what an addition writes before it is swapped in

# what each column of an added collection may hold; a blank cell is a missing value, allowed unless required
ADD_RUN_RANGES = {
    **{k: v for k, v in RUN_RANGES.items() if k != "collection"}, "generate": POSITIVE_COUNT,
    "buffer_bytes": COUNT, "flops_per_step": NON_NEGATIVE, "flops_per_sample": NON_NEGATIVE, "steps": COUNT,
    "samples_per_s": NON_NEGATIVE, "nvml_mem_util_pct_mean_2nd_half": PERCENT,
    "nvml_power_w_mean_2nd_half": NON_NEGATIVE, "served": COUNT,
}
ADD_SAMPLE_RANGES = {**{k: v for k, v in SAMPLE_RANGES.items() if k != "collection"}, "epoch": TIMESTAMP,
                     "temp_c": Range()}
ADD_STEP_RANGES = {**{k: v for k, v in STEP_RANGES.items() if k != "collection"}, "queue": COUNT}
RUN_CHOICES = {"kind": ("train", "serve", "colocated"), "status": ("ok", "oom", "error"),
               "precision": PRECISIONS, "optimizer": OPTIMIZERS}
STEP_CHOICES = {"phase": ("warmup", "train", "eval", "serve")}
FLAGS = ("true", "false", "1", "0", "1.0", "0.0")  # what dprobe.data.h200 reads as a boolean setting
RUN_REQUIRED = ("kind", "status", "lib", "model", "batch", "precision", "t_begin", "t_end")
SAMPLE_REQUIRED = ("t", "label")
STEP_REQUIRED = ("run_id", "step", "phase", "t_start", "t_end", "batch")


@dataclass
class Session:
    """One collector session, read and checked."""

    source: Path
    runs: list[dict[str, Any]]
    samples: pd.DataFrame
    steps: pd.DataFrame
    env: dict[str, Any]
    run_lines: list[int] = field(default_factory=list)  # the line of runs.jsonl each run is on


def read_session(source: str | Path) -> Session:
    """Read a collector output folder; a clear :class:`DatasetError` for what is missing or malformed."""
    source = Path(source)
    if not source.is_dir():
        raise DatasetError(f"{source}: no such folder (expected the OUT folder of tools/collect_gpu_profiles.py)")
    for name in ("runs.jsonl", "samples.csv", "steps.csv", "env.json"):
        if not (source / name).is_file():
            raise DatasetError(f"{source}: missing {name}; is this a folder written by tools/collect_gpu_profiles.py?")
    runs: list[dict[str, Any]] = []
    lines: list[int] = []
    seen: dict[str, int] = {}
    for n, line in enumerate((source / "runs.jsonl").read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{source / 'runs.jsonl'}: line {n} is not JSON ({exc})") from exc
        if not isinstance(rec, dict) or not RUN_ID.match(str(rec.get("run_id", ""))):
            raise DatasetError(f"{source / 'runs.jsonl'}: line {n} has no run_id like r000, s00 or p00a")
        if str(rec["run_id"]) in seen:
            raise DatasetError(f"{source / 'runs.jsonl'}: line {n} repeats run {rec['run_id']} of line "
                               f"{seen[str(rec['run_id'])]}")
        seen[str(rec["run_id"])] = n
        runs.append(rec)
        lines.append(n)
    if not runs:
        raise DatasetError(f"{source / 'runs.jsonl'}: no runs")
    try:
        env = json.loads((source / "env.json").read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{source / 'env.json'}: not JSON ({exc})") from exc
    if not isinstance(env, dict):
        raise DatasetError(f"{source / 'env.json'}: expected a JSON object (the session's device, GPU, versions)")
    if env.get("device") != "cuda" or not env.get("gpu"):
        raise DatasetError(f"{source / 'env.json'}: the session ran on {env.get('device', 'no device')!r}, not a "
                           "GPU (a --dry-run has no NVML or allocator measurements to add)")
    check_gpu_entry(env, str(source / "env.json"))
    samples = _read_table(source / "samples.csv", SAMPLE_FIELDS)
    steps = [_read_table(source / "steps.csv", STEP_FIELDS)]
    if (source / "steps_pairs.csv").is_file():
        steps.append(_read_table(source / "steps_pairs.csv", STEP_FIELDS))
    check_table(source / "samples.csv", samples, ADD_SAMPLE_RANGES, SAMPLE_REQUIRED, json_columns=("procs",))
    for path, table in zip(("steps.csv", "steps_pairs.csv"), steps, strict=False):
        check_table(source / path, table, ADD_STEP_RANGES, STEP_REQUIRED, choices=STEP_CHOICES)
        _check_order(source / path, table, "t_start", "t_end")
    return Session(source, runs, samples, pd.concat(steps, ignore_index=True), env, lines)


def check_table(path: Path, table: pd.DataFrame, ranges: Mapping[str, Range], required: Collection[str] = (),
                choices: Mapping[str, Sequence[str]] | None = None, flags: Collection[str] = (),
                json_columns: Collection[str] = (), where: str = "row {row}", rows: Sequence[int] | None = None
                ) -> None:
    """Check every cell of a table kept as text (blank: missing): a :class:`DatasetError` naming ``path``, the
    column and the row (``where``, with ``rows`` as in :func:`~dprobe.data.common.check_range`) of the first
    that is blank where ``required``, not a number in its ``ranges``, not one of its ``choices``, not a
    boolean (``flags``) or not a JSON object (``json_columns``)."""
    choices = choices or {}

    def at(i: int) -> str:
        return where.format(row=rows[i] if rows is not None else i + 2)

    for column in table.columns:
        text = table[column].astype(str).str.strip()
        blank = (text == "").to_numpy()
        if column in required and blank.any():
            raise DatasetError(f"{path}: column {column!r} has no value at {at(int(blank.argmax()))}")
        if column in ranges:
            values = pd.to_numeric(text.where(~blank), errors="coerce")
            bad = (values.isna().to_numpy() & ~blank)
            if bad.any():
                i = int(bad.argmax())
                raise DatasetError(f"{path}: column {column!r} must be numeric; {at(i)} has {text.iloc[i]!r}")
            check_range(path, column, values.reset_index(drop=True), ranges[column], where, rows)
        allowed = choices.get(column) or (FLAGS if column in flags else None)
        if allowed is not None:
            bad = ~blank & ~text.str.lower().isin(allowed).to_numpy()
            if bad.any():
                i = int(bad.argmax())
                raise DatasetError(f"{path}: column {column!r} must be one of {', '.join(allowed)}; {at(i)} has "
                                   f"{text.iloc[i]!r}")
        if column in json_columns:
            for i, cell in enumerate(text):
                if cell and not _json_object(cell):
                    raise DatasetError(f"{path}: column {column!r} must be a JSON object; {at(i)} has {cell!r}")


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _check_order(path: Path, table: pd.DataFrame, start: str, end: str, where: str = "row {row}",
                 rows: Sequence[int] | None = None) -> None:
    """A :class:`DatasetError` where ``end`` comes before ``start`` (both given)."""
    t0, t1 = (pd.to_numeric(table[c], errors="coerce").to_numpy() for c in (start, end))
    bad = t1 < t0
    if bad.any():
        i = int(bad.argmax())
        raise DatasetError(f"{path}: column {end!r} must not be before {start!r}; "
                           f"{where.format(row=rows[i] if rows is not None else i + 2)} has {t1[i]:g} < {t0[i]:g}")


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


def _tenant(run_id: str) -> str:
    """The tenant letter of a pair's run id (``p00a``: ``a``; ``""`` for any other run); a DatasetError for an
    id unlike r000, s00 or p00a."""
    m = RUN_ID.match(run_id)
    if m is None:
        raise DatasetError(f"run id {run_id!r} is not like r000, s00 or p00a")
    return m["tenant"]


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
    tenant = bool(_tenant(str(rec["run_id"])))
    row = {f: _cell(rec.get(f)) for f in RUNS_FIELDS}
    row.update(collection=str(collection), run_id=run_id, kind="colocated" if tenant else _cell(rec.get("kind")),
               optimizer=_cell(rec.get("optimizer") or (rec.get("optim") if rec.get("kind") == "train" else None)))
    if len(samples):
        numeric = samples.apply(pd.to_numeric, errors="coerce")
        half = numeric.iloc[len(numeric) // 2:]
        peak = numeric["mem_used_bytes"].max()
        row["nvml_peak_used_bytes"] = "" if math.isnan(peak) else _cell(int(peak))
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
    ``dry_run``: check and summarise, write nothing. Two additions to one data set never interleave: the
    second waits for nothing and is refused (:func:`_adding_to`), so neither run numbers nor rows collide.
    What an earlier addition killed before it finished left behind is removed first (:func:`clean_stale`).
    """
    data_dir = Path(data_dir)
    if dry_run or not data_dir.is_dir():
        return _add_collection(source, data_dir, note, dry_run)
    with _adding_to(data_dir):
        clean_stale(data_dir)
        return _add_collection(source, data_dir, note, dry_run)


@contextlib.contextmanager
def _adding_to(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``data_dir`` itself (no lock file left behind) while an addition
    reads, grows and swaps in its files; a :class:`DatasetError` if another addition holds it."""
    try:
        import fcntl
    except ImportError:  # not a Unix: no locking
        yield
        return
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DatasetError(f"{data_dir}: another `dprobe profiles add` is adding to it now; run this one "
                               "again when it has finished (nothing was changed)") from exc
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _add_collection(source: str | Path, data_dir: Path, note: str, dry_run: bool) -> dict[str, Any]:
    """:func:`add_collection`'s work, with the lock held where it writes."""
    session = read_session(source)
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
    existing = _read_table(paths["runs"], ["collection", "run_id"])
    env_path = data_dir / "env.json"
    env = read_env(data_dir)
    check_table(paths["runs"], existing[["collection"]], {"collection": POSITIVE_COUNT})
    numbers = [int(float(c)) for c in existing["collection"] if c.strip()] + [
        int(k.split("_")[1]) for k in env if re.fullmatch(r"collection_\d+", k)]
    collection = max(numbers, default=0) + 1
    mapping = renumber([str(r["run_id"]) for r in session.runs], list(existing["run_id"]))

    by_label = dict(list(session.samples.groupby("label")))
    runs_out = []
    for rec in session.runs:
        rid = str(rec["run_id"])
        tenant = _tenant(rid)
        label = rid[: -len(tenant)] if tenant else rid  # a pair's tenants share their pair's samples
        runs_out.append(run_row(rec, collection, mapping[rid], by_label.get(label, session.samples.iloc[:0])))
    lines = session.run_lines or list(range(1, len(session.runs) + 1))
    runs_table = pd.DataFrame(runs_out, columns=RUNS_FIELDS).drop(columns=["collection", "run_id"])
    check_table(session.source / "runs.jsonl", runs_table, ADD_RUN_RANGES, RUN_REQUIRED, choices=RUN_CHOICES,
                flags=("phases", "cudnn_benchmark"), json_columns=("config_kwargs", "load"), where="line {row}",
                rows=lines)
    _check_order(session.source / "runs.jsonl", runs_table, "t_begin", "t_end", "line {row}", lines)
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
    env[f"collection_{collection}"] = {
        **session.env, "source": str(session.source.resolve()), "note": note,
        "added": datetime.now(UTC).isoformat(timespec="seconds"), "run_ids": summary["renamed"]}
    new_text = {
        "runs.csv": _csv_text(runs_out, headers["runs"]),
        "samples.csv": _csv_text(samples.to_dict("records"), headers["samples"]),
        "steps.csv": _csv_text(steps.to_dict("records"), headers["steps"]),
    }
    # the grown data set, staged beside the original (a dry run: in the system's temporary folder), locked
    # while this addition lives so that no other one takes it for a killed addition's leftovers
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=None if dry_run else data_dir))
    held = _try_lock(staging)
    try:
        for name, text in new_text.items():
            _append_copy(data_dir / name, staging / name, text)
        (staging / "env.json").write_text(json.dumps(env, indent=1) + "\n")
        if env_path.is_file():
            shutil.copymode(env_path, staging / "env.json")
        try:
            load_h200_profiles(staging)  # as training loads it
        except Exception as exc:  # noqa: BLE001 - whatever refuses to load, the data set stays as it was
            message = str(exc).replace(str(staging), str(data_dir))
            raise DatasetError(f"{data_dir}: adding {session.source} would leave a data set that does not load "
                               f"({type(exc).__name__}: {message}); nothing was changed") from exc
        if not dry_run:
            _commit(staging, data_dir, collection)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if held is not None:
            os.close(held)
    return summary


def _append_copy(original: Path, copy: Path, text: str) -> None:
    """``copy``: ``original`` (same bytes, same mode) with ``text`` appended on a line of its own."""
    shutil.copyfile(original, copy)
    shutil.copymode(original, copy)
    with copy.open("rb+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(text.encode("utf-8"))


def _swap_in(staging: Path, names: list[str], data_dir: Path) -> None:
    """Move each staged file over its namesake in ``data_dir`` (``os.replace``: atomic, same file system);
    should one move fail, the ones already made are undone from links to the originals, so the data set is
    either all new or all as it was."""
    before: dict[str, Path | None] = {}
    for name in names:
        target = data_dir / name
        if not target.exists():
            before[name] = None
            continue
        before[name] = kept = staging / f"{name}.before"
        try:
            os.link(target, kept)
        except OSError:  # a file system without hard links
            shutil.copy2(target, kept)
    done: list[str] = []
    try:
        for name in names:
            os.replace(staging / name, data_dir / name)
            done.append(name)
    except OSError:
        for name in reversed(done):
            backup = before[name]
            if backup is None:
                (data_dir / name).unlink(missing_ok=True)
            else:
                os.replace(backup, data_dir / name)
        raise


def _commit(staging: Path, data_dir: Path, collection: int) -> None:
    """Make the files staged in ``staging`` (all of :data:`DATA_FILES`) the data set's in one rename: the
    staging folder becomes a version in ``.versions`` and ``.versions/current`` is pointed at it
    (``os.replace`` of a link); the version it replaces is removed. Without symbolic links, :func:`_swap_in`."""
    if not _adopt(data_dir, collection - 1):
        _swap_in(staging, list(DATA_FILES), data_dir)
        return
    versions = data_dir / VERSIONS
    for name in DATA_FILES:
        _fsync(staging / name)
    os.chmod(staging, _dir_mode(data_dir))
    version = versions / f"collection-{collection}-{staging.name.removeprefix(STAGING)}"
    os.rename(staging, version)
    _point(versions, version.name)  # the swap
    _prune(versions)
    _materialize(data_dir)


def _materialize(data_dir: Path) -> None:
    """Turn the data set's links back into plain files, one at a time (each a hard link, else a copy, of the
    current version's file renamed over its link: every step shows the new set), then remove
    ``.versions``: a data set in a git checkout stays plain files, with nothing untracked beside them. A
    kill part-way leaves links and plain files that all show the new set; the next addition lays it out
    again."""
    versions = data_dir / VERSIONS
    current = _current(versions)
    if current is None:
        return
    for name in DATA_FILES:
        if not _linked(data_dir, name) or not (versions / current / name).is_file():
            continue
        plain = data_dir / f"{STAGING}{uuid.uuid4().hex}"
        try:
            os.link(versions / current / name, plain)
        except OSError:
            shutil.copy2(versions / current / name, plain)
        os.replace(plain, data_dir / name)
    _fsync(data_dir)
    shutil.rmtree(versions, ignore_errors=True)


def _adopt(data_dir: Path, collection: int) -> bool:
    """Turn the data set into the versioned layout, what its files hold unchanged at every step: its files
    are linked (hard links, else copies) into a version, ``current`` points there, then each file is
    replaced by a link through ``current``. Already so laid out: nothing to do. False, with nothing
    changed, where the file system has no symbolic links."""
    versions = data_dir / VERSIONS
    if _current(versions) is not None and all(_linked(data_dir, name) for name in DATA_FILES):
        return True
    made = not versions.is_dir()
    if made:
        versions.mkdir()
        os.chmod(versions, _dir_mode(data_dir))
    probe = versions / f"{STAGING}{uuid.uuid4().hex}"
    try:
        os.symlink(CURRENT, probe)
    except (OSError, NotImplementedError):
        if made:
            versions.rmdir()
        return False
    probe.unlink()
    snapshot = Path(tempfile.mkdtemp(prefix=STAGING, dir=versions))
    for name in DATA_FILES:
        if (data_dir / name).is_file():  # an absent env.json stays absent: its link leads nowhere
            held = (data_dir / name).resolve()  # what a link shows (os.link would link the link itself)
            try:
                os.link(held, snapshot / name)
            except OSError:
                shutil.copy2(held, snapshot / name)
            _fsync(snapshot / name)
    os.chmod(snapshot, _dir_mode(data_dir))
    version = versions / f"collection-{collection}-{snapshot.name.removeprefix(STAGING)}"
    os.rename(snapshot, version)
    _point(versions, version.name)
    for name in DATA_FILES:
        if not _linked(data_dir, name):
            link = data_dir / f"{STAGING}{uuid.uuid4().hex}"
            os.symlink(f"{VERSIONS}/{CURRENT}/{name}", link)
            os.replace(link, data_dir / name)
    _fsync(data_dir)
    return True


def _linked(data_dir: Path, name: str) -> bool:
    """Whether ``data_dir/name`` is the link through ``.versions/current`` that :func:`_adopt` makes."""
    path = data_dir / name
    return path.is_symlink() and os.readlink(path) == f"{VERSIONS}/{CURRENT}/{name}"


def _current(versions: Path) -> str | None:
    """The name of the version ``versions/current`` points to, if it is a link to a folder in ``versions``."""
    link = versions / CURRENT
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    return target if "/" not in target and (versions / target).is_dir() else None


def _point(versions: Path, name: str) -> None:
    """Point ``versions/current`` at the version ``name``: a new link renamed over the old (atomic)."""
    link = versions / f"{STAGING}{uuid.uuid4().hex}"
    os.symlink(name, link)
    os.replace(link, versions / CURRENT)
    _fsync(versions)


def _prune(versions: Path) -> list[Path]:
    """Remove everything in ``versions`` but ``current`` and the version it points to (everything, if it
    points to none)."""
    target = _current(versions)
    keep = {CURRENT, target} if target else set()
    removed = []
    for path in sorted(versions.iterdir()):
        if path.name not in keep:
            _remove(path)
            removed.append(path)
    return removed


def clean_stale(data_dir: str | Path) -> list[Path]:
    """Remove what additions killed before they finished left in ``data_dir`` (its lock held, so no other
    addition is under way): ``.adding-*`` staging folders and links, and in ``.versions`` every version
    ``current`` does not point to (all of it where none of the data set's files links through it). A
    staging folder that a live process still holds locked is kept. Returns what was removed."""
    data_dir = Path(data_dir)
    removed = []
    for path in sorted(data_dir.glob(f"{STAGING}*")):
        folder = path.is_dir() and not path.is_symlink()
        fd = _try_lock(path) if folder else None
        if folder and fd is None and _lockable():
            continue  # locked: an addition that is still running
        try:
            _remove(path)
        finally:
            if fd is not None:
                os.close(fd)
        removed.append(path)
    versions = data_dir / VERSIONS
    if versions.is_dir() and not versions.is_symlink() and (
            _current(versions) is not None or not any(_linked(data_dir, name) for name in DATA_FILES)):
        removed += _prune(versions)
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _lockable() -> bool:
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return True


def _try_lock(folder: Path) -> int | None:
    """An open descriptor of ``folder`` holding an exclusive lock on it; None if another process holds it
    (or there are no locks)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a folder's entries) to disk, where the system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _dir_mode(data_dir: Path) -> int:
    return data_dir.stat().st_mode & 0o7777
