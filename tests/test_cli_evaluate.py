"""``dprobe evaluate`` end to end on small subsets of the bundled data sets."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from dprobe.cli import main
from dprobe.forecaster import BASELINES

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
ROW_KEYS = {"method", "target", "lead_steps", "mae", "mase", "pinball", "coverage_p90", "n_forecasts"}


@pytest.fixture(scope="module")
def helios_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three VCs, their first four days."""
    src = DATASETS / "helios-earth-vc"
    dest = tmp_path_factory.mktemp("helios-subset")
    for path in sorted(src.glob("vc*.csv.gz"))[:3]:
        pd.read_csv(path, nrows=4 * 1440).to_csv(dest / path.name, index=False)
    shutil.copy(src / "Earth_gpu_number.csv", dest)
    return dest


@pytest.fixture(scope="module")
def alibaba_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three pods with the most rows (and the cluster-wide request rates)."""
    src = DATASETS / "alibaba-genai-2026"
    dest = tmp_path_factory.mktemp("alibaba-subset")
    duty = pd.read_csv(src / "pod_gpu_duty_cycle_anon.csv.gz")
    pods = duty["container_ip"].value_counts().index[:3]
    for stem in ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon", "qps"):
        df = duty if stem == "pod_gpu_duty_cycle_anon" else pd.read_csv(src / f"{stem}.csv.gz")
        keep = df["container_ip"].isin(pods) | (df["container_ip"].isna() if stem == "qps" else False)
        df[keep].to_csv(dest / f"{stem}.csv.gz", index=False)
    return dest


def run_json(capsys: pytest.CaptureFixture[str], data: Path, *extra: str) -> dict:
    assert main(["evaluate", "--data", str(data), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def check_rows(out: dict, dataset: str, targets: set[str], leads: set[int]) -> None:
    assert out["dataset"] == dataset
    rows = out["rows"]
    for r in rows:
        assert set(r) >= ROW_KEYS
        assert r["n_forecasts"] > 0 and r["mae"] >= 0
        assert r["coverage_p90"] is None or 0 <= r["coverage_p90"] <= 1
    seen = {(r["method"], r["target"], r["lead_steps"]) for r in rows}
    # without --checkpoint, the forecaster shipped with dprobe is scored beside every baseline
    assert seen == {(m, t, h) for m in (*BASELINES, "dprobe") for t in targets for h in leads}


def test_json_helios(capsys: pytest.CaptureFixture[str], helios_dir: Path) -> None:
    out = run_json(capsys, helios_dir)
    check_rows(out, "helios-earth-vc", {"gpu_demand"}, {6, 12, 24})
    assert all(r["n_series"] == 3 for r in out["rows"])
    # the short answer: dprobe over the best baseline of each row
    assert [(s["target"], s["lead_steps"]) for s in out["against_baselines"]] == [("gpu_demand", h) for h in (6, 12, 24)]
    for s in out["against_baselines"]:
        row = [r for r in out["rows"] if r["lead_steps"] == s["lead_steps"]]
        best = min((r for r in row if r["method"] != "dprobe"), key=lambda r: r["pinball"])
        mine = next(r for r in row if r["method"] == "dprobe")
        assert s["best_pinball"] == best["method"] and s["pinball_ratio"] == pytest.approx(mine["pinball"] / best["pinball"])


@pytest.mark.slow
def test_json_alibaba(capsys: pytest.CaptureFixture[str], alibaba_dir: Path) -> None:
    out = run_json(capsys, alibaba_dir)
    check_rows(out, "alibaba-genai-2026", {"gpu_duty_cycle_pct", "gpu_memory_bytes"}, {5, 15, 30})


def test_baseline_subset_and_no_model(capsys: pytest.CaptureFixture[str], helios_dir: Path) -> None:
    assert main(["evaluate", "--data", str(helios_dir), "--json", "--baselines", "last_value,ewma"]) == 0
    captured = capsys.readouterr()
    assert {r["method"] for r in json.loads(captured.out)["rows"]} == {"last_value", "ewma", "dprobe"}
    assert "scoring the forecaster shipped with dprobe (default_forecaster.onnx)" in captured.err
    out = run_json(capsys, helios_dir, "--baselines", "last_value", "--checkpoint", "none")
    assert {r["method"] for r in out["rows"]} == {"last_value"}
    named = run_json(capsys, helios_dir, "--baselines", "last_value", "--checkpoint", "dprobe")  # by its name
    assert named["rows"] == [r for r in json.loads(captured.out)["rows"] if r["method"] in ("last_value", "dprobe")]


@pytest.mark.slow
def test_markdown_and_plot(capsys: pytest.CaptureFixture[str], helios_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "forecasts.png"
    assert main(["evaluate", "--data", str(helios_dir), "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("### helios-earth-vc")
    assert "| target | lead (steps) | method |" in captured.out
    for name in BASELINES:
        assert f"| {name} |" in captured.out
    with pytest.raises(json.JSONDecodeError):
        json.loads(captured.out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in captured.err


def test_bad_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    assert main(["evaluate", "--data", str(missing), "--json"]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err and captured.out == ""
    (tmp_path / "junk.txt").write_text("not a data set")
    assert main(["evaluate", "--data", str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_bad_options(capsys: pytest.CaptureFixture[str], helios_dir: Path) -> None:
    assert main(["evaluate", "--data", str(helios_dir), "--baselines", "prophet"]) == 2
    assert "prophet" in capsys.readouterr().err
    assert main(["evaluate", "--data", str(helios_dir), "--test-fraction", "1.5"]) == 2
    assert "--test-fraction" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_help(console_script) -> None:
    proc = subprocess.run([console_script, "evaluate", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for option in ("--data", "--checkpoint", "--json", "--plot"):
        assert option in proc.stdout
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert "%%" not in text and "default: None" not in text
    assert "share of each series used as test span (default: 0.3)" in text


@pytest.mark.slow
def test_a_checkpoint_is_not_scored_on_what_it_trained_on(capsys: pytest.CaptureFixture[str], helios_dir: Path,
                                                           tmp_path: Path) -> None:
    """A checkpoint records its split: a test span that starts before its own is refused in one line, unless
    --allow-train-overlap; one that starts at or after it is scored."""
    import onnx

    from dprobe.core.split import Split
    from dprobe.forecaster.loading import SHIPPED_FORECASTER

    model = onnx.load(str(SHIPPED_FORECASTER))  # the shipped network, as if trained on the first 80 %
    meta = json.loads(model.metadata_props[0].value)
    assert meta["split"] == Split().to_dict()
    model.metadata_props[0].value = json.dumps({**meta, "split": Split(test_start=0.8).to_dict()})
    late = str(tmp_path / "late.onnx")
    onnx.save(model, late)
    scoring = ["--checkpoint", late, "--baselines", "last_value"]
    assert main(["evaluate", "--data", str(helios_dir), "--json", *scoring]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert re.search(r"late\.onnx was trained and calibrated on the first 80 % of each series.*starts at 70 %.*"
                     r"--test-fraction 0\.2 or less.*--allow-train-overlap", captured.err)
    unseen = run_json(capsys, helios_dir, *scoring, "--test-fraction", "0.2")
    overlap = run_json(capsys, helios_dir, *scoring, "--allow-train-overlap")
    for out, share in ((unseen, 0.2), (overlap, 0.3)):
        assert {r["method"] for r in out["rows"]} == {"dprobe", "last_value"}
        n = {r["n_forecasts"] for r in out["rows"] if r["lead_steps"] == 6}
        assert len(n) == 1 and abs(n.pop() / (3 * 1152 * share) - 1) < 0.05  # 3 VCs of 4 days in 5-min steps
    # the forecaster shipped with dprobe was trained with the default split
    assert main(["evaluate", "--data", str(helios_dir), "--json", "--test-fraction", "0.4"]) == 2
    assert "first 70 %" in capsys.readouterr().err
