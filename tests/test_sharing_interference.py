"""The co-location slowdown model, its calibration on h200-profiles, and `dprobe predict --colocate`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dprobe.sharing.colocate import add_colocate_args, colocate, run_colocate
from dprobe.sharing.interference import (
    InterferenceModel,
    calibrate_from_pair,
    pair_calibrations,
    saturation_speeds,
)

ROOT = Path(__file__).resolve().parent.parent


def test_contention_grows_with_both_jobs_utilisation():
    m = InterferenceModel(contention=0.6)
    light, heavy = m.slowdowns(np.array([0.2, 0.2])), m.slowdowns(np.array([0.5, 0.4]))
    assert np.all(light < heavy)
    assert m.slowdowns(np.array([0.0, 0.9]))[0] == pytest.approx(0.0)  # an idle job's kernels never wait
    assert InterferenceModel(mode="mps").slowdowns(np.array([0.5, 0.4]))[0] < heavy[0]
    with pytest.raises(ValueError, match="sharing mode"):
        InterferenceModel(mode="vgpu")


def test_saturation_matches_the_baseline_when_contention_is_off():
    u = np.array([0.8, 0.7])
    assert InterferenceModel(contention=0).speeds(u) == pytest.approx(saturation_speeds(u))
    assert saturation_speeds(u)[0] == pytest.approx(1 / 1.5)


def test_memory_traffic_term_only_where_known():
    m = InterferenceModel(contention=0.0, memory_contention=1.0)
    assert m.speeds(np.array([0.3, 0.3]), np.array([0.5, 0.5]))[0] == pytest.approx(1 / 1.25)
    assert m.speeds(np.array([0.3, 0.3]), np.array([np.nan, 0.5]))[0] == pytest.approx(1.0)


def test_calibration_inverts_the_model():
    a = calibrate_from_pair(0.9, 0.4, 0.5)
    assert InterferenceModel(contention=a).speeds(np.array([0.4, 0.5]))[0] == pytest.approx(0.9)
    with pytest.raises(ValueError):
        calibrate_from_pair(1.2, 0.4, 0.5)


def test_the_h200_pair_gives_the_shipped_coefficient():
    rows = pair_calibrations(pd.read_csv(ROOT / "datasets" / "h200-profiles" / "runs.csv"))
    assert rows, "the bundled h200-profiles have a co-located pair with a solo run of one member"
    a = float(np.nanmean([r["contention"] for r in rows]))
    assert 0.3 <= a <= 1.0
    assert InterferenceModel().contention == pytest.approx(round(a, 1))


def _pred(model, util, mem50, mem90, step):
    return {"model": model, "batch": 8, "gpu_utilization": {"p50": util, "p90": util},
            "device_memory_bytes": {"p50": mem50, "p90": mem90}, "step_time_seconds": {"p50": step, "p90": step}}


def test_colocate_reports_both_slowdowns_memory_and_fit():
    gib = 1 << 30
    out = colocate(_pred("a", 0.5, 30 * gib, 40 * gib, 0.1), _pred("b", 0.3, 20 * gib, 30 * gib, 0.2), 64 * gib)
    assert [j["model"] for j in out["jobs"]] == ["a", "b"]
    assert all(0 < j["slowdown"] < 0.2 for j in out["jobs"])
    assert out["jobs"][0]["step_time_colocated_seconds"] > 0.1
    assert out["combined_device_memory_bytes"]["p90"] == 70 * gib and out["fits"] == "maybe"
    assert colocate(_pred("a", 0.5, 30 * gib, 30 * gib, 0.1), _pred("b", 0.3, 30 * gib, 30 * gib, 0.2),
                    64 * gib)["fits"] == "yes"
    with pytest.raises(ValueError, match="gpu_utilization"):
        colocate({"model": "x"}, _pred("b", 0.3, 1, 1, 0.1), 64 * gib)


def test_run_colocate_predicts_the_other_job_with_its_own_options(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--batch", type=int)
    p.add_argument("--image", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--config-kwargs")
    p.add_argument("--samples")
    p.add_argument("--json", action="store_true")
    add_colocate_args(p)
    args = p.parse_args(["m1", "--batch", "16", "--image", "160", "--colocate", "m2", "--colocate-seq", "64",
                         "--json"])
    seen = []

    def predict(a):
        seen.append((a.model, a.batch, a.image, a.seq))
        d = _pred(a.model, 0.4, 1e9, 2e9, 0.05)
        return SimpleNamespace(as_dict=lambda: d, gpu_memory_bytes=8e9)

    assert run_colocate(args, predict) == 0
    assert seen == [("m1", 16, 160, None), ("m2", 16, None, 64)]
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] == "yes" and len(out["jobs"]) == 2
    args.samples = "x.csv"
    with pytest.raises(ValueError, match="--samples"):
        run_colocate(args, predict)


def test_bundled_pair_plans_read(collector):
    for path in sorted((ROOT / "tools" / "plans").glob("pairs*.json")):
        pairs, solo = collector.read_pairs(path)
        assert pairs and {mode for _, _, mode in pairs} <= {"time-slicing", "mps"}
        members = {(json.dumps(s, sort_keys=True), b, p) for a, b_, _ in pairs for s, b, p in (a, b_)}
        assert len(solo) == len(members)  # every member also runs alone, once


def test_bad_pair_plans_name_the_item(collector, tmp_path):
    path = tmp_path / "pairs.json"
    path.write_text('[{"a": [{"lib": "timm", "model": "x"}, 8, "bf16"], "b": [{"lib": "timm", "model": "y"}, 8, '
                    '"int8"]}]')
    with pytest.raises(ValueError, match="item 0 is not"):
        collector.read_pairs(path)
    path.write_text('[{"a": [{"lib": "timm", "model": "x"}, 8, "bf16"], "b": [{"lib": "timm", "model": "y"}, 8, '
                    '"bf16"], "mode": "vgpu"}]')
    with pytest.raises(ValueError, match="item 0 is not"):
        collector.read_pairs(path)


def _runs(rows):
    cols = ["collection", "run_id", "kind", "status", "lib", "model", "config", "arch", "config_kwargs", "task",
            "image", "seq", "batch", "precision", "optimizer", "phases", "step_time_median_s",
            "nvml_gpu_util_pct_mean_2nd_half"]
    base = dict(collection=1, status="ok", lib="torchvision", config="", arch="", config_kwargs="", task="",
                image="", seq="", precision="bf16", optimizer="adamw", phases=False)
    return pd.DataFrame([{**base, **r} for r in rows])[cols]


def test_pairs_are_scored_only_with_solo_runs_of_both_members():
    rows = [dict(run_id="r001", kind="train", model="a", batch=8, step_time_median_s=0.10,
                 nvml_gpu_util_pct_mean_2nd_half=50.0),
            dict(run_id="r002", kind="train", model="b", batch=8, step_time_median_s=0.20,
                 nvml_gpu_util_pct_mean_2nd_half=40.0),
            dict(run_id="p00a", kind="colocated", model="a", batch=8, step_time_median_s=0.125,
                 nvml_gpu_util_pct_mean_2nd_half=80.0),
            dict(run_id="p00b", kind="colocated", model="b", batch=8, step_time_median_s=0.25,
                 nvml_gpu_util_pct_mean_2nd_half=80.0),
            dict(run_id="p01a", kind="colocated", model="a", batch=8, step_time_median_s=0.2,
                 nvml_gpu_util_pct_mean_2nd_half=90.0),
            dict(run_id="p01b", kind="colocated", model="c", batch=8, step_time_median_s=0.2,
                 nvml_gpu_util_pct_mean_2nd_half=90.0)]
    from dprobe.sharing.interference import evaluate_pairs

    out = evaluate_pairs(_runs(rows))
    assert [r["job"] for r in out] == ["p00a", "p00b"]  # p01: no solo run of "c"
    assert out[0]["speed"] == pytest.approx(0.8) and out[1]["speed"] == pytest.approx(0.8)
    assert out[0]["model"] == pytest.approx(1 / (1 + 0.6 * 0.5 * 0.4))
    assert out[0]["saturation"] == 1.0 and out[0]["no_slowdown"] == 1.0
    calib = pair_calibrations(_runs(rows))
    assert {r["job"] for r in calib} == {"p00a", "p00b", "p01a"}
