"""Bad input to the offline commands (evaluate, simulate, predict) and their loaders: a one-line error naming
what is wrong, given before any long work, never a traceback, and nothing impossible taken as data."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.cli import main
from dprobe.data import DatasetError, load_alibaba, load_h200_profiles, load_helios, load_philly
from dprobe.data.workloads import read_workloads

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_662_858_777  # a timestamp_anon of alibaba-genai-2026


def one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``dprobe ARGV``; assert it exits 2 with one ``dprobe CMD: error: ...`` line and no traceback; that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and lines, err
    assert lines[-1].startswith(f"dprobe {argv[0]}: error: "), err
    return lines[-1]


def alibaba_dir(directory: Path, duty: list[tuple[float, str, str]] | None = None,
                memory: list[tuple[float, str, str]] | None = None, steps: int = 150) -> Path:
    """An alibaba-genai-2026 layout of two pods on the 57 s grid; ``duty`` / ``memory``: rows (row index, column,
    cell) replaced in that file (row 0 is the CSV's row 2)."""
    directory.mkdir(parents=True)
    rows = [(T0 + 57 * k, pod) for pod in ("pod-a", "pod-b") for k in range(steps)]
    for name, value, changes in (("pod_gpu_duty_cycle_anon", "40.0", duty or []),
                                 ("pod_gpu_memory_used_bytes_anon", "1000000000", memory or [])):
        frame = pd.DataFrame({"value": value, "timestamp_anon": [str(t) for t, _ in rows],
                              "container_ip": [p for _, p in rows]})
        for i, column, cell in changes:
            frame.loc[i, column] = cell
        frame.to_csv(directory / f"{name}.csv", index=False)
    pd.DataFrame({"timestamp_anon": [T0], "value": [1.0], "container_ip": [""], "request_type": ["api"]}).to_csv(
        directory / "qps.csv", index=False)
    return directory


# --- timestamps that overflow ------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ["1e20", "-1e12", "inf"])
def test_evaluate_refuses_a_timestamp_beyond_what_a_timestamp_holds(tmp_path, capsys, cell) -> None:
    data = alibaba_dir(tmp_path / "a", duty=[(4, "timestamp_anon", cell)])
    line = one_error(capsys, ["evaluate", "--data", str(data), "--checkpoint", "none"])
    assert "pod_gpu_duty_cycle_anon.csv: column 'timestamp_anon' must be seconds since 1970" in line
    assert "row 6 has" in line


@pytest.mark.slow
def test_the_console_script_prints_one_line_for_an_overflowing_timestamp(tmp_path) -> None:
    data = alibaba_dir(tmp_path / "a", memory=[(10, "timestamp_anon", "1e20")])
    out = subprocess.run([sys.executable, "-m", "dprobe.cli", "evaluate", "--data", str(data), "--checkpoint",
                          "none"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("dprobe evaluate: error: ")
    assert "pod_gpu_memory_used_bytes_anon.csv: column 'timestamp_anon'" in out.stderr and "row 12 has 1e+20" in out.stderr


def test_a_timestamp_years_off_is_refused_before_the_grid_is_built(tmp_path) -> None:
    data = alibaba_dir(tmp_path / "a", duty=[(3, "timestamp_anon", str(T0 + 57 * 2_500_000))])
    with pytest.raises(DatasetError, match=r"series pod-a: its timestamps run from 2022-.* more than 2,000,000 "
                                           r"steps of 57 s; is a timestamp wrong\?"):
        load_alibaba(data)
    helios = tmp_path / "h"
    helios.mkdir()
    times = list(pd.date_range("2020-05-01", periods=20, freq="min").astype(str)) + ["2045-05-01 00:00:00"]
    pd.DataFrame({"time": times, "running_gpu_num": 1, "pending_gpu_num": 0, "running_job_num": 1,
                  "pending_job_num": 0}).to_csv(helios / "vcA.csv", index=False)
    with pytest.raises(DatasetError, match=r"series vcA: .* to 2045-05-01 00:00:00, more than 2,000,000 steps"):
        load_helios(helios)


def test_the_replay_source_refuses_overflowing_timestamps(tmp_path) -> None:
    from dprobe.services.sources.replay import ReplaySource

    data = alibaba_dir(tmp_path / "a", duty=[(0, "timestamp_anon", "1e20")])
    with pytest.raises(DatasetError, match=r"column 'timestamp_anon' .* row 2 has 1e\+20"):
        ReplaySource("alibaba", data)
    h200 = tmp_path / "h200"
    h200.mkdir()
    src = ROOT / "datasets" / "h200-profiles"
    for name, key in (("runs", "run_id"), ("samples", "label"), ("steps", "run_id")):
        table = pd.read_csv(src / f"{name}.csv")
        table = table[table[key].isin(["r014", "r061"])].reset_index(drop=True)
        if name == "samples":
            table["t"] = table["t"].astype(float)
            table.loc[3, "t"] = 1e20
        table.to_csv(h200 / f"{name}.csv", index=False)
    with pytest.raises(DatasetError, match=r"samples\.csv: column 't' must be a time in seconds .* row 5 has 1e\+20"):
        ReplaySource("h200", h200)


# --- impossible values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("file", "cell", "range_"), [
    ("duty", "-5.0", "a duty cycle between 0 and 100"),
    ("duty", "5000", "a duty cycle between 0 and 100"),
    ("duty", "inf", "a duty cycle between 0 and 100"),
    ("memory", "-1", "a number of bytes >= 0"),
])
def test_evaluate_refuses_impossible_utilisation_and_memory(tmp_path, capsys, file, cell, range_) -> None:
    data = alibaba_dir(tmp_path / "a", **{file: [(7, "value", cell)]})
    line = one_error(capsys, ["evaluate", "--data", str(data), "--checkpoint", "none"])
    name = "pod_gpu_duty_cycle_anon" if file == "duty" else "pod_gpu_memory_used_bytes_anon"
    assert f"{name}.csv: column 'value' must be {range_}" in line and "row 9 has" in line


def test_helios_refuses_negative_gpu_counts_and_quotas(tmp_path) -> None:
    helios = tmp_path / "h"
    helios.mkdir()
    frame = pd.DataFrame({"time": pd.date_range("2020-05-01", periods=5, freq="min").astype(str),
                          "running_gpu_num": [1, 1, -7, 1, 1], "pending_gpu_num": 0, "running_job_num": 1,
                          "pending_job_num": 0})
    frame.to_csv(helios / "vcA.csv", index=False)
    with pytest.raises(DatasetError, match=r"vcA\.csv: column 'running_gpu_num' must be a number >= 0; row 4 has -7"):
        load_helios(helios)
    frame["running_gpu_num"] = 1
    frame.to_csv(helios / "vcA.csv", index=False)
    (helios / "Earth_gpu_number.csv").write_text("date,vcA\n2020-05-01,-8\n")
    with pytest.raises(DatasetError, match=r"Earth_gpu_number\.csv: column 'vcA' must be a number >= 0"):
        load_helios(helios)


def test_h200_profiles_refuse_a_negative_batch(tmp_path) -> None:
    src = ROOT / "datasets" / "h200-profiles"
    data = tmp_path / "p"
    data.mkdir()
    for name in ("samples", "steps", "env"):
        suffix = ".json" if name == "env" else ".csv"
        (data / f"{name}{suffix}").write_bytes((src / f"{name}{suffix}").read_bytes())
    runs = pd.read_csv(src / "runs.csv", dtype=str, keep_default_na=False)
    runs.loc[4, "batch"] = "-8"
    runs.to_csv(data / "runs.csv", index=False)
    with pytest.raises(DatasetError, match=r"runs\.csv: column 'batch' must be a whole number >= 1; row 6 has -8"):
        load_h200_profiles(data)


# --- simulate ------------------------------------------------------------------------------------------------


def itp_dir(directory: Path, rows: list[str]) -> Path:
    directory.mkdir()
    lines = ["job_id,submission_time,duration,num_gpu", "a,0,600,2", "b,60,1200,1", *rows]
    (directory / "cluster01.csv").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.parametrize(("row", "message"), [
    ("big,120,600,1000000000", r"column 'num_gpu' must be a whole number of GPUs from 1 to 1,000,000 .* row 4 has "
                               "1000000000"),
    ("late,1e20,600,1", r"column 'submission_time' must be a time in seconds .* row 4 has 1e\+20"),
    ("long,120,1e20,1", r"column 'duration' must be a number of seconds between 0 and .* row 4 has 1e\+20"),
    ("back,120,-5,1", r"column 'duration' must be a number of seconds between 0 and .* row 4 has -5"),
])
def test_simulate_refuses_jobs_no_cluster_runs(tmp_path, capsys, row, message) -> None:
    data = itp_dir(tmp_path / "itp", [row])
    line = one_error(capsys, ["simulate", "quota", "--data", str(data), "--policies", "static,reactive", "--quiet"])
    assert "cluster01.csv: " in line
    assert re.search(message, line), line


def test_philly_names_the_file_for_a_negative_duration(tmp_path) -> None:
    (tmp_path / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                                         "2017-10-09 07:01:55,-66.0,1,66.0,vc1\n")
    with pytest.raises(DatasetError, match=r"philly\.csv: column 'duration' must be a number of seconds .* row 2"):
        load_philly(tmp_path)
    (tmp_path / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                                         "2017-10-09 07:01:55,66.0,2000000,66.0,vc1\n")
    with pytest.raises(DatasetError, match=r"column 'num_gpus' must be a whole number of GPUs from 1 to 1,000,000"):
        load_philly(tmp_path)


def test_a_log_that_would_take_years_of_steps_is_refused_at_start(tmp_path, capsys) -> None:
    from dprobe.sim.jobs import JobTable
    from dprobe.sim.policies import StaticQuota
    from dprobe.sim.quota.cluster import SimConfig, simulate

    jobs = JobTable.from_lists([("a", 0.0, 60.0, 1), ("a", 30.0, 1.2e8, 1)])  # a job of almost four years
    with pytest.raises(ValueError, match=r"the jobs span 1,389 days \(job job-1 of a: .* runs 1,388\.9 days\): "
                                         r"2,000,000 steps of 60 s, more than 1,000,000"):
        simulate(jobs, StaticQuota(np.array([1])), SimConfig(interval=60.0))
    data = itp_dir(tmp_path / "itp", [])
    line = one_error(capsys, ["simulate", "quota", "--data", str(data), "--interval", "1e-6", "--quiet"])
    assert "steps of 1e-06 s, more than 1,000,000" in line


def test_simulate_refuses_a_bad_scaler_config_and_plot_path_before_reading_the_log(tmp_path, capsys,
                                                                                     monkeypatch) -> None:
    import dprobe.sim.jobs

    def never(*args: object) -> None:
        raise AssertionError("the job log was read")

    monkeypatch.setattr(dprobe.sim.jobs, "load_jobs", never)
    line = one_error(capsys, ["simulate", "quota", "--scaler-config", str(tmp_path / "missing.yaml"), "--quiet"])
    assert "missing.yaml" in line
    line = one_error(capsys, ["simulate", "quota", "--plot", str(tmp_path / "no" / "such" / "f.png"), "--quiet"])
    assert f"--plot {tmp_path / 'no' / 'such' / 'f.png'}: no folder {tmp_path / 'no' / 'such'}" in line


# --- evaluate's options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("plot", "message"), [
    ("missing/f.png", "no folder"),
    ("f.unknown", "name a file ending in .png, .pdf or .svg"),
    (".", "name a file ending in .png"),
])
def test_evaluate_refuses_a_plot_it_could_not_write_before_evaluating(tmp_path, capsys, monkeypatch, plot,
                                                                      message) -> None:
    import dprobe.evaluation.harness

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("evaluated")

    monkeypatch.setattr(dprobe.evaluation.harness, "evaluate_dataset", never)
    data = alibaba_dir(tmp_path / "a")
    line = one_error(capsys, ["evaluate", "--data", str(data), "--checkpoint", "none", "--plot", str(tmp_path / plot)])
    assert "--plot" in line and message in line


def test_evaluate_with_nothing_to_score_says_so(tmp_path, capsys) -> None:
    data = alibaba_dir(tmp_path / "a")
    line = one_error(capsys, ["evaluate", "--data", str(data), "--checkpoint", "none", "--baselines", ","])
    assert "nothing to score: no --baselines and --checkpoint none" in line


@pytest.mark.parametrize(("text", "message"), [
    ("series,model,batch,seq\npod-a,torchvision:alexnet,8,-5\n", "row 2: seq must be a positive integer"),
    ("series,model,batch,image\npod-a,torchvision:alexnet,8,\npod-b,torchvision:alexnet,8,0\n",
     "row 3: image must be a positive integer"),
    ("series,model,batch\npod-a,torchvision:alexnet,1e20\n", r"row 2: batch must be a positive integer \(at most"),
    ("series,model,batch,config_kwargs\npod-a,torchvision:alexnet,8,[1]\n", "config_kwargs must be a JSON object"),
    ('series,model,batch\n"pod-a,x\n', "workloads.csv: cannot be read as CSV"),
])
def test_workloads_csv_refuses_impossible_sizes(tmp_path, text, message) -> None:
    (tmp_path / "workloads.csv").write_text(text)
    with pytest.raises(DatasetError, match=message):
        read_workloads(tmp_path)


# --- predict -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    (["--seq", "0"], "--seq must be >= 1, not 0"),
    (["--seq", "-5"], "--seq must be >= 1, not -5"),
    (["--image", "0"], "--image must be >= 1, not 0"),
    (["--image", "-3"], "--image must be >= 1, not -3"),
    (["--host-stall", "inf"], "--host-stall must be >= 0 seconds, not inf"),
    (["--jobscale-checkpoint", "x.pt"], "--jobscale-checkpoint is read with --samples"),
    (["--checkpoint", "missing.pt"], "checkpoint missing.pt: no such file"),
])
def test_predict_refuses_a_job_that_cannot_be_before_replaying_it(capsys, monkeypatch, options, message) -> None:
    import dprobe.profiling.coldstart.predict

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed")

    monkeypatch.setattr(dprobe.profiling.coldstart.predict, "analytical_for", never)
    line = one_error(capsys, ["predict", "torchvision:alexnet", "--batch", "8", *options])
    assert message in line


def test_profiles_name_an_env_json_whose_gpu_memory_is_not_a_number(tmp_path, capsys) -> None:
    import json
    import shutil

    data = Path(shutil.copytree(ROOT / "datasets" / "h200-profiles", tmp_path / "p"))
    env = json.loads((data / "env.json").read_text())
    env["collection_1"]["gpu_total_bytes"] = "lots"
    (data / "env.json").write_text(json.dumps(env))
    line = one_error(capsys, ["profiles", "list", "--data", str(data)])
    assert f"{data / 'env.json'}: collection_1: 'gpu_total_bytes' must be a number of bytes > 0, got 'lots'" in line
