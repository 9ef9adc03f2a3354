"""The co-location models (the per-job model fitted on gavel-colocation, the time-share rule, the older
contention model and its calibration on h200-profiles), the memory verdict, and `dprobe predict --colocate`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dprobe.sharing.colocate import add_colocate_args, colocate, run_colocate
from dprobe.sharing.gavel import (
    job_key,
    job_profile,
    leave_model_type_out,
    load_pairs,
    load_profiles,
    unordered_pairs,
)
from dprobe.sharing.interference import (
    CUDA_CONTEXT_BYTES,
    FEATURES,
    GPU,
    FittedColocation,
    InterferenceModel,
    calibrate_from_pair,
    load_fitted,
    pair_calibrations,
    predict_colocation,
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


GIB = 1 << 30
H200 = {"name": "H200 SXM 141GB", "memory_gib": 139.8, "fp32_tflops": 67.0, "bandwidth_gbps": 4800.0}


def _pred(model, util, mem50, mem90, step, peak=None, gpu=H200):
    """A ``dprobe predict --json`` object with the fields the co-location models read."""
    peak = mem50 - CUDA_CONTEXT_BYTES if peak is None else peak
    return {"model": model, "batch": 8, "gpu_utilization": {"p50": util, "p90": util},
            "device_memory_bytes": {"p50": mem50, "p90": mem90}, "peak_memory_bytes": {"p50": peak, "p90": peak},
            "step_time_seconds": {"p50": step, "p90": step}, "gpu_spec": gpu,
            "analytical": {"flops_per_step": 1e12, "gpu_seconds_per_step": util * step,
                           "host_seconds_per_step": 0.2 * step, "step_time_seconds": step}}


def _gavel(key, gpu="v100"):
    return job_profile(key, gpu), GPU.of(load_profiles()["gpus"][gpu])


# the per-job model -----------------------------------------------------------------------------------------

def test_each_job_of_a_pair_gets_its_own_speed():
    """Gavel measured ResNet-18 (batch 16) at 0.98 of its speed beside Recommendation (batch 512) on a V100,
    and Recommendation at 0.05 beside it: the per-job model says who suffers, in either order."""
    resnet, v100 = _gavel("ResNet-18|16")
    recommender, _ = _gavel("Recommendation|512")
    out = predict_colocation(resnet, recommender, v100)
    assert out["method"] == "per-job"  # a V100, vision and recommendation jobs: inside its support
    fast, slow = out["speeds"]
    assert fast > 0.6 and slow < 0.3
    assert predict_colocation(recommender, resnet, v100)["speeds"] == pytest.approx([slow, fast])
    # the rules give both jobs one speed
    for method in ("time-share", "contention"):
        same = predict_colocation(resnet, recommender, v100, method=method)["speeds"]
        assert same[0] == pytest.approx(same[1])


def test_shipped_model_follows_the_measured_pairs():
    """On every measured Gavel pair the shipped trees, with the shipped profiles, are close to what was
    measured (they were fitted there) where the rules are far off: the files belong together."""
    pairs = load_pairs()
    rows = pairs[pairs["measured"]].sample(150, random_state=0)
    profiles = load_profiles()
    err = {m: [] for m in ("per-job", "time-share")}
    for r in rows.itertuples():
        gpu = GPU.of(profiles["gpus"][r.gpu])
        for m in err:
            got = predict_colocation(job_profile(r.a, r.gpu), job_profile(r.b, r.gpu), gpu, method=m)
            err[m].append(abs(got["speeds"][0] - r.speed))
    assert np.mean(err["per-job"]) < 0.07 < 0.3 < np.mean(err["time-share"])


def test_default_is_the_per_job_model_only_inside_its_support():
    """``auto`` runs the per-job model for a pair on an architecture, of job classes and utilisations its
    measured pairs covered, and only because it beat the rule on every architecture and class left out;
    elsewhere the rule, and the output says why."""
    fitted = load_fitted()
    summary = fitted.summary
    assert fitted.per_job_default == all(f["mae"]["per-job"] < f["mae"]["time-share"]
                                         for k in ("leave_gpu_out", "leave_class_out") for f in summary[k]["folds"])
    assert fitted.per_job_default and set(fitted.support.generations) == {"kepler", "pascal", "volta"}
    assert set(fitted.support.classes) == {"vision", "language", "recommendation", "reinforcement", "generative"}
    lm, v100 = _gavel("LM|20")
    inside = predict_colocation(lm, job_profile("A3C|", "v100"), v100)
    assert inside["method"] == "per-job" and inside["support"] == {"inside": True, "outside": []}
    assert inside["classes"] == ["language", "reinforcement"]
    # an H200 (Hopper): outside, whatever the jobs
    a, b = _pred("resnet50", 0.5, 10 * GIB, 12 * GIB, 0.1), _pred("bert", 0.3, 8 * GIB, 9 * GIB, 0.05)
    out = predict_colocation(a, b)
    assert out["method"] == "time-share" and out["speeds"] == [1.0, 1.0]  # u 0.5 + 0.3: the GPU is not full
    assert "H200 SXM 141GB (hopper) is not an architecture it was fitted on" in out["why"]
    # a class it never saw, on a V100
    unknown = {**job_profile("LM|20", "v100"), "model": "module:my.pkg:factory"}
    out = predict_colocation(unknown, job_profile("A3C|", "v100"), v100)
    assert out["method"] == "time-share" and "job A's class (unknown)" in out["why"]
    mps = predict_colocation(lm, job_profile("A3C|", "v100"), v100, mode="mps")
    assert mps["method"] == "time-share" and mps["why"].startswith("MPS")
    lost = FittedColocation(fitted.trees, per_job_default=False, support=fitted.support,
                            speed_p10_ratio=fitted.speed_p10_ratio)
    assert predict_colocation(lm, job_profile("A3C|", "v100"), v100, fitted=lost)["method"] == "time-share"
    with pytest.raises(ValueError, match="co-location method"):
        predict_colocation(a, b, method="oracle")


def test_the_lab_left_out_shows_why_the_support_matters():
    """Fitted on Gavel and asked about the pair measured on an H200 (another lab, another architecture),
    the per-job model is further off than the rule: that is why ``auto`` keeps it inside its support."""
    lab = load_fitted().summary["leave_lab_out"]
    assert lab["jobs"] >= 1
    assert lab["mae"]["per-job"] > lab["mae"]["time-share"]


def test_speed_intervals_come_from_left_out_sources():
    fitted = load_fitted()
    intervals = fitted.summary["intervals"]
    for method in ("per-job", "time-share"):
        shipped = intervals[method]
        assert fitted.speed_p10_ratio[method] == pytest.approx(shipped["ratio"], abs=1e-4)
        assert 0 < shipped["ratio"] < 1 and len(shipped["sources"]) >= 8
        covered = [s["coverage_left_out"] for s in shipped["sources"].values() if s["coverage_left_out"] is not None]
        assert np.median(covered) >= 0.8  # most sources never seen are covered at about the level
    lm, v100 = _gavel("LM|20")
    out = predict_colocation(lm, job_profile("A3C|", "v100"), v100)
    assert out["speeds_p10"] == pytest.approx([s * fitted.speed_p10_ratio["per-job"] for s in out["speeds"]])


def test_pair_memory_adds_what_sharing_adds():
    fitted = load_fitted()
    assert fitted.sharing_extra_bytes >= 0
    a, b = _pred("a", 0.5, 10 * GIB, 12 * GIB, 0.1), _pred("b", 0.3, 8 * GIB, 9 * GIB, 0.05)
    more = FittedColocation(fitted.trees, True, fitted.support, fitted.speed_p10_ratio, sharing_extra_bytes=GIB)
    out = predict_colocation(a, b, fitted=more)
    assert out["device_memory_bytes"] == {"p50": 19 * GIB, "p90": 22 * GIB} and out["sharing_extra_bytes"] == GIB


def test_time_share_rule_and_the_inputs_it_refuses():
    a, b = _pred("a", 0.7, 10 * GIB, 12 * GIB, 0.1), _pred("b", 0.6, 8 * GIB, 9 * GIB, 0.05)
    out = predict_colocation(a, b, method="time-share")
    assert out["speeds"] == pytest.approx([1 / 1.3, 1 / 1.3]) and out["time_share_speed"] == pytest.approx(1 / 1.3)
    with pytest.raises(ValueError, match="job B: its profile has no gpu_utilization"):
        predict_colocation(a, {k: v for k, v in b.items() if k != "gpu_utilization"})
    with pytest.raises(ValueError, match="names no GPU"):
        predict_colocation({k: v for k, v in a.items() if k != "gpu_spec"}, b)


def test_trees_predict_as_lightgbm_does():
    import lightgbm as lgb

    from dprobe.sharing.interference_fit import PARAMS, trees_from_lightgbm

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    y = np.tanh(x[:, 0]) + 0.3 * x[:, 1] * x[:, 2] + rng.normal(0, 0.05, 400)
    booster = lgb.train({**PARAMS, "min_data_in_leaf": 5}, lgb.Dataset(x, y), 50)
    trees = trees_from_lightgbm(booster.dump_model())
    probe = rng.normal(size=(100, 4))
    probe[::9, 1] = np.nan
    assert trees.predict(probe) == pytest.approx(booster.predict(probe), abs=1e-12)


def test_fitted_file_is_for_these_features():
    fitted = load_fitted()
    assert fitted.trees.feature.max() < len(FEATURES)
    assert set(fitted.gpus) == {g["name"] for g in load_profiles()["gpus"].values()}


# memory ----------------------------------------------------------------------------------------------------

def test_memory_verdict_from_peaks_and_contexts():
    gpu = {"name": "x", "memory_gib": 16.0, "fp32_tflops": 15.0, "bandwidth_gbps": 900}
    ok = predict_colocation(_pred("a", 0.5, 6 * GIB, 7 * GIB, 0.1, gpu=gpu), _pred("b", 0.3, 6 * GIB, 7 * GIB, 0.1,
                                                                               gpu=gpu), method="time-share")
    assert ok["fits"] == "yes"
    maybe = predict_colocation(_pred("a", 0.5, 6 * GIB, 9 * GIB, 0.1, gpu=gpu),
                               _pred("b", 0.3, 6 * GIB, 9 * GIB, 0.1, gpu=gpu), method="time-share")
    assert maybe["fits"] == "maybe"
    no = predict_colocation(_pred("a", 0.5, 9 * GIB, 9 * GIB, 0.1, peak=7 * GIB, gpu=gpu),
                            _pred("b", 0.3, 6 * GIB, 6 * GIB, 0.1, peak=7 * GIB, gpu=gpu), method="time-share")
    assert no["fits"] == "no" and no["peaks_and_contexts_bytes"] == 14 * GIB + 2 * CUDA_CONTEXT_BYTES


def test_memory_verdict_is_right_on_gavel_pairs():
    """A pair Gavel could not run together (throughput 0) is "no", one it ran is "yes" or "maybe", on at
    least 95 % of the pairs (nothing fitted: the rule sees only the two profiles and the GPU)."""
    from dprobe.sharing.interference_fit import fit_accuracy, gavel_jobs

    memory = fit_accuracy(gavel_jobs())
    assert memory["pairs"] == len(unordered_pairs(load_pairs()))
    assert memory["accuracy"] >= 0.95 > memory["always_fits"]


# the data set ----------------------------------------------------------------------------------------------

def test_pairs_loader_keeps_each_single_gpu_pair_once_per_job(tmp_path):
    header = "gpu,model_a,batch_a,gpus_a,model_b,batch_b,gpus_b,alone_a,alone_b,colocated_a,colocated_b\n"
    rows = ["v100,LM,5,1,,,,10,,,",
            "v100,LM,5,1,A3C,,1,10,4,6,1",
            "v100,A3C,,1,LM,5,1,4,10,1,6",
            "v100_unconsolidated,LM,5,1,A3C,,1,10,4,6,1",
            "v100,LM,5,2,A3C,,2,10,4,0,0",
            "k80,LM,5,1,A3C,,1,3,2,0,0"]
    (tmp_path / "throughputs.csv").write_text(header + "\n".join(rows) + "\n")
    pairs = load_pairs(tmp_path)
    assert list(zip(pairs["gpu"], pairs["a"], pairs["b"], strict=True)) == [
        ("v100", "LM|5", "A3C|"), ("v100", "A3C|", "LM|5"), ("k80", "LM|5", "A3C|")]
    assert pairs["speed"].iloc[:2].tolist() == pytest.approx([0.6, 0.25])
    assert not pairs["measured"].iloc[2] and np.isnan(pairs["speed"].iloc[2])
    (tmp_path / "throughputs.csv").write_text("gpu,model_a\nv100,LM\n")
    with pytest.raises(ValueError, match="missing column"):
        load_pairs(tmp_path)


def test_bundled_pairs_and_profiles_agree():
    pairs = load_pairs()
    measured = pairs[pairs["measured"]]
    assert len(measured) > 1000 and set(measured["gpu"]) <= set(load_profiles()["gpus"])
    profiles = {j["key"] for j in load_profiles()["jobs"]}
    assert set(pairs["a"]) | set(pairs["b"]) <= profiles  # every job type of the data has its profile
    assert job_key("A3C", float("nan")) == "A3C|" and job_key("LM", 5.0) == "LM|5"
    for name, train, held in leave_model_type_out(measured):
        involved = (measured["model_a"] == name) | (measured["model_b"] == name)
        assert set(held) == set(np.flatnonzero(involved.to_numpy())) and not set(train) & set(held)


@pytest.mark.slow
def test_benchmark_reproduces_the_shipped_validation(script):
    """benchmarks/sharing_colocation.py refits per fold: its figures are the shipped file's, the per-job
    model beats the time-share rule on every architecture and job class left out, the lab left out is
    scored, the memory verdict passes."""
    import contextlib
    import io

    bench = script("benchmarks/sharing_colocation.py")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert bench.main(["--json"]) == 0
    out = json.loads(buf.getvalue())
    shipped = load_fitted()
    for cv in ("leave_model_type_out", "leave_gpu_out", "leave_class_out"):
        assert out[cv]["overall"] == pytest.approx(shipped.summary[cv]["overall"], abs=1e-9)
    for cv in ("leave_gpu_out", "leave_class_out"):
        for fold in out[cv]["folds"]:
            assert fold["mae"]["per-job"] < min(fold["mae"]["time-share"], fold["mae"]["contention"])
    assert out["leave_lab_out"]["mae"] == pytest.approx(shipped.summary["leave_lab_out"]["mae"], abs=1e-9)
    assert {m: i["ratio"] for m, i in out["intervals"].items()} == pytest.approx(shipped.speed_p10_ratio, abs=1e-4)
    assert out["support"] == shipped.support.as_dict()
    assert len(out["leave_model_type_out"]["folds"]) == load_pairs()["model_a"].nunique()
    assert all(out["targets"].values())
    assert out["leave_model_type_out"]["overall"]["per-job"] < out["symmetric_floor"]["mae"]


@pytest.mark.slow
def test_gavel_models_have_the_training_codes_shapes(script):
    """The re-implemented job types (tools/gavel_models.py) have their architectures' parameter counts."""
    import torch

    models = script("tools/gavel_models.py")
    with torch.device("meta"):  # shapes only: nothing allocated or initialised
        counts = {name: sum(p.numel() for p in getattr(models, name)().parameters())
                  for name in ("resnet18_cifar", "lstm_lm", "recommender", "a3c", "cyclegan", "transformer")}
    lstm = 2 * 4 * (200 * 200 * 2 + 2 * 200)
    assert counts["lstm_lm"] == 33278 * 200 + lstm + 200 * 33278 + 33278
    assert counts["recommender"] == 20108 * 200 + 200 + 200 * 20108 + 20108
    assert counts["resnet18_cifar"] == 11_173_962
    assert counts["a3c"] == (32 * 25 + 32) + (32 * 32 * 25 + 32) + (64 * 32 * 16 + 64) + (64 * 64 * 9 + 64) + \
        4 * 512 * (1024 + 512 + 2) + 513 + 6 * 513
    assert counts["cyclegan"] == 2 * 11_378_179 + 2 * 2_764_737  # CycleGAN's 9-block generator, PatchGAN
    layer = 4 * 512 * 512 + 4 * 512 + 2 * 512 * 2048 + 2048 + 512  # attention, feed-forward
    assert counts["transformer"] == 2 * 3000 * 512 + 6 * (layer + 2 * 1024) + 6 * (
        layer + 4 * 512 * 512 + 4 * 512 + 3 * 1024) + 2 * 1024  # embeddings, encoder, decoder, final norms
    assert set(load_pairs()["model_a"]) <= set(models.JOB_TYPES)


# dprobe predict --colocate ---------------------------------------------------------------------------------

def test_colocate_reports_both_slowdowns_memory_and_fit():
    out = colocate(_pred("a", 0.5, 30 * GIB, 40 * GIB, 0.1), _pred("b", 0.3, 20 * GIB, 30 * GIB, 0.2))
    assert [j["model"] for j in out["jobs"]] == ["a", "b"]
    model = out["interference_model"]
    assert model["method"] == "time-share" and not model["support"]["inside"]  # an H200: outside its support
    assert "p10 of each speed" in model["uncertainty"]
    lm, v100 = _gavel("LM|20")
    inside = colocate(lm, job_profile("A3C|", "v100"), v100)
    assert inside["interference_model"]["method"] == "per-job" and "MAE" in inside["interference_model"]["uncertainty"]
    assert [j["job_class"] for j in inside["jobs"]] == ["language", "reinforcement"]
    assert all(j["speed_p10"] <= j["speed"] and j["slowdown_p90"] >= j["slowdown"] for j in inside["jobs"])
    for j in out["jobs"]:
        assert 0 < j["speed"] <= 1 and j["step_time_colocated_seconds"] == pytest.approx(
            j["step_time_alone_seconds"] / j["speed"])
    assert out["combined_device_memory_bytes"]["p90"] == 70 * GIB and out["fits"] == "yes"
    small = {**H200, "memory_gib": 64.0}
    assert colocate(_pred("a", 0.5, 30 * GIB, 40 * GIB, 0.1, gpu=small), _pred("b", 0.3, 20 * GIB, 30 * GIB, 0.2),
                    small)["fits"] == "maybe"
    rule = colocate(_pred("a", 0.5, 2 * GIB, 2 * GIB, 0.1), _pred("b", 0.7, 2 * GIB, 2 * GIB, 0.2),
                    method="time-share")
    assert [j["speed"] for j in rule["jobs"]] == pytest.approx([1 / 1.2, 1 / 1.2])
    with pytest.raises(ValueError, match="gpu_utilization"):
        colocate({"model": "x"}, _pred("b", 0.3, 1, 1, 0.1))


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
        d = _pred(a.model, 0.4, 2e9, 2.5e9, 0.05)
        return SimpleNamespace(as_dict=lambda: d)

    assert run_colocate(args, predict) == 0
    assert seen == [("m1", 16, 160, None), ("m2", 16, None, 64)]
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] == "yes" and len(out["jobs"]) == 2 and out["interference_model"]["method"] == "time-share"
    args.sharing_mode = "mps"
    assert run_colocate(args, predict) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["interference_model"]["method"] == "time-share" and out["jobs"][0]["speed"] == 1.0
    args.sharing_mode, args.colocation_model, args.json = "time-slicing", "contention", False
    assert run_colocate(args, predict) == 0
    assert "by the contention model" in capsys.readouterr().out
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
