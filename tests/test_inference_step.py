"""Inference step time from a forward replay and a GPU's spec sheet (dprobe.profiling.coldstart.inference):
the rule, the learned model, their cross-validation and the shipped JSON."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.features import roofline_seconds as features_roofline
from dprobe.profiling.coldstart.inference import (
    DEFAULT_MODEL,
    FEATURES,
    FoldResult,
    InferenceModelError,
    InferenceStepModel,
    Scores,
    choose,
    crossval,
    default_model,
    feature_frame,
    fit,
    held_out_predictions,
    inference_features,
    predict_inference_step,
)
from dprobe.profiling.coldstart.memtrack import FORWARD, OP_CLASSES, ReplayOp
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.coldstart.timm_infer import cv_folds

GPU_KEYS = ("rtx3090", "rtx4090", "rtx5090")


def roofline_seconds(*args: object, **kwargs: object) -> dict[str, float]:
    """The inference model's roofline (grouped convolutions where ``inference.GROUPED_TENSOR`` puts them)."""
    from dprobe.profiling.coldstart.inference import GROUPED_TENSOR

    return features_roofline(*args, grouped_tensor=GROUPED_TENSOR, **kwargs)


def synthetic_est(rng: np.random.Generator, scale: float) -> ReplayEstimate:
    """A forward replay of random kernels (fp16 matmuls and convolutions, norms, element-wise ops)."""
    n = int(rng.integers(40, 200))
    mix = rng.dirichlet(np.full(5, 0.5))  # each model its own op mix
    cls = rng.choice([OP_CLASSES.index(c) for c in ("elementwise", "norm", "matmul", "conv", "conv_grouped")], n,
                     p=mix)
    tensor = np.isin(cls, [2, 3, 4])
    flops = np.where(tensor, rng.lognormal(22, 2, n), rng.lognormal(16, 1, n)) * scale
    moved = rng.lognormal(18, 1.5, n) * scale
    ops = [ReplayOp(float(FORWARD), float(c), 1.0, float(f), float(b)) for c, f, b in zip(cls, flops, moved,
                                                                                         strict=True)]
    return ReplayEstimate(peak_bytes=1e9, reserved_bytes=1.2e9, device_bytes=2e9, param_bytes=1e8, state_bytes=0,
                          steady_bytes=1e8, activation_bytes=5e8, flops=float(flops.sum()),
                          matmul_flops=float(flops[tensor].sum()), bytes_moved=float(moved.sum()), kernels=float(n),
                          large_allocs=10.0, forward_only=1.0, ops=ops)


@pytest.fixture(scope="module")
def synthetic() -> tuple[pd.DataFrame, list[ReplayEstimate]]:
    """60 models of 12 families on three GPUs; measured = roofline x a factor that depends on the op mix
    (element-wise-heavy models slower against their roofline) x noise."""
    rng = np.random.default_rng(0)
    models = [(f"m{i}", f"fam{i % 12}", synthetic_est(rng, float(rng.uniform(0.5, 4)))) for i in range(60)]
    rows, ests = [], []
    for gpu in GPU_KEYS:
        for name, fam, est in models:
            t = roofline_seconds(est, "fp16", GPUS[gpu])
            step = t["roof"] * (1.1 + 1.5 * t["share_elementwise"]) * float(rng.lognormal(0, 0.05))
            rows.append({"model": name, "family": fam, "image": 224, "batch": 256, "step_time_s": step, "gpu": gpu,
                         "precision": "fp16", "memory_format": "nchw", "pytorch": "2.4.0", "table": "t.csv"})
            ests.append(est)
    return pd.DataFrame(rows), ests


@pytest.fixture(scope="module")
def fitted(synthetic) -> InferenceStepModel:
    return fit(*synthetic)


def test_features_are_ratios_that_name_no_gpu(synthetic) -> None:
    _, ests = synthetic
    f = inference_features(ests[0], "fp16", GPUS["rtx4090"])
    assert list(f) == [*FEATURES, "roof"] and all(math.isfinite(v) for v in f.values())
    assert not any(key in name for name in FEATURES for key in (*GPUS, "gpu_", "model", "family"))
    # a renamed spec is the same GPU: nothing of the name reaches the features
    assert inference_features(ests[0], "fp16", replace(GPUS["rtx4090"], name="other")) == f
    assert f["roof"] == pytest.approx(roofline_seconds(ests[0], "fp16", GPUS["rtx4090"])["roof"])
    shares = sum(f[f"share_{c}"] for c in ("elementwise", "norm", "matmul", "conv", "conv_grouped"))
    assert shares == pytest.approx(1.0, abs=1e-6)  # no attention, no optimizer kernels in this replay


def test_the_rule_is_the_roofline_times_the_median_ratio(synthetic, fitted) -> None:
    runs, ests = synthetic
    x = feature_frame(ests, "fp16", [GPUS[g] for g in runs["gpu"]])
    ratios = runs["step_time_s"].to_numpy() / x["roof"].to_numpy()
    assert fitted.rule_factor == pytest.approx(float(np.median(ratios)), rel=1e-9)
    rule = fitted.as_rule()
    assert rule.method == "rule" and rule.booster_text is None and rule.p90_factor == fitted.rule_p90_factor
    p50, p90 = predict_inference_step(ests[0], "fp16", GPUS["rtx3090"], model=rule)
    assert p50 == pytest.approx(x["roof"].iloc[0] * fitted.rule_factor, rel=1e-9)
    assert p90 == pytest.approx(p50 * fitted.rule_p90_factor, rel=1e-9)
    assert fitted.method == "learned" and fitted.trained_on == list(GPU_KEYS) and fitted.rows == len(runs)
    assert fitted.p90_factor >= 1.0 and fitted.rule_p90_factor >= 1.0


def test_the_learned_model_finds_the_op_mix_the_rule_cannot(synthetic, fitted) -> None:
    runs, ests = synthetic
    results = crossval(runs, ests, "gpu")
    assert [r.fold for r in results] == [f"gpu={g}" for g in GPU_KEYS]
    assert [r.gpus for r in results] == [(g,) for g in GPU_KEYS] and sum(r.rows for r in results) == len(runs)
    for r in results:
        assert r.roofline.median_ratio < 1 and r.roofline.p90_coverage < 0.2  # the roofline is a lower bound
        assert r.model.mape < r.rule.mape and r.model.spearman >= r.rule.spearman - 0.01
        assert 0 <= r.model.p90_coverage <= 1


def test_crossval_predicts_through_the_public_entry_point(synthetic) -> None:
    """A held-out row's figures are predict_inference_step's with the model fitted on the other rows."""
    runs, ests = synthetic
    pred = held_out_predictions(runs, ests, "family")
    name, train, test = cv_folds(runs, by="family")[0]
    model = fit(runs.iloc[train].reset_index(drop=True), [ests[i] for i in train])
    for i in test[:5]:
        gpu = GPUS[runs["gpu"].iloc[i]]
        assert pred["fold"].iloc[i] == name
        assert (pred["model_p50"].iloc[i], pred["model_p90"].iloc[i]) == pytest.approx(
            predict_inference_step(ests[i], "fp16", gpu, model=model), rel=1e-9)
        assert (pred["rule_p50"].iloc[i], pred["rule_p90"].iloc[i]) == pytest.approx(
            predict_inference_step(ests[i], "fp16", gpu, model=model.as_rule()), rel=1e-9)
    assert pred[["rule_p50", "model_p50"]].notna().all().all()


def test_one_gpu_learns_its_p90_by_leaving_families_out(synthetic) -> None:
    runs, ests = synthetic
    one = np.flatnonzero(runs["gpu"].to_numpy() == "rtx3090")
    model = fit(runs.iloc[one].reset_index(drop=True), [ests[i] for i in one])
    assert model.trained_on == ["rtx3090"] and model.p90_factor >= 1.0 and model.rows == len(one)


def test_save_and_load_round_trip(tmp_path, fitted, synthetic) -> None:
    _, ests = synthetic
    path = tmp_path / "m.json"
    fitted.save(path)
    back = InferenceStepModel.load(path)
    gpu = GPUS["rtx5090"]
    assert predict_inference_step(ests[3], "fp16", gpu, model=back) == pytest.approx(
        predict_inference_step(ests[3], "fp16", gpu, model=fitted), rel=1e-12)
    rule_path = tmp_path / "rule.json"
    fitted.as_rule().save(rule_path)
    assert json.loads(rule_path.read_text())["booster_text"] is None
    assert InferenceStepModel.load(rule_path).method == "rule"


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: "{not json", "cannot read an inference model"),
    (lambda d: json.dumps([1, 2]), "not a dprobe inference model"),
    (lambda d: json.dumps({**d, "format": "dprobe-kernels/1"}), "not a dprobe inference model"),
    (lambda d: json.dumps({**d, "features": d["features"][:-1]}), "other features"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "rule_factor"}), "'rule_factor' missing"),
    (lambda d: json.dumps({**d, "p90_factor": -1}), "p90_factor must be a positive number"),
    (lambda d: json.dumps({**d, "method": "magic"}), "unknown method"),
    (lambda d: json.dumps({**d, "booster_text": "tree\nnonsense"}), "not a LightGBM model"),
    (lambda d: json.dumps({**d, "booster_text": None}), "needs its booster"),
    (lambda d: json.dumps({**d, "seen_method": "magic"}), "unknown seen_method"),
    (lambda d: json.dumps({**d, "seen_method": "gpu-factor", "gpu_factors": {}}), "needs its GPUs' factors"),
    (lambda d: json.dumps({**d, "gpu_factors": {"x": 0}}), "factor of x must be a positive number"),
])
def test_a_bad_model_file_is_refused_by_name(tmp_path, fitted, mutate, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(mutate(fitted.to_dict()))
    with pytest.raises(InferenceModelError, match=message) as info:
        InferenceStepModel.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(InferenceModelError, match="cannot read"):
        InferenceStepModel.load(tmp_path / "missing.json")


def test_the_shipped_model_loads_and_records_why_it_was_chosen(synthetic) -> None:
    """Each case against its simple rule, fold by fold: on a GPU never seen the learned correction only if it
    beat the rule on every GPU left out; on a GPU with rows only if it beat that GPU's own factor on every
    fifth of the families left out."""
    model = default_model()
    assert DEFAULT_MODEL.stat().st_size < 1 << 20
    assert set(model.trained_on) >= {"rtx3090", "rtx4090", "rtx5090"} and model.rows > 1000
    folds = model.cv["folds"]
    assert model.method == ("learned" if all(f["model"] < f["rule"] for f in folds["gpu"]) else "rule")
    assert model.seen_method == ("learned" if all(f["model"] < f["gpu_factor"] for f in folds["family"])
                                 else "gpu-factor")
    assert set(model.gpu_factors) == {GPUS[g].name for g in model.trained_on}
    assert 1.0 < model.rule_factor < 3.0 and model.p90_factor >= 1.0 and model.gpu_p90_factor >= 1.0
    _, ests = synthetic
    p50, p90 = predict_inference_step(ests[0], "fp16", GPUS["h200"])
    assert 0 < p50 <= p90


def test_a_gpu_with_rows_takes_its_own_factor_and_any_other_the_learned_correction(synthetic, fitted) -> None:
    _, ests = synthetic
    model = replace(fitted, seen_method="gpu-factor")
    seen, unseen = GPUS["rtx4090"], GPUS["h200"]
    roof = roofline_seconds(ests[2], "fp16", seen)["roof"]
    p50, p90 = predict_inference_step(ests[2], "fp16", seen, model=model)
    assert p50 == pytest.approx(roof * model.gpu_factors[seen.name]) and p90 == pytest.approx(p50 * model.gpu_p90_factor)
    assert model.method_for(seen.name) == "gpu-factor" and model.method_for(unseen.name) == "learned"
    assert predict_inference_step(ests[2], "fp16", unseen, model=model) == pytest.approx(
        predict_inference_step(ests[2], "fp16", unseen, model=fitted.as_learned()))
    # the factors differ by GPU as the synthetic data's do not: each is its own rows' median ratio
    assert set(model.gpu_factors) == {GPUS[g].name for g in GPU_KEYS}
    assert model.as_gpu_factor().method_for(unseen.name) == "rule"


def test_a_spec_sheet_sibling_of_a_measured_gpu_takes_its_factor_with_a_wider_p90(synthetic, fitted) -> None:
    """A GPU of no row, of a measured GPU's architecture and memory system (a workstation card on the RTX
    5090's chip), is anchored to that GPU's factor; its p90 is widened by the spread between the measured
    GPUs. Another memory system of the same architecture, or a new architecture, keeps ``method``."""
    _, ests = synthetic
    model = replace(fitted, seen_method="gpu-factor")
    five = GPUS["rtx5090"]
    sibling = replace(five, name="RTX PRO 6000 Blackwell", memory_bytes=96 * 2**30, sm_count=188)
    assert model.method_for(sibling.name, sibling.bandwidth) == "sibling-factor"
    roof = roofline_seconds(ests[4], "fp16", sibling)["roof"]
    p50, p90 = predict_inference_step(ests[4], "fp16", sibling, model=model)
    assert p50 == pytest.approx(roof * model.gpu_factors[five.name])
    assert model.between_gpu_spread() > 1.0
    assert p90 == pytest.approx(p50 * model.gpu_p90_factor * model.between_gpu_spread())
    slow_memory = replace(sibling, name="RTX 5060 (Blackwell)", bandwidth=five.bandwidth / 4)
    assert model.method_for(slow_memory.name, slow_memory.bandwidth) == model.method
    assert model.method_for("H200 SXM 141GB", GPUS["h200"].bandwidth) == model.method
    assert fitted.method_for(sibling.name, sibling.bandwidth) == fitted.method  # learned on seen GPUs: no anchor


def test_choose_takes_the_learned_correction_only_where_it_won_every_fold() -> None:
    def fold(model: float, rule: float, gpu_factor: float) -> FoldResult:
        def sc(m: float) -> Scores:
            return Scores(m, 1.0, 0.9, 0.9)
        return FoldResult("f", 10, ("x",), sc(20.0), sc(rule), sc(model), sc(gpu_factor))

    assert choose({"gpu": [fold(10, 12, 12), fold(11, 12, 12)], "family": [fold(9, 12, 10), fold(9, 12, 10)]}) == (
        "learned", "learned")
    assert choose({"gpu": [fold(10, 12, 12), fold(13, 12, 12)], "family": [fold(9, 12, 10), fold(11, 12, 10)]}) == (
        "rule", "gpu-factor")


@pytest.mark.slow
def test_the_shipped_model_predicts_a_real_replay() -> None:
    from dprobe.profiling.coldstart.features import analytical_for

    est = analytical_for("timm:resnet18", 8, "fp16", "none", image=224, mode="inference")
    p50, p90 = predict_inference_step(est, "fp16", GPUS["rtx4090"])
    roof = roofline_seconds(est, "fp16", GPUS["rtx4090"])["roof"]
    assert 0 < roof <= p50 <= p90 < 20 * roof
    assert p50 < 0.05  # a batch of 8 at 224 px on a 4090: milliseconds, not seconds
    with pytest.raises(ValueError, match="no kernels"):
        predict_inference_step(replace(est, ops=[]), "fp16", GPUS["rtx4090"])


def test_depthwise_convolutions_run_on_the_vector_units_in_the_inference_roofline() -> None:
    from dprobe.profiling.coldstart.features import op_peaks
    from dprobe.profiling.coldstart.memtrack import OP_CLASSES
    from dprobe.profiling.coldstart.replay import ReplayEstimate

    gpu = GPUS["rtx3090"]
    grouped, dense = OP_CLASSES.index("conv_grouped"), OP_CLASSES.index("conv")
    ops = np.array([[0, grouped, 1, 1e12, 1e6], [0, dense, 1, 1e12, 1e6]], dtype=float)
    assert np.allclose(op_peaks(ops, "fp16", gpu), gpu.peak_half("fp16"))  # the training profiler's, as before
    assert np.allclose(op_peaks(ops, "fp16", gpu, grouped_tensor=False), [gpu.peak_flops_fp32, gpu.peak_half("fp16")])
    est = ReplayEstimate(1e9, 1e9, 2e9, 1e6, 0, 1e6, 1e8, 2e12, 2e12, 2e6, 2, 0, forward_only=1.0,
                         ops=[tuple(o) for o in ops])
    x = inference_features(est, "fp16", gpu)
    # the depthwise kernel's FLOPs at the fp32 vector peak: its time is 1e12 / fp32 peak
    assert math.exp(x["log_t_compute"]) == pytest.approx(1e12 / gpu.peak_flops_fp32 + 1e12 / gpu.peak_half("fp16"))
