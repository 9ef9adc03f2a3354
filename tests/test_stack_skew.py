"""tools/stack_skew.py: replays of h200-profiles runs in this environment, and the comparison of two
environments' replays (the runs whose allocator peak or device memory estimate moved)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from dprobe.profiling.coldstart.features import FEATURES

STACK_A = {"python": "3.12.3", "torch": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "timm": "1.0.29"}
STACK_B = {"python": "3.11.7", "torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.23.0", "timm": "1.0.31"}


@pytest.fixture(scope="module")
def skew(script):
    return script("tools/stack_skew.py")


def _run(skew, run_id: str, model: str, peak: float, device: float, precision: str = "bf16") -> dict:
    replay = dict.fromkeys(skew.REPLAY_FIELDS, 1.0)
    replay.update(peak_bytes=peak, device_bytes=device, reserved_bytes=device - 1e9, flops=5e12, kernels=900.0)
    return {"run_id": run_id, "collection": 2, "model": model, "spec": model, "config_kwargs": {}, "batch": 8,
            "image": None, "seq": 512, "precision": precision, "optimizer": "adamw", "seconds": 0.5,
            "replay": replay, "features": {"log_peak": math.log(peak), "log_kernels": 6.8}}


def _doc(skew, versions: dict, runs: list[dict], failed: list[dict] | None = None) -> dict:
    return {"format": skew.FORMAT, "versions": versions, "data": "x", "runs": runs, "failed": failed or []}


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_compare_lists_the_runs_that_moved_beyond_the_threshold(skew, tmp_path, capsys):
    gib = float(1 << 30)
    a = _doc(skew, STACK_A, [_run(skew, "r1", "transformers:t", 4 * gib, 6 * gib),
                             _run(skew, "r2", "transformers:t", 8 * gib, 10 * gib),
                             _run(skew, "r3", "timm:m", 2 * gib, 4 * gib),
                             _run(skew, "r4", "timm:m", 2 * gib, 4 * gib)])
    b_runs = [_run(skew, "r1", "transformers:t", 3 * gib, 5 * gib),  # peak x0.75
              _run(skew, "r2", "transformers:t", 8 * gib, 10.5 * gib),  # device only, x1.05
              _run(skew, "r3", "timm:m", 2.02 * gib, 4 * gib),  # 1 %: under the threshold
              _run(skew, "r4", "timm:m", 2 * gib, 4 * gib)]
    b_runs[0]["features"]["log_kernels"] = 7.5
    b = _doc(skew, STACK_B, b_runs)
    out = tmp_path / "skew.csv"
    assert skew.main(["compare", str(_write(tmp_path / "a.json", a)), str(_write(tmp_path / "b.json", b)),
                      "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 of 4 runs replayed in both differ by more than 2.0%" in text
    assert "transformers:t" in text and "timm:m" not in text
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run_id"] for r in rows] == ["r1", "r2"]
    assert float(rows[0]["peak_ratio"]) == pytest.approx(0.75)
    assert float(rows[0]["device_ratio"]) == pytest.approx(5 / 6, abs=1e-4)
    assert float(rows[1]["peak_ratio"]) == pytest.approx(1.0)
    assert float(rows[1]["device_ratio"]) == pytest.approx(1.05)
    assert int(rows[0]["peak_b_bytes"]) == 3 * (1 << 30)
    assert rows[0]["largest_feature_change"] == "log_kernels +0.700"
    assert rows[0]["stack_a"] == "torch=2.11.0 torchvision=0.26.0 transformers=5.17.0 timm=1.0.29"
    assert rows[0]["stack_b"].startswith("torch=2.14.1 ")

    # a lower threshold takes the 1 % run in too
    rows = skew.compare_replays(a, b, threshold=0.005)
    assert [r["run_id"] for r in rows] == ["r1", "r2", "r3"]


def test_compare_reports_runs_replayed_in_one_stack_only(skew):
    a = _doc(skew, STACK_A, [_run(skew, "r1", "timm:m", 1e9, 2e9), _run(skew, "r2", "timm:n", 1e9, 2e9)])
    b = _doc(skew, STACK_B, [_run(skew, "r1", "timm:m", 1e9, 2e9)],
             failed=[{"run_id": "r2", "model": "timm:n", "error": "RuntimeError: unknown model"}])
    rows = skew.compare_replays(a, b)
    assert len(rows) == 1 and rows[0]["run_id"] == "r2"
    assert rows[0]["note"] == "replayed in A only: RuntimeError: unknown model"
    assert "peak_ratio" not in rows[0]


def test_compare_refuses_files_of_different_data_or_format(skew, tmp_path):
    a = _doc(skew, STACK_A, [_run(skew, "r1", "timm:m", 1e9, 2e9)])
    other = _run(skew, "r1", "timm:m", 1e9, 2e9)
    other["batch"] = 16
    with pytest.raises(SystemExit, match="batch 8 in A, 16 in B"):
        skew.compare_replays(a, _doc(skew, STACK_B, [other]))
    bad = _write(tmp_path / "bad.json", {"runs": []})
    with pytest.raises(SystemExit, match="not a file of `stack_skew.py replay`"):
        skew.main(["compare", str(bad), str(bad)])
    with pytest.raises(SystemExit):  # argparse: a negative threshold
        skew.main(["compare", str(bad), str(bad), "--threshold", "-0.1"])


def test_replay_writes_the_replay_outputs_and_versions(skew, small_h200_dir, tmp_path):
    out = tmp_path / "replays.json"
    cache = tmp_path / "cache"
    assert skew.main(["replay", "--data", str(small_h200_dir), "--out", str(out), "--runs", "r014,r019",
                      "--cache-dir", str(cache), "--quiet"]) == 0
    doc = skew.load_replays(out)
    assert doc["versions"]["torch"] and doc["versions"]["transformers"]
    assert {r["run_id"] for r in doc["runs"]} == {"r014", "r019"} and doc["failed"] == []
    for run in doc["runs"]:
        rep = run["replay"]
        assert rep["peak_bytes"] >= rep["steady_bytes"] >= rep["param_bytes"] > 0
        assert rep["device_bytes"] > rep["reserved_bytes"] >= rep["peak_bytes"]
        assert list(run["features"]) == FEATURES
    # the cache is this environment's: another stack's versions are refused
    stamp = json.loads((cache / "stack.json").read_text())
    (cache / "stack.json").write_text(json.dumps({**stamp, "torch": "0.0.1"}))
    with pytest.raises(SystemExit, match="give a cache directory of its own"):
        skew.main(["replay", "--data", str(small_h200_dir), "--out", str(out), "--runs", "r014",
                   "--cache-dir", str(cache), "--quiet"])
    # the same replays compared with themselves: nothing differs
    assert skew.compare_replays(doc, doc, threshold=0.0) == []


def test_replay_refuses_unknown_runs(skew, small_h200_dir, tmp_path):
    with pytest.raises(SystemExit, match="no ok training run r999"):
        skew.main(["replay", "--data", str(small_h200_dir), "--out", str(tmp_path / "x.json"), "--runs", "r999"])
