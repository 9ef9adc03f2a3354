"""Growing a profiles data set with a collector session, and training on runs from other GPUs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path

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
    from dprobe.profiling.coldstart.dataset import load_dataset
    from dprobe.profiling.coldstart.features import FEATURES
    from dprobe.profiling.coldstart.gpus import GPUS, gpu_key

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


def test_a_replacement_that_fails_halfway_is_undone(dataset, tmp_path, monkeypatch) -> None:
    """The files are replaced one by one (os.replace); when the third move fails, the two made are undone."""
    import dprobe.data.profile_import as profile_import

    session = as_session(2, tmp_path / "session", only={"r017"})
    before = digest(dataset)
    real, calls = os.replace, []

    def third_fails(src: str | Path, dst: str | Path) -> None:
        calls.append(Path(dst).name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(profile_import.os, "replace", third_fails)
    with pytest.raises(OSError, match="No space left"):
        add_collection(session, dataset)
    assert calls[:3] == ["runs.csv", "samples.csv", "steps.csv"] and len(calls) == 5  # two moves undone
    assert digest(dataset) == before


def test_an_addition_keeps_the_files_modes_and_leaves_nothing_behind(dataset, tmp_path) -> None:
    for path in dataset.iterdir():
        path.chmod(0o640)
    session = as_session(2, tmp_path / "session", only={"r017"})
    add_collection(session, dataset)
    assert sorted(p.name for p in dataset.iterdir()) == ["CARD.md", "README.md", "env.json", "runs.csv",
                                                          "samples.csv", "steps.csv"]
    assert {oct(p.stat().st_mode & 0o777) for p in dataset.iterdir()} == {"0o640"}
    assert (load_h200_profiles(dataset).runs["collection"] == 5).sum() == 1


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
