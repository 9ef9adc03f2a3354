"""Growing a profiles data set with a collector session, and training on runs from other GPUs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dprobe.cli import main
from dprobe.data import DatasetError, load_h200_profiles
from dprobe.data.profile_import import add_collection, renumber

SRC = Path(__file__).resolve().parent.parent / "datasets" / "h200-profiles"


def as_session(collection: int, out: Path, gpu: str | None = None, only: set[str] | None = None) -> Path:
    """One collection of the bundled data set (``only`` these runs) written back the way the collector
    writes a session."""
    out.mkdir(parents=True)
    runs = pd.read_csv(SRC / "runs.csv", dtype=str, keep_default_na=False)
    runs = runs[(runs["collection"] == str(collection)) & (runs["run_id"].isin(only) if only else True)]
    with (out / "runs.jsonl").open("w") as f:
        for _, row in runs.iterrows():
            rec = {k: v for k, v in row.items() if v != "" and k != "collection" and not k.startswith("nvml_")}
            rec["kind"] = "train" if rec["kind"] == "colocated" else rec["kind"]  # a tenant logs a train run
            f.write(json.dumps(rec) + "\n")
    for name in ("samples", "steps"):
        table = pd.read_csv(SRC / f"{name}.csv", dtype=str, keep_default_na=False)
        table = table[table["collection"] == str(collection)].drop(columns="collection")
        if only:
            table = table[table["label" if name == "samples" else "run_id"].isin(only)]
        table.to_csv(out / f"{name}.csv", index=False)
    env = json.loads((SRC / "env.json").read_text())[f"collection_{collection}"]
    (out / "env.json").write_text(json.dumps({**env, **({"gpu": gpu} if gpu else {})}))
    return out


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture()
def dataset(tmp_path) -> Path:
    return Path(shutil.copytree(SRC, tmp_path / "profiles"))


def test_renumber_follows_the_data_sets_ids() -> None:
    mapping = renumber(["r000", "r001", "s00", "p00a", "p00b"], ["r000", "r041", "s02", "p00a", "p00b"])
    assert [mapping[k] for k in ("r000", "r001", "s00", "p00a", "p00b", "p00")] == \
        ["r042", "r043", "s03", "p01a", "p01b", "p01"]
    with pytest.raises(DatasetError, match="not like r000"):
        renumber(["run-7"], [])


@pytest.mark.parametrize("collection", [1, 2, 3])
@pytest.mark.slow
def test_a_session_round_trips_into_the_next_collection(dataset, tmp_path, collection) -> None:
    """Written back as a session and added again, a collection's rows come back cell for cell, renumbered."""
    nxt = int(pd.read_csv(dataset / "runs.csv")["collection"].max()) + 1
    session = as_session(collection, tmp_path / "session")
    summary = add_collection(session, dataset, note="round trip")
    assert summary["collection"] == nxt and summary["gpu"] == "NVIDIA H200"
    env = json.loads((dataset / "env.json").read_text())[f"collection_{nxt}"]
    assert env["note"] == "round trip" and env["source"] == str(session.resolve()) and env["torch"]
    back = {new: old for old, new in env["run_ids"].items()}
    back.update({new[:-1]: old[:-1] for old, new in env["run_ids"].items() if old[-1] in "ab"})  # pair labels
    for name, key in (("runs", "run_id"), ("samples", "label"), ("steps", "run_id")):
        table = pd.read_csv(dataset / f"{name}.csv", dtype=str, keep_default_na=False)
        old = table[table["collection"] == str(collection)].drop(columns="collection").reset_index(drop=True)
        new = table[table["collection"] == str(nxt)].drop(columns="collection").reset_index(drop=True)
        assert not set(new[key]) & set(old[key]) - {"idle"}  # every run has an id of its own
        new[key] = new[key].map(lambda v: back.get(v, v))
        pd.testing.assert_frame_equal(old, new)  # the NVML columns derived from the samples included
    loaded = load_h200_profiles(dataset)
    assert loaded.runs["run_id"].is_unique
    assert (loaded.runs["collection"] == nxt).sum() == (loaded.runs["collection"] == collection).sum()
    assert main(["profiles", "list", "--data", str(dataset), "--json"]) == 0


@pytest.mark.slow
def test_bad_sessions_are_refused_and_the_data_set_is_untouched(dataset, tmp_path, capsys) -> None:
    before = digest(dataset)
    session = as_session(2, tmp_path / "session")
    assert main(["profiles", "add", str(session), "--data", str(dataset), "--dry-run"]) == 0
    assert "would add" in capsys.readouterr().out and digest(dataset) == before

    (session / "steps.csv").rename(tmp_path / "steps.csv")
    assert main(["profiles", "add", str(session), "--data", str(dataset)]) == 2
    assert "missing steps.csv" in capsys.readouterr().err
    (tmp_path / "steps.csv").rename(session / "steps.csv")

    lines = (session / "runs.jsonl").read_text().splitlines()
    (session / "runs.jsonl").write_text("\n".join([*lines[:3], "{not json", *lines[3:]]) + "\n")
    with pytest.raises(DatasetError, match="line 4 is not JSON"):
        add_collection(session, dataset)
    (session / "runs.jsonl").write_text("\n".join(lines[1:]) + "\n")  # steps of a run it does not list
    with pytest.raises(DatasetError, match="steps of run"):
        add_collection(session, dataset)
    (session / "runs.jsonl").write_text("\n".join(lines) + "\n")

    env = json.loads((session / "env.json").read_text())
    (session / "env.json").write_text(json.dumps({**env, "device": "cpu"}))  # a --dry-run of the collector
    with pytest.raises(DatasetError, match="not a GPU"):
        add_collection(session, dataset)
    assert digest(dataset) == before

    runs = (dataset / "runs.csv").read_text().splitlines()
    (dataset / "runs.csv").write_text("\n".join([*runs, runs[-1]]) + "\n")  # a run listed twice
    with pytest.raises(DatasetError, match=r"run id\(s\) r\d+ appear more than once"):
        load_h200_profiles(dataset)


def test_training_uses_each_collections_gpu(dataset, tmp_path) -> None:
    """Runs from another GPU are featurised with that GPU's peak FLOP/s and memory; an unknown GPU is named."""
    from dprobe.core.gpus import GPUS, gpu_key
    from dprobe.profiling.coldstart.dataset import load_dataset
    from dprobe.profiling.coldstart.features import FEATURES

    assert [gpu_key(n) for n in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB")] == \
        ["h200", "h100", "a100"]
    small = tmp_path / "small"
    small.mkdir()
    runs = pd.read_csv(dataset / "runs.csv", dtype=str, keep_default_na=False)
    keep = runs[(runs["collection"] == "2") & runs["model"].isin(["squeezenet1_1", "alexnet"])].head(2)
    keep.to_csv(small / "runs.csv", index=False)
    for name in ("samples", "steps"):
        table = pd.read_csv(dataset / f"{name}.csv", dtype=str, keep_default_na=False)
        table[table["collection"] == "2"].to_csv(small / f"{name}.csv", index=False)
    env = json.loads((dataset / "env.json").read_text())
    session = as_session(2, tmp_path / "a100", gpu="NVIDIA A100-SXM4-40GB", only=set(keep["run_id"]))
    (session / "env.json").write_text(json.dumps({**json.loads((session / "env.json").read_text()),
                                                  "gpu_total_bytes": 42298834944}))
    (small / "env.json").write_text(json.dumps({"collection_2": env["collection_2"]}))
    add_collection(session, small)

    ds = load_dataset(str(small), tmp_path / "cache", progress=False)
    assert ds.gpus == ["h200", "h200", "a100", "a100"]
    # the GPU enters through the roofline: the same kernels at the A100's peaks (fp32: 3.2-3.4x the H200's time)
    compute = FEATURES.index("log_t_compute")
    slower = ds.feats[2:, compute] - ds.feats[:2, compute]
    ratios = (GPUS["h200"].peak_flops_tf32 / GPUS["a100"].peak_flops_tf32,
              GPUS["h200"].peak_flops_fp32 / GPUS["a100"].peak_flops_fp32)
    assert (slower >= math.log(min(ratios)) - 1e-6).all() and (slower <= math.log(max(ratios)) + 1e-6).all()
    assert (ds.base[2:, 3] > 2 * ds.base[:2, 3]).all()  # slower GPU, longer roofline step

    env = json.loads((small / "env.json").read_text())
    env["collection_3"]["gpu"] = "NVIDIA RTX 9000"  # a GPU without a spec: its runs are left out, by name
    (small / "env.json").write_text(json.dumps(env))
    ds = load_dataset(str(small), tmp_path / "cache", progress=False)
    assert ds.gpus == ["h200", "h200"] and len(ds.skipped) == 2
    assert re.match(r"run r\d+ \(torchvision:\w+, collection 3\): ValueError: .*'NVIDIA RTX 9000'.*add a GPUSpec",
                    ds.skipped[0])


@pytest.mark.slow
def test_a_run_whose_model_cannot_be_replayed_is_left_out_by_name(dataset, tmp_path, caplog) -> None:
    """One run of a model this install cannot build does not stop training on the others: it is left
    out, logged and listed with its reason; with no run left, the refusal names one."""
    from dprobe.profiling.coldstart.dataset import load_dataset

    small = tmp_path / "small"
    small.mkdir()
    runs = pd.read_csv(dataset / "runs.csv", dtype=str, keep_default_na=False)
    keep = runs[(runs["collection"] == "2") & runs["model"].isin(["squeezenet1_1", "alexnet"])].head(2).copy()
    keep.iloc[0, keep.columns.get_loc("model")] = "no_such_net"
    keep.to_csv(small / "runs.csv", index=False)
    for name in ("samples", "steps", "env"):
        shutil.copy(dataset / f"{name}.{'json' if name == 'env' else 'csv'}", small)
    with caplog.at_level("WARNING", logger="dprobe.profiling.coldstart.dataset"):
        ds = load_dataset(str(small), tmp_path / "cache", progress=False)
    bad, good = keep["run_id"].tolist()
    # the same in worker processes filling the cache: the run that works is cached, the other reported
    pooled = load_dataset(str(small), tmp_path / "cache2", progress=False, workers=2)
    assert pooled.run_ids == ds.run_ids and pooled.skipped == ds.skipped
    np.testing.assert_allclose(pooled.feats, ds.feats)
    assert ds.run_ids == [good] and ds.models == [keep["model"].iloc[1]] and len(ds.feats) == 1
    assert len(ds.skipped) == 1
    assert ds.skipped[0].startswith(f"run {bad} (torchvision:no_such_net, collection 2): GraphError: unknown")
    assert any("1 of 2 runs" in r.getMessage() for r in caplog.records)
    keep.iloc[1, keep.columns.get_loc("model")] = "no_such_net"
    keep.to_csv(small / "runs.csv", index=False)
    with pytest.raises(ValueError, match=rf"no run could be replayed, e.g. run {bad} \(torchvision:no_such_net, "):
        load_dataset(str(small), tmp_path / "cache", progress=False)


@pytest.mark.slow
def test_the_collectors_own_output_is_read(dataset, tmp_path, capsys) -> None:
    """tools/collect_gpu_profiles.py --dry-run (on the CPU: no NVML, no allocator) writes the real format."""
    import os
    import subprocess
    import sys

    out = tmp_path / "session"
    tool = Path(__file__).resolve().parent.parent / "tools" / "collect_gpu_profiles.py"
    subprocess.run([sys.executable, str(tool), "--dry-run", "--no-services", "--no-flops"], check=True,
                   env={**os.environ, "OUT": str(out)}, capture_output=True, timeout=600)
    before = digest(dataset)
    assert main(["profiles", "add", str(out), "--data", str(dataset)]) == 2
    assert "not a GPU" in capsys.readouterr().err and digest(dataset) == before

    env = json.loads((out / "env.json").read_text())
    (out / "env.json").write_text(json.dumps({**env, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}))
    summary = add_collection(out, dataset)
    loaded = load_h200_profiles(dataset)
    new = loaded.runs[loaded.runs["collection"] == summary["collection"]].set_index("model")
    assert sorted(new.index) == ["bert-base", "gpt2", "mobilenet_v2", "resnet18"]
    assert (new["gpu"] == "NVIDIA H100 80GB HBM3").all() and (new["batch"] == 2).all()
    assert new.loc["mobilenet_v2", "optimizer"] == "sgd" and new.loc["bert-base", "optimizer"] == "adamw"
    assert new.loc["gpt2", "precision"] == "bf16" and new.loc["gpt2", "vocab"] == 50257
    assert all(len(loaded.run_steps(rid)) == 2 for rid in new["run_id"])  # two steps each, renumbered


def _edit_session(session: Path, name: str, row: int, column: str, value: object) -> None:
    """Set one cell of a session: a field of the record on line ``row + 1`` of runs.jsonl, or a CSV cell."""
    if name == "runs.jsonl":
        records = [json.loads(line) for line in (session / name).read_text().splitlines()]
        records[row][column] = value
        (session / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        return
    table = pd.read_csv(session / name, dtype=str, keep_default_na=False)
    table.loc[row, column] = value
    table.to_csv(session / name, index=False)


@pytest.mark.parametrize(("name", "row", "column", "value", "message"), [
    ("runs.jsonl", 0, "batch", -8, r"runs\.jsonl: column 'batch' must be a whole number >= 1; line 1 has -8"),
    ("runs.jsonl", 1, "params", "lots", r"runs\.jsonl: column 'params' must be numeric; line 2 has 'lots'"),
    ("runs.jsonl", 1, "batch", 2.5, r"column 'batch' must be a whole number >= 1; line 2 has 2\.5"),
    ("runs.jsonl", 0, "peak_alloc_bytes", -1, r"column 'peak_alloc_bytes' must be a whole number >= 0; line 1"),
    ("runs.jsonl", 0, "step_time_median_s", "Infinity", r"column 'step_time_median_s' must be a number >= 0"),
    ("runs.jsonl", 0, "precision", "fp8", r"column 'precision' must be one of fp32, bf16, fp16, bf16-pure"),
    ("runs.jsonl", 0, "status", "", r"runs\.jsonl: column 'status' has no value at line 1"),
    ("runs.jsonl", 0, "phases", "sometimes", r"column 'phases' must be one of true, false"),
    ("runs.jsonl", 0, "config_kwargs", "[1]", r"column 'config_kwargs' must be a JSON object; line 1 has '\[1\]'"),
    ("runs.jsonl", 0, "t_end", 1.0, r"column 't_end' must not be before 't_begin'; line 1"),
    ("runs.jsonl", 1, "run_id", "r017", r"runs\.jsonl: line 2 repeats run r017 of line 1"),
    ("samples.csv", 3, "gpu_util_pct", "250", r"samples\.csv: column 'gpu_util_pct' must be a number between 0 and "
                                              r"100; row 5 has 250"),
    ("samples.csv", 3, "mem_used_bytes", "-5", r"samples\.csv: column 'mem_used_bytes' must be a number >= 0"),
    ("samples.csv", 3, "t", "1e20", r"samples\.csv: column 't' must be a time in seconds .* row 5 has 1e\+20"),
    ("samples.csv", 3, "procs", "pids", r"samples\.csv: column 'procs' must be a JSON object; row 5 has 'pids'"),
    ("steps.csv", 5, "batch", "-8", r"steps\.csv: column 'batch' must be a whole number >= 1; row 7 has -8"),
    ("steps.csv", 5, "phase", "dance", r"steps\.csv: column 'phase' must be one of warmup, train, eval, serve"),
    ("steps.csv", 5, "alloc_bytes", "x", r"steps\.csv: column 'alloc_bytes' must be numeric; row 7 has 'x'"),
    ("steps.csv", 5, "t_end", "0", r"steps\.csv: column 't_end' must not be before 't_start'; row 7"),
    ("env.json", 0, "gpu_total_bytes", "lots", r"env\.json: 'gpu_total_bytes' must be a number of bytes > 0"),
])
def test_every_column_added_is_checked_and_the_data_set_is_left_as_it_was(dataset, tmp_path, capsys, name, row,
                                                                            column, value, message) -> None:
    session = as_session(2, tmp_path / "session", only={"r017", "r018"})
    if name == "env.json":
        env = json.loads((session / name).read_text())
        (session / name).write_text(json.dumps({**env, column: value}))
    else:
        _edit_session(session, name, row, column, value)
    before = digest(dataset)
    with pytest.raises(DatasetError, match=message):
        add_collection(session, dataset, dry_run=True)
    assert main(["profiles", "add", str(session), "--data", str(dataset)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dprobe profiles: error: ") and re.search(message, err), err
    assert digest(dataset) == before  # byte for byte, and nothing left beside the files


def test_an_addition_the_loader_refuses_leaves_the_data_set_as_it_was(dataset, tmp_path) -> None:
    """The grown data set is loaded from a temporary copy first: if it would not load (here the data set
    itself has a bad cell), nothing is replaced."""
    table = pd.read_csv(dataset / "runs.csv", dtype=str, keep_default_na=False)
    table.loc[3, "seq"] = "long"
    table.to_csv(dataset / "runs.csv", index=False)
    before = digest(dataset)
    session = as_session(2, tmp_path / "session", only={"r017"})
    with pytest.raises(DatasetError, match=rf"{dataset}: adding {session} would leave a data set that does not load "
                                           rf"\(DatasetError: {dataset}/runs\.csv: column 'seq' must be numeric; row 5 "
                                           r"has 'long'\); nothing was changed"):
        add_collection(session, dataset)
    assert digest(dataset) == before


def failing_replace(n: int, calls: list[str]) -> Callable[[str | Path, str | Path], None]:
    """os.replace, recording each target's name in ``calls``, failing at the ``n``-th call (disk full)."""
    real = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        calls.append(Path(dst).name)
        if len(calls) == n:
            raise OSError(28, "No space left on device")
        real(src, dst)
    return replace


def no_links(*args: object, **kwargs: object) -> None:
    raise OSError(1, "Operation not permitted")


def test_a_replacement_that_fails_halfway_is_undone(dataset, tmp_path, monkeypatch) -> None:
    """Without symbolic links the files are replaced one by one (os.replace); when the third move fails,
    the two made are undone."""
    import dprobe.data.profile_import as profile_import

    session = as_session(2, tmp_path / "session", only={"r017"})
    before = digest(dataset)
    calls: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(profile_import.os, "replace", failing_replace(3, calls))
        patch.setattr(profile_import.os, "symlink", no_links)
        with pytest.raises(OSError, match="No space left"):
            add_collection(session, dataset)
    assert calls[:3] == ["runs.csv", "samples.csv", "steps.csv"] and len(calls) == 5  # two moves undone
    assert digest(dataset) == before


@pytest.mark.slow
def test_a_move_that_fails_anywhere_leaves_what_the_files_hold(tmp_path, monkeypatch) -> None:
    """Each rename of an addition failing in turn (laying a plain data set out: current, then the four files;
    then the swap): the files hold what they held, and the next addition goes through and cleans up."""
    import dprobe.data.profile_import as profile_import

    session = as_session(2, tmp_path / "session", only={"r017"})
    calls: list[str] = []
    base = small_set(tmp_path / "small")
    held = seen(base)
    for n in range(1, 7):  # the moves that lay the data set out (current, then the four files), then the swap
        data = copy_set(base, tmp_path / f"failing-{n}")
        calls.clear()
        with monkeypatch.context() as patch:
            patch.setattr(profile_import.os, "replace", failing_replace(n, calls))
            with pytest.raises(OSError, match="No space left"):
                add_collection(session, data)
        assert seen(data) == held and load_h200_profiles(data).runs["collection"].max() == 2
        assert add_collection(session, data)["collection"] == 3 and not leftovers(data)
    assert calls == ["current", *DATA_FILES, "current"]  # the last to fail was the swap


def test_an_addition_keeps_the_files_modes_and_leaves_nothing_behind(dataset, tmp_path) -> None:
    for path in dataset.iterdir():
        path.chmod(0o640)
    session = as_session(2, tmp_path / "session", only={"r017"})
    dataset.chmod(0o750)
    add_collection(session, dataset)
    assert sorted(p.name for p in dataset.iterdir()) == ["CARD.md", "README.md", "env.json", "runs.csv",
                                                          "samples.csv", "steps.csv"]
    assert not any(p.is_symlink() for p in dataset.iterdir())  # plain files again, as git tracks them
    assert {oct(p.stat().st_mode & 0o777) for p in dataset.iterdir() if p.is_file()} == {"0o640"}
    assert oct(dataset.stat().st_mode & 0o777) == "0o750" and not leftovers(dataset)
    assert (load_h200_profiles(dataset).runs["collection"] == 5).sum() == 1


@pytest.mark.slow
def test_a_second_addition_while_one_runs_is_refused_and_changes_nothing(dataset, tmp_path) -> None:
    """Additions to one data set never interleave: while one holds the folder, another is refused by name."""
    from dprobe.data.profile_import import _adding_to

    session = as_session(2, tmp_path / "session", only={"r017"})
    before = digest(dataset)
    with _adding_to(dataset):  # as a concurrent `dprobe profiles add` holds it
        with pytest.raises(DatasetError, match="another `dprobe profiles add` is adding to it"):
            add_collection(session, dataset)
        assert add_collection(session, dataset, dry_run=True)["collection"] == 5  # a dry run writes nothing
    assert digest(dataset) == before
    assert add_collection(session, dataset)["collection"] == 5  # released: the addition goes through
    assert sorted(p.name for p in dataset.iterdir()) == sorted(before)  # no lock file left behind


# --- an addition killed at any moment --------------------------------------------------------------------------

DATA_FILES = ("runs.csv", "samples.csv", "steps.csv", "env.json")
# what the kill tests intercept: every call that creates, moves, links, removes or flushes a file or folder
FILE_OPERATIONS = ("mkdir", "rename", "replace", "symlink", "link", "unlink", "rmdir", "fsync")


def small_set(out: Path, runs: tuple[str, ...] = ("r017", "r018", "r019")) -> Path:
    """A data set of a few runs of collection 2 (samples, steps and env.json entry), quick to grow."""
    out.mkdir(parents=True)
    for name, column in (("runs", "run_id"), ("samples", "label"), ("steps", "run_id")):
        table = pd.read_csv(SRC / f"{name}.csv", dtype=str, keep_default_na=False)
        table[(table["collection"] == "2") & table[column].isin(runs)].to_csv(out / f"{name}.csv", index=False)
    env = json.loads((SRC / "env.json").read_text())
    (out / "env.json").write_text(json.dumps({"collection_2": env["collection_2"]}, indent=1) + "\n")
    return out


def seen(directory: Path) -> tuple[bytes | str, ...]:
    """What a reader of the data set gets: the bytes of its four files (env.json without the times of adding)."""
    env = json.loads((directory / "env.json").read_text())
    for entry in env.values():
        entry.pop("added", None)
    return (*((directory / name).read_bytes() for name in DATA_FILES[:3]), json.dumps(env, sort_keys=True))


def leftovers(directory: Path) -> list[str]:
    """Staging folders and temporary links, and versions other than the current one."""
    left = [p.name for p in directory.iterdir() if p.name.startswith(".adding-")]
    versions = directory / ".versions"
    if versions.is_dir():
        current = os.readlink(versions / "current") if (versions / "current").is_symlink() else None
        left += [f".versions/{p.name}" for p in versions.iterdir() if p.name not in ("current", current)]
    return sorted(left)


def copy_set(directory: Path, to: Path) -> Path:
    return Path(shutil.copytree(directory, to, symlinks=True))


def add_killed_before(operation: int, session: Path, data: Path) -> bool:
    """Run ``add_collection(session, data)`` in a child process that SIGKILLs itself just before its
    ``operation``-th file operation (:data:`FILE_OPERATIONS`); whether it was killed (else it finished)."""
    import signal

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            count = [0]

            def counted(real: Callable[..., Any]) -> Callable[..., Any]:
                def call(*args: Any, **kwargs: Any) -> Any:
                    count[0] += 1
                    if count[0] == operation:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return call

            for name in FILE_OPERATIONS:
                setattr(os, name, counted(getattr(os, name)))
            add_collection(session, data)
        except BaseException:  # reported by the exit status
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the addition failed before file operation {operation}"
    return False


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["plain files", "versioned"])
def test_an_addition_killed_before_any_file_operation_leaves_the_old_or_the_new_set(tmp_path, layout) -> None:
    """SIGKILL before each file operation of an addition in turn, to the end: every data set it leaves
    loads as the old set or as the new one, whole; the next addition removes what the killed one left and
    grows whichever it finds. Plain files: the first addition lays the data set out; versioned: a later one."""
    base = small_set(tmp_path / "base")
    if layout == "versioned":
        add_collection(as_session(2, tmp_path / "first", only={"r020"}), base)
    session = as_session(2, tmp_path / "session", only={"r021", "r022"})
    once = copy_set(base, tmp_path / "once")
    add_collection(session, once)
    twice = copy_set(once, tmp_path / "twice")
    add_collection(session, twice)
    old, new, newer = seen(base), seen(once), seen(twice)
    assert len({old, new, newer}) == 3

    outcomes: dict[str, int] = {"old": 0, "new": 0, "old, staging left": 0, "new, staging left": 0}
    for operation in range(1, 200):
        data = copy_set(base, tmp_path / f"killed-{operation}")
        killed = add_killed_before(operation, session, data)
        state = seen(data)
        assert state in (old, new), f"killed before file operation {operation}: a mix of the old and new set"
        loaded = load_h200_profiles(data)
        assert loaded.runs["collection"].max() == (2 if state == old else 3) + (layout == "versioned")
        outcome = "old" if state == old else "new"
        outcomes[outcome + (", staging left" if leftovers(data) else "")] += 1
        if not killed:
            assert not leftovers(data) and state == new
            break
        add_collection(session, data)  # the next addition: cleans up, builds on what it found
        assert not leftovers(data), f"killed before file operation {operation}: {leftovers(data)}"
        assert seen(data) == (new if state == old else newer)
    else:
        pytest.fail("the addition never finished")
    assert operation > (30 if layout == "plain files" else 12)  # every file operation had its kill
    assert outcomes["old"] + outcomes["old, staging left"] and outcomes["new"] + outcomes["new, staging left"]
    assert outcomes["old, staging left"] + outcomes["new, staging left"]  # the cleaning was put to work


@pytest.mark.slow
def test_a_profiles_add_command_killed_at_many_moments(tmp_path) -> None:
    """A real `dprobe profiles add` process, SIGKILLed 14 times from its start to its end (most kills
    while its staging folder exists): the old set or the new one each time; the next addition cleans up."""
    import signal
    import subprocess
    import sys
    import time

    base = small_set(tmp_path / "base")
    session = as_session(2, tmp_path / "session", only={"r021", "r022"})
    once = copy_set(base, tmp_path / "once")
    add_collection(session, once)
    old, new = seen(base), seen(once)
    code = "import sys; from dprobe.cli import main; sys.exit(main(sys.argv[1:]))"

    def start(data: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code, "profiles", "add", str(session), "--data", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def staged(data: Path, process: subprocess.Popen) -> float | None:
        """Wait until the process's staging folder appears (its monotonic time) or it ends (None)."""
        while process.poll() is None:
            if any(p.name.startswith(".adding-") for p in data.iterdir()):
                return time.monotonic()
            time.sleep(0.001)
        return None

    reference = copy_set(base, tmp_path / "reference")
    process = start(reference)
    t_staged = staged(reference, process)
    assert process.wait(timeout=120) == 0, process.stderr.read()
    writing = time.monotonic() - t_staged  # from the staging folder's appearance to the process's end
    assert seen(reference) == new

    kills = [("start", 0.3), ("start", 0.8)] + [("staged", writing * i / 11) for i in range(12)]
    outcomes = []
    for i, (since, delay) in enumerate(kills):
        data = copy_set(base, tmp_path / f"killed-{i}")
        process = start(data)
        t0 = time.monotonic() if since == "start" else staged(data, process)
        if t0 is not None:
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
        process.send_signal(signal.SIGKILL)
        status = process.wait(timeout=120)
        state = seen(data)
        assert state in (old, new), f"kill {i} ({delay:.3f} s after {since}): a mix of the old and new set"
        load_h200_profiles(data)
        outcomes.append(("old" if state == old else "new") + (" +staging" if leftovers(data) else "")
                        + ("" if status == -signal.SIGKILL else " (finished)"))
        add_collection(session, data)
        assert not leftovers(data)
    assert any(o.startswith("old") for o in outcomes) and any("+staging" in o for o in outcomes), outcomes


def test_a_set_whose_files_are_from_different_states_is_refused_by_run(tmp_path) -> None:
    """Files of one state mixed with another's (as files replaced one by one leave them when the replacing
    stops): the loader names the first run of the collection the files disagree on, and no addition builds
    on such a set."""
    old = small_set(tmp_path / "old")
    add_collection(as_session(2, tmp_path / "first", only={"r020"}), old)  # collection 3, added
    new = copy_set(old, tmp_path / "new")
    summary = add_collection(as_session(2, tmp_path / "session", only={"r021", "r022"}), new)
    assert summary["collection"] == 4
    first = load_h200_profiles(new).runs.query("collection == 4")["run_id"].iloc[0]
    for replaced, missing in ((["runs.csv"], "samples.csv has no sample of collection 4"),
                              (["runs.csv", "samples.csv"], "steps.csv has no step of collection 4"),
                              (["runs.csv", "samples.csv", "steps.csv"],
                               r"env.json has no collection_4 \(it has collection_3, written by `dprobe profiles "
                               r"add`\)")):
        mixed = tmp_path / f"mixed-{len(replaced)}"
        mixed.mkdir()
        for name in DATA_FILES:
            shutil.copyfile((new if name in replaced else old) / name, mixed / name)
        with pytest.raises(DatasetError, match=rf"{mixed}: run {first} of collection 4 is in runs\.csv, but "
                                               rf"{missing}: the files are not from one state"):
            load_h200_profiles(mixed)
    with pytest.raises(DatasetError, match=rf"would leave a data set that does not load .*run {first} of "
                                           "collection 4"):
        add_collection(as_session(2, tmp_path / "next", only={"r019"}), tmp_path / "mixed-1")
    # fewer runs in runs.csv than samples.csv and steps.csv hold is a subset, not a mix
    runs = pd.read_csv(new / "runs.csv", dtype=str, keep_default_na=False)
    subset = copy_set(new, tmp_path / "subset")
    (subset / "runs.csv").unlink()
    runs[runs["collection"] != "3"].to_csv(subset / "runs.csv", index=False)
    assert sorted(set(load_h200_profiles(subset).runs["collection"])) == [2, 4]


def test_the_next_addition_removes_what_killed_ones_left_but_not_a_live_ones_staging(tmp_path) -> None:
    import fcntl

    data = small_set(tmp_path / "data")
    add_collection(as_session(2, tmp_path / "first", only={"r020"}), data)
    dead = data / ".adding-dead"  # staging of an addition killed before the swap
    dead.mkdir()
    (dead / "runs.csv").write_text("collection,run_id\n")
    (data / ".adding-link").symlink_to(".versions/current/runs.csv")  # a link made before it was moved
    stale = data / ".versions" / "collection-9-stale"  # a version no longer (or not yet) current
    stale.mkdir(parents=True)
    (stale / "runs.csv").write_text("collection,run_id\n")
    live = data / ".adding-live"  # staging held by a process still running
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert add_collection(as_session(2, tmp_path / "session", only={"r021"}), data)["collection"] == 4
        assert leftovers(data) == [".adding-live"] and live.is_dir()
    finally:
        os.close(fd)
    assert add_collection(as_session(2, tmp_path / "again", only={"r022"}), data)["collection"] == 5
    assert not leftovers(data)


def test_a_plain_data_set_stays_plain_files_and_a_copy_of_it_keeps_working(tmp_path) -> None:
    """The four files are swapped in through .versions/current, then made plain files again and .versions
    removed (a data set in a git checkout shows only its grown files); other files are left alone; copies
    with links or without grow too."""
    data = small_set(tmp_path / "data")
    (data / "README.md").write_text("mine\n")
    add_collection(as_session(2, tmp_path / "session", only={"r021"}), data)
    assert sorted(p.name for p in data.iterdir()) == ["README.md", *sorted(DATA_FILES)]
    assert not any((data / name).is_symlink() for name in DATA_FILES)
    assert (data / "README.md").read_text() == "mine\n" and not (data / "README.md").is_symlink()
    assert (load_h200_profiles(data).runs["collection"] == 3).sum() == 1
    for kept_links in (True, False):  # cp -r, cp -rL
        copy = Path(shutil.copytree(data, tmp_path / f"copy-{kept_links}", symlinks=kept_links))
        assert add_collection(as_session(2, tmp_path / f"s-{kept_links}", only={"r022"}), copy)["collection"] == 4
        assert not leftovers(copy) and (load_h200_profiles(copy).runs["collection"] == 4).sum() == 1


def test_without_symbolic_links_the_files_are_replaced_one_by_one(dataset, tmp_path, monkeypatch) -> None:
    """A file system without symbolic links: the files are replaced in place as plain files, runs.csv first."""
    import dprobe.data.profile_import as profile_import

    monkeypatch.setattr(profile_import.os, "symlink", no_links)
    add_collection(as_session(2, tmp_path / "session", only={"r017"}), dataset)
    assert sorted(p.name for p in dataset.iterdir()) == ["CARD.md", "README.md", *sorted(DATA_FILES)]
    assert not any(p.is_symlink() for p in dataset.iterdir())
    assert (load_h200_profiles(dataset).runs["collection"] == 5).sum() == 1
