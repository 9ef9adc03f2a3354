"""The shape-free kernel model (what a replayed kernel has: class, FLOPs, bytes) and the replay roofline's
``kernel-model`` option (dprobe.profiling.kernels.model, dprobe.profiling.coldstart.features)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.features import ROOFLINES, op_seconds, roofline_seconds
from dprobe.profiling.coldstart.inference import (
    InferenceStepModel,
    feature_frame,
    fit,
    predict_frame,
    predict_inference_step,
)
from dprobe.profiling.coldstart.memtrack import FORWARD, OP_CLASSES, ReplayOp
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.kernels import model as kernels
from dprobe.profiling.kernels.data import OPS, load_device_specs, load_neusight
from dprobe.profiling.kernels.model import (
    SHAPE_FREE_CLASSES,
    KernelModel,
    default_model,
    features,
    replay_efficiency,
    shape_free_class,
    shape_free_features,
)

NEUSIGHT = Path(__file__).resolve().parents[1] / "datasets" / "neusight-kernels"
C = {c: float(i) for i, c in enumerate(OP_CLASSES)}


def replay(ops: list[tuple[str, float, float, float]]) -> ReplayEstimate:
    """A forward replay of kernels (class, low precision, FLOPs, bytes)."""
    rows = [ReplayOp(float(FORWARD), C[c], low, f, b) for c, low, f, b in ops]
    flops = float(sum(r.flops for r in rows))
    return ReplayEstimate(peak_bytes=1e9, reserved_bytes=1.2e9, device_bytes=2e9, param_bytes=1e8, state_bytes=0,
                          steady_bytes=1e8, activation_bytes=5e8, flops=flops, matmul_flops=flops,
                          bytes_moved=float(sum(r.bytes_moved for r in rows)), kernels=float(len(rows)),
                          large_allocs=1.0, forward_only=1.0, ops=rows)


MIXED = replay([("elementwise", 1.0, 0.0, 6e6), ("elementwise", 0.0, 2e6, 3e8), ("norm", 1.0, 5e6, 2e7),
                ("matmul", 1.0, 2 * 8192.0**3, 3 * 8192.0**2 * 2), ("conv", 1.0, 4e10, 5e7),
                ("conv_grouped", 1.0, 1e8, 4e7), ("optimizer", 0.0, 1e6, 4e7)])


def test_every_neusight_op_and_replay_class_has_a_shape_free_class():
    assert set(shape_free_class(np.array(OPS))) == set(SHAPE_FREE_CLASSES)
    got = dict(zip(OPS, shape_free_class(np.array(OPS)), strict=True))
    assert got["linear"] == got["bmm"] == "matmul" and got["conv"] == "conv"
    assert got["ln"] == got["softmax"] == "norm" and got["gelu"] == got["add"] == "elementwise"
    assert list(shape_free_class(np.array(OP_CLASSES))) == ["elementwise", "norm", "matmul", "conv", "conv",
                                                           "elementwise"]
    with pytest.raises(ValueError, match="no shape-free class for op 'attention'"):
        shape_free_class(np.array(["add", "attention"]))


def test_shape_free_features_need_no_shapes_and_count_elements_by_their_size():
    spec = GPUS["rtx4090"]
    calls = pd.DataFrame({"op": ["add", "add", "linear"], "flops": [1e6, 1e6, 2e12], "bytes": [1.2e7, 1.2e7, 3e9],
                          "element_bytes": [4.0, 2.0, 4.0]})
    x = shape_free_features(calls, spec, 30e-6)
    assert list(x.columns) == ["op", "intensity", "balance", "l2", "roof_over_overhead", "elements_per_sm",
                               "flop_waves", "cores"]
    assert x["elements_per_sm"][1] - x["elements_per_sm"][0] == pytest.approx(math.log(2))  # fp16: twice the elements
    assert np.isnan(x["flop_waves"][0]) and np.isfinite(x["flop_waves"][2])
    assert list(x["op"]) == [SHAPE_FREE_CLASSES.index("elementwise")] * 2 + [SHAPE_FREE_CLASSES.index("matmul")]
    assert features(calls, spec, 30e-6, shapes=False).equals(x)
    assert "waves_128x128" in features(calls.assign(B=1.0, M=1e3, N=1e3, K=1e3), spec, 30e-6).columns


def test_a_shape_free_fit_round_trips_and_only_it_puts_replays_on_the_model(tmp_path):
    calls = load_neusight(NEUSIGHT, ops=("linear", "add", "softmax"))
    calls = calls.groupby("gpu").sample(400, random_state=0)
    model = kernels.fit(calls, load_device_specs(NEUSIGHT), shapes=False)
    assert model.shapes is False
    model.save(tmp_path / "k.json")
    back = KernelModel.load(tmp_path / "k.json")
    assert back.shapes is False and back.booster_text == model.booster_text
    ops = np.asarray(MIXED.ops, dtype=float)
    eff = replay_efficiency(ops, GPUS["rtx3090"], OP_CLASSES, model=back)
    assert eff.shape == (len(ops),) and (eff > 0).all()
    with pytest.raises(ValueError, match="shape-free"):
        replay_efficiency(ops, GPUS["rtx3090"], OP_CLASSES, model=default_model())


def test_the_shipped_shape_free_model_is_fitted_on_every_neusight_gpu():
    model = default_model(shapes=False)
    assert model.shapes is False and set(model.gpus) == set(load_device_specs(NEUSIGHT))
    assert model.p90_factor > 1 and model.overhead_s > 0


@pytest.mark.parametrize("gpu", ["rtx3090", "h100"])
def test_kernel_model_times_are_positive_one_a_kernel_and_leave_tensor_cores_plain(gpu):
    ops = np.asarray(MIXED.ops, dtype=float)
    plain = op_seconds(ops, "fp16", GPUS[gpu])
    kernel = op_seconds(ops, "fp16", GPUS[gpu], roofline="kernel-model")
    assert kernel.shape == plain.shape == (len(ops),) and (kernel > 0).all()
    tensor = np.isin(ops[:, 1], [C["matmul"], C["conv"], C["conv_grouped"]])
    np.testing.assert_array_equal(kernel[tensor], plain[tensor])
    assert not np.allclose(kernel[~tensor], plain[~tensor])  # the vector-unit kernels are the model's
    every = op_seconds(ops, "fp16", GPUS[gpu], roofline="kernel-model-all")
    np.testing.assert_array_equal(every[~tensor], kernel[~tensor])
    big_gemm = 3  # 8192^3: compute-bound, waves enough for every SM: the efficiency is near 1
    assert 0.6 < every[big_gemm] / plain[big_gemm] < 1.7


def test_fp32_gemms_without_tf32_run_on_the_vector_units_and_so_on_the_model():
    ops = np.asarray(replay([("matmul", 0.0, 2 * 8192.0**3, 3 * 8192.0**2 * 4)]).ops, dtype=float)
    spec = GPUS["a100"]
    with_tf32 = op_seconds(ops, "fp32", spec, tf32=True, roofline="kernel-model")
    assert with_tf32[0] == op_seconds(ops, "fp32", spec, tf32=True)[0]
    plain = op_seconds(ops, "fp32", spec, tf32=False)[0]
    vector = op_seconds(ops, "fp32", spec, tf32=False, roofline="kernel-model")[0]
    assert vector != plain and 0.6 < vector / plain < 1.7  # NeuSight's fp32 GEMMs of this size: near the peak


def test_the_step_roofline_takes_the_option_and_checks_it():
    spec = GPUS["rtx4090"]
    plain = roofline_seconds(MIXED, "fp16", spec)
    kernel = roofline_seconds(MIXED, "fp16", spec, roofline="kernel-model")
    assert kernel["gpu"] != plain["gpu"] and kernel["compute"] == plain["compute"]
    assert kernel["memory"] == plain["memory"] and kernel["host"] == plain["host"]
    per_op = op_seconds(MIXED.ops, "fp16", spec, roofline="kernel-model")
    assert roofline_seconds(MIXED, "fp16", spec, per_op=per_op)["gpu"] == kernel["gpu"]
    with pytest.raises(ValueError, match="unknown roofline 'fast'"):
        roofline_seconds(MIXED, "fp16", spec, roofline="fast")
    with pytest.raises(ValueError, match="6 kernel times for 7 kernels"):
        roofline_seconds(MIXED, "fp16", spec, per_op=per_op[:6])


def test_training_features_take_the_roofline_asked_for_plain_by_default():
    """The cold-start profiler's job features (``benchmarks/coldstart_gpus.py --roofline``): plain unless
    asked, the kernel model moving the GPU time and the roofline step but not the FLOPs or the bytes."""
    from dprobe.profiling.coldstart.features import FEATURES
    from dprobe.profiling.coldstart.job import job_inputs
    from dprobe.profiling.coldstart.stack import default_stack

    gpu, stack = GPUS["h200"], default_stack("h200")
    plain = job_inputs("timm:resnet18", 8, "bf16", "adamw", gpu=gpu, stack=stack, est=MIXED)
    same = job_inputs("timm:resnet18", 8, "bf16", "adamw", gpu=gpu, stack=stack, est=MIXED, roofline="plain")
    kernel = job_inputs("timm:resnet18", 8, "bf16", "adamw", gpu=gpu, stack=stack, est=MIXED,
                        roofline="kernel-model")
    np.testing.assert_array_equal(plain.feats, same.feats)
    at = {name: i for i, name in enumerate(FEATURES)}
    assert kernel.feats[at["log_t_gpu"]] != plain.feats[at["log_t_gpu"]]
    assert kernel.feats[at["log_t_compute"]] == plain.feats[at["log_t_compute"]]
    assert kernel.feats[at["log_t_memory"]] == plain.feats[at["log_t_memory"]]
    assert kernel.base[3] != plain.base[3]  # the analytical step time is the roofline's
    with pytest.raises(ValueError, match="unknown roofline 'fast'"):
        job_inputs("timm:resnet18", 8, "bf16", "adamw", gpu=gpu, stack=stack, est=MIXED, roofline="fast")


def test_batched_features_equal_one_replay_at_a_time():
    other = replay([("elementwise", 1.0, 0.0, 5e8), ("matmul", 1.0, 1e11, 1e8)])
    gpus = [GPUS["rtx3090"], GPUS["rtx5090"], GPUS["rtx3090"]]
    batched = feature_frame([MIXED, other, other], "fp16", gpus, roofline="kernel-model")
    for i, (est, gpu) in enumerate(zip([MIXED, other, other], gpus, strict=True)):
        alone = feature_frame([est], "fp16", gpu, roofline="kernel-model")
        pd.testing.assert_frame_equal(batched.iloc[[i]].reset_index(drop=True), alone)
    assert not batched.equals(feature_frame([MIXED, other, other], "fp16", gpus))


def test_a_step_model_records_its_roofline_and_predicts_on_it(tmp_path):
    rng = np.random.default_rng(0)
    rows, ests = [], []
    for i in range(30):
        est = replay([("elementwise", 1.0, 0.0, float(rng.lognormal(19, 1))), ("norm", 1.0, 1e6, 2e7),
                      ("matmul", 1.0, float(rng.lognormal(24, 1)), 1e8)])
        for gpu in ("rtx3090", "rtx4090", "rtx5090"):
            step = roofline_seconds(est, "fp16", GPUS[gpu])["roof"] * float(rng.lognormal(0.2, 0.05))
            rows.append({"model": f"m{i}", "family": f"f{i % 6}", "gpu": gpu, "precision": "fp16",
                         "step_time_s": step})
            ests.append(est)
    runs = pd.DataFrame(rows)
    model = fit(runs, ests, roofline="kernel-model")
    assert model.roofline == "kernel-model" and fit(runs, ests).roofline == "plain"
    model.save(tmp_path / "m.json")
    back = InferenceStepModel.load(tmp_path / "m.json")
    assert back.roofline == "kernel-model"
    spec = GPUS["l4"]  # a GPU the step model never saw
    rule = back.as_rule()
    p50, _ = predict_inference_step(ests[0], "fp16", spec, model=rule)
    roof = roofline_seconds(ests[0], "fp16", spec, roofline="kernel-model")["roof"]
    assert p50 == pytest.approx(roof * rule.rule_factor)
    assert roof != roofline_seconds(ests[0], "fp16", spec)["roof"]
    with pytest.raises(ValueError, match="features on the plain roofline, but the model was fitted on the "
                                         "kernel-model one"):
        predict_frame(feature_frame(ests[:3], "fp16", spec).iloc[1:], model=back)
    (tmp_path / "bad.json").write_text((tmp_path / "m.json").read_text().replace('"kernel-model"', '"fast"'))
    with pytest.raises(ValueError, match="unknown roofline 'fast'"):
        InferenceStepModel.load(tmp_path / "bad.json")
    assert set(ROOFLINES) == {"plain", "kernel-model", "kernel-model-all"}


def test_an_inference_prediction_on_a_gpu_spec_file_is_on_the_kernel_model_roofline(tmp_path, capsys):
    """``dprobe predict --gpu-spec FILE --mode inference``: the shipped step model's roofline (the kernel
    model's, which beat the plain one on GPUs left out) is what it predicts on and what its JSON says."""
    from dprobe.cli import main
    from dprobe.core.gpus import load_gpu_spec
    from dprobe.profiling.coldstart.features import analytical_for
    from dprobe.profiling.coldstart.inference import SHIPPED_ROOFLINE
    from dprobe.profiling.coldstart.inference import default_model as shipped_step_model

    assert SHIPPED_ROOFLINE == "kernel-model" and shipped_step_model().roofline == SHIPPED_ROOFLINE
    spec_file = tmp_path / "gpu.json"
    spec_file.write_text('{"name": "Test GPU", "memory_gib": 48, "fp32_tflops": 40, "fp16_tflops": 160, '
                         '"bandwidth_gbps": 1200, "sm_count": 100, "l2_mib": 64, "boost_clock_mhz": 2200}')
    assert main(["predict", "timm:resnet18", "--batch", "16", "--image", "64", "--precision", "fp16",
                 "--mode", "inference", "--gpu-spec", str(spec_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["roofline"] == "kernel-model" and out["gpu_seen_in_training"] is False
    est = analytical_for("timm:resnet18", 16, "fp16", "none", image=64, mode="inference")
    spec = load_gpu_spec(spec_file)
    p50, _ = predict_inference_step(est, "fp16", spec)
    assert out["step_time_seconds"]["p50"] == pytest.approx(max(p50, out["analytical"]["host_seconds_per_step"]))
    plain = predict_inference_step(est, "fp16", spec, model=replace(shipped_step_model(), roofline="plain"))[0]
    assert plain != pytest.approx(p50)  # the roofline is not a label: the features are computed on it
