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
