"""``dprobe predict --mode inference``: a forward pass in eval mode, through the path the inference
cross-validation scores."""

from __future__ import annotations

import json

import pytest

from dprobe.cli import main
from dprobe.core.gpus import GPUS
from dprobe.graph.zoo import parse_spec
from dprobe.profiling.coldstart.features import analytical_for, replay_cache_path
from dprobe.profiling.coldstart.inference import predict_inference_step
from dprobe.profiling.coldstart.memory_sources import load_sources
from dprobe.profiling.coldstart.predict import predict_job
from dprobe.profiling.coldstart.replay import replay_inference_step, replay_training_step


def test_an_inference_step_holds_no_gradients_states_or_backward() -> None:
    spec = parse_spec("torchvision:resnet18")
    infer = replay_inference_step(spec, batch=8, precision="fp16", image=64)
    train = replay_training_step(spec, batch=8, precision="fp16", optimizer="adamw", image=64)
    assert infer.forward_only == 1.0 and train.forward_only == 0.0
    assert infer.state_bytes == 0 and infer.param_bytes == pytest.approx(4 * 11_689_512, rel=0.01)
    assert {op.phase for op in infer.ops} == {0.0}  # forward ops only
    # no backward (about twice the forward's FLOPs): under a third of the training step's
    assert infer.flops < train.flops / 2.5
    # activations freed as the forward goes: the peak is far below a training step's
    assert infer.peak_bytes < 0.5 * train.peak_bytes


def test_the_replay_cache_keeps_inference_apart_from_training(tmp_path) -> None:
    train = replay_cache_path("torchvision:resnet18", 8, "fp16", "adamw", 64, cache_dir=tmp_path)
    infer = replay_cache_path("torchvision:resnet18", 8, "fp16", "adamw", 64, cache_dir=tmp_path, mode="inference")
    assert train != infer and infer == replay_cache_path("torchvision:resnet18", 8, "fp16", "sgd", 64,
                                                         cache_dir=tmp_path, mode="inference")
    est = analytical_for("torchvision:resnet18", 8, "fp16", "none", image=64, cache_dir=tmp_path, mode="inference")
    assert infer.is_file() and est.forward_only == 1.0
    with pytest.raises(ValueError, match="unknown mode"):
        analytical_for("torchvision:resnet18", 8, "fp16", "adamw", image=64, mode="serve")


def test_the_cli_prints_what_the_cross_validation_scores(capsys) -> None:
    """The CLI's step time is predict_inference_step's on the same replay (what crossval calls)."""
    assert main(["predict", "timm:resnet18", "--batch", "64", "--image", "96", "--precision", "fp16",
                 "--mode", "inference", "--gpu", "rtx4090", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "inference" and out["optimizer"] == "none" and "learnt from fp16" not in out["note"]
    est = analytical_for("timm:resnet18", 64, "fp16", "none", image=96, mode="inference")
    p50, p90 = predict_inference_step(est, "fp16", GPUS["rtx4090"])
    host = out["analytical"]["host_seconds_per_step"]
    assert out["step_time_seconds"]["p50"] == pytest.approx(max(p50, host), rel=1e-9)
    assert out["step_time_seconds"]["p90"] == pytest.approx(max(p90, host), rel=1e-9)
    assert out["analytical"]["optimizer_state_bytes"] == 0
    # an RTX 4090: no source measured its memory, so the replay's is scaled by the spread between those that did
    assert out["memory_calibration"]["source"] == "none measured"
    assert out["peak_memory_bytes"]["p50"] == int(est.peak_bytes * load_sources().p50_factor)
    assert out["stack"]["preset"] == "timm-infer" and out["fits"] == "yes"  # what the step model learnt from
    train = predict_job("timm:resnet18", 64, "fp16", "sgd", image=96, gpu="rtx4090")
    assert train.mode == "train" and train.as_dict()["mode"] == "train"
    assert out["peak_memory_bytes"]["p50"] < train.peak_memory_bytes.p50
    assert out["step_time_seconds"]["p50"] < train.step_time_seconds.p50


def test_inference_defaults_to_the_stack_the_step_model_learnt_from() -> None:
    from dprobe.profiling.coldstart.stack import STACKS, resolve_stack

    # the RTX 3090's training rows were timm's 2022 stack; its inference rows PyTorch 2.4's
    assert resolve_stack("rtx3090").preset == "timm-2022"
    assert resolve_stack("rtx3090", mode="inference") == STACKS["timm-infer"] == resolve_stack("h200", mode="inference")
    unfused = resolve_stack("rtx3090", {"attention": "unfused"}, mode="inference")
    assert unfused.preset == "timm-infer" and unfused.attention == "unfused" and unfused.overrides == ("attention",)


@pytest.mark.parametrize(("extra", "message"), [
    (["--optimizer", "sgd"], "--optimizer is a training setting"),
    (["--grad-checkpointing"], "--grad-checkpointing is a training setting"),
    (["--gpus", "2"], "--gpus and --colocate predict training jobs"),
])
def test_training_settings_are_refused_in_inference_mode(capsys, extra, message) -> None:
    assert main(["predict", "torchvision:resnet18", "--batch", "2", "--mode", "inference", *extra]) == 2
    assert message in capsys.readouterr().err


def test_inference_mode_refuses_samples_and_onnx(tmp_path, capsys) -> None:
    samples = tmp_path / "s.csv"
    samples.write_text("timestamp, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n")
    assert main(["predict", "torchvision:resnet18", "--batch", "2", "--mode", "inference",
                 "--samples", str(samples)]) == 2
    err = capsys.readouterr().err
    assert "--mode inference" in err
    with pytest.raises(ValueError, match="ONNX file is estimated for training only"):
        predict_job(str(tmp_path / "m.onnx"), 2, mode="inference")


def test_a_precision_the_step_model_never_saw_is_noted() -> None:
    fp32 = predict_job("torchvision:resnet18", 256, "fp32", image=64, gpu="rtx3090", mode="inference")
    fp16 = predict_job("torchvision:resnet18", 256, "fp16", image=64, gpu="rtx3090", mode="inference")
    assert "learnt from fp16 autocast runs only" in fp32.note and "learnt from fp16" not in fp16.note
    assert fp32.analytical.gpu_seconds_per_step > fp16.analytical.gpu_seconds_per_step  # fp32 peaks are lower


def test_the_nearest_measured_gpu_is_of_the_same_architecture_first_then_of_the_nearest_figures() -> None:
    from dataclasses import replace

    from dprobe.profiling.coldstart.inference import default_model

    model = default_model()
    pro = replace(GPUS["rtx5090"], name="RTX PRO 6000 Blackwell", peak_flops_fp16=503.8e12)
    a6000 = replace(GPUS["rtx3090"], name="RTX A6000", bandwidth=768e9, peak_flops_fp16=154.8e12)
    assert model.nearest(pro.name, pro.bandwidth, pro.peak_half("fp16")) == "GeForce RTX 5090"
    assert model.nearest(a6000.name, a6000.bandwidth, a6000.peak_half("fp16")) == "GeForce RTX 3090"
    # no Hopper was measured: the nearest bandwidth and tensor-core peak (the 5090's, of the three)
    h200 = GPUS["h200"]
    assert model.nearest(h200.name, h200.bandwidth, h200.peak_half("fp16")) == "GeForce RTX 5090"
    assert model.nearest("GeForce RTX 4090", 1008e9, 165.2e12) is None  # a GPU with rows has its own


def test_a_spec_sheet_gpu_takes_the_nearest_factor_only_where_it_beat_the_current_method_everywhere() -> None:
    from dataclasses import replace

    from dprobe.profiling.coldstart.features import analytical_for
    from dprobe.profiling.coldstart.inference import FoldResult, Scores, choose, default_model, feature_frame

    def fold(model: float, rule: float, nearest: float) -> FoldResult:
        def sc(m: float) -> Scores:
            return Scores(m, 1.0, 0.9, 0.9)
        return FoldResult("f", 10, ("x",), sc(20), sc(rule), sc(model), sc(rule), sc(nearest))

    family = [fold(9, 12, 12)]
    assert choose({"gpu": [fold(10, 12, 9), fold(11, 12, 10)], "family": family})[0] == "nearest-factor"
    assert choose({"gpu": [fold(10, 12, 9), fold(11, 12, 12)], "family": family})[0] == "learned"
    assert choose({"gpu": [fold(13, 12, 11), fold(13, 12, 11.5)], "family": family})[0] == "nearest-factor"
    assert choose({"gpu": [fold(13, 12, 11), fold(13, 12, 12.5)], "family": family})[0] == "rule"

    shipped = default_model()
    h100 = GPUS["h100"]
    method, why = shipped.explain(h100)
    folds = shipped.cv["folds"]["gpu"]
    assert method == shipped.method == "learned" and shipped.nearest_p90_factor > 1  # what the table decided
    assert not all(f["nearest"] < f["model"] for f in folds) and "did not beat it on every GPU left out" in why
    nearest = replace(shipped, method="nearest-factor")
    est = analytical_for("timm:resnet18", 64, "fp16", "none", image=96, mode="inference")
    p50, p90 = predict_inference_step(est, "fp16", h100, model=nearest)
    roof = float(feature_frame([est], "fp16", h100, shipped.roofline)["roof"].iloc[0])
    assert p50 == pytest.approx(roof * shipped.gpu_factors["GeForce RTX 5090"], rel=1e-9)
    assert p90 == pytest.approx(p50 * shipped.nearest_p90_factor, rel=1e-9)
    assert nearest.explain(h100)[0] == "nearest-factor" and "GeForce RTX 5090" in nearest.explain(h100)[1]


def test_the_nearest_factors_p90_comes_from_each_gpu_predicted_by_the_others() -> None:
    """Three GPUs whose steps sit at 1.0, 1.2 and 1.5 times their roofline: each left out is predicted by its
    nearest other GPU's factor, and those errors (not its own) set the widening."""
    import numpy as np
    import pandas as pd

    from dprobe.profiling.coldstart.inference import _nearest_log_ratios, p90_factor

    names = [GPUS[k].name for k in ("rtx3090", "rtx4090", "rtx5090")]
    factors = dict(zip(names, (1.0, 1.2, 1.5), strict=True))
    rows = [(n, GPUS[k].bandwidth, GPUS[k].peak_half("fp16")) for n, k in zip(names, ("rtx3090", "rtx4090", "rtx5090"),
                                                                              strict=True) for _ in range(4)]
    x = pd.DataFrame(rows, columns=["gpu_name", "gpu_bandwidth", "gpu_peak"])
    x["roof"] = 1e-3
    y = x["roof"].to_numpy() * np.array([factors[n] for n in x["gpu_name"]])
    ratios = _nearest_log_ratios(x, y, 1.1)
    # 3090 <- 4090 (the nearer bandwidth and peak), 4090 <- 5090, 5090 <- 4090
    assert [float(np.exp(r[0])) for r in ratios] == pytest.approx([1.0 / 1.2, 1.2 / 1.5, 1.5 / 1.2])
    assert p90_factor(ratios) == pytest.approx(1.25)
    assert _nearest_log_ratios(x[x["gpu_name"] == names[0]], y[:4], 1.1) == []  # one GPU: no spread to learn
