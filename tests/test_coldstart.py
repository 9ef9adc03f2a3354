"""Tests of dprobe.profiling.coldstart: meta replay, features, training, CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dprobe.graph.zoo import parse_spec
from dprobe.profiling.coldstart import crossval
from dprobe.profiling.coldstart import fit as cs_fit
from dprobe.profiling.coldstart import train as cs_train
from dprobe.profiling.coldstart.checkpoint import VERSION, load_checkpoint
from dprobe.profiling.coldstart.crossval import cross_validate
from dprobe.profiling.coldstart.dataset import ProfileDataset, make_dataset
from dprobe.profiling.coldstart.features import FEATURES, family_of
from dprobe.profiling.coldstart.memtrack import round_alloc
from dprobe.profiling.coldstart.model import TARGETS
from dprobe.profiling.coldstart.replay import replay_training_step
from dprobe.profiling.coldstart.residual import predict_residuals

TINY_GPT2 = '{"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 64}'


def test_round_alloc() -> None:
    assert round_alloc(1) == 512 and round_alloc(512) == 512 and round_alloc(513) == 1024 and round_alloc(0) == 0


def test_features_constant_in_training_are_held_at_their_training_value() -> None:
    from dprobe.profiling.coldstart.model import ColdStartModel, constant_features, fit_standardisation

    x = torch.tensor([[1.0, 0.0, 5.0], [3.0, 0.0, 5.0], [2.0, 0.0, 5.0]])  # features 1 and 2 never vary
    model = ColdStartModel(3, graph_dim=0).eval()
    mu, sd = fit_standardisation(x)
    model.mu.copy_(mu)
    model.sd.copy_(sd)
    assert constant_features(model) == [1, 2]
    seen = torch.tensor([[2.5, 0.0, 5.0]])
    unseen = torch.tensor([[2.5, 1.0, 9.0]])  # e.g. fp16, or another GPU's memory
    torch.testing.assert_close(model(None, unseen), model(None, seen))
    assert not torch.equal(model(None, torch.tensor([[1.5, 0.0, 5.0]])), model(None, seen))


def test_family_rule() -> None:
    assert family_of("resnet50") == family_of("resnet18") == "resnet"
    assert family_of("bert-large") == family_of("bert-base") == "bert"
    assert family_of("gpt2-medium") == family_of("gpt2")
    assert family_of("vit_b_16") == "vit"


def test_replay_resnet18_memory_accounting() -> None:
    spec = parse_spec("torchvision:resnet18")
    sgd = replay_training_step(spec, batch=4, precision="fp32", optimizer="sgd", image=64)
    adam = replay_training_step(spec, batch=4, precision="fp32", optimizer="adamw", image=64)
    pbytes = 11_689_512 * 4
    assert abs(sgd.param_bytes - pbytes) / pbytes < 0.01
    assert abs(sgd.state_bytes - pbytes) / pbytes < 0.02  # momentum buffers
    assert abs(adam.state_bytes - 2 * pbytes) / pbytes < 0.05  # exp_avg, exp_avg_sq (+ step counters)
    assert adam.peak_bytes > adam.steady_bytes + pbytes  # gradients and activations on top
    assert sgd.flops > 0 and sgd.kernels > 50


def test_replay_bf16_autocast_saves_memory() -> None:
    spec = parse_spec("transformers:GPT2Config/GPT2LMHeadModel", TINY_GPT2)
    fp32 = replay_training_step(spec, batch=8, precision="fp32", seq=64)
    bf16 = replay_training_step(spec, batch=8, precision="bf16", seq=64)
    assert bf16.activation_bytes < fp32.activation_bytes
    with pytest.raises(ValueError, match="precision"):
        replay_training_step(spec, batch=8, precision="int3", seq=64)


@pytest.mark.slow
def test_bf16_pure_holds_weights_gradients_and_states_in_bf16(tmp_path, capsys) -> None:
    from dprobe.cli import main

    spec = parse_spec("torchvision:resnet18")
    mixed = replay_training_step(spec, batch=8, precision="bf16", image=64)
    pure = replay_training_step(spec, batch=8, precision="bf16-pure", image=64)
    params = 11_689_512  # resnet18's parameters, in bytes per dtype below
    assert mixed.param_bytes == pytest.approx(4 * params, rel=0.02) and pure.param_bytes == pytest.approx(
        2 * params, rel=0.02)  # (with buffers and the input batch)
    assert pure.state_bytes == pytest.approx(mixed.state_bytes / 2, rel=0.02)  # AdamW's moments follow the weights
    assert pure.kernels < mixed.kernels  # no casts of fp32 weights to bf16
    assert pure.flops == mixed.flops
    assert main(["predict", "torchvision:resnet18", "--batch", "8", "--image", "64", "--precision", "bf16-pure",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "bf16-pure" in out["note"] and out["analytical"]["param_bytes"] == int(pure.param_bytes)
    onnx = tmp_path / "m.onnx"
    torch.onnx.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),), str(onnx), dynamo=False)
    assert main(["predict", str(onnx), "--batch", "8", "--precision", "bf16-pure"]) == 2
    assert "needs the model as a module" in capsys.readouterr().err


@pytest.mark.slow
def test_grad_checkpointing_keeps_layer_inputs_and_recomputes(capsys) -> None:
    from dprobe.cli import main

    spec = parse_spec("transformers:GPT2Config/GPT2LMHeadModel", TINY_GPT2)
    for precision in ("fp32", "bf16"):  # bf16: autocast is re-entered for the recomputation
        plain = replay_training_step(spec, batch=8, precision=precision, seq=64)
        gc = replay_training_step(spec, batch=8, precision=precision, seq=64, grad_checkpointing=True)
        assert gc.activation_bytes < plain.activation_bytes / 2 and gc.peak_bytes < plain.peak_bytes
        assert plain.flops < gc.flops < 1.5 * plain.flops  # the layers' forward once more
        assert gc.param_bytes == plain.param_bytes and gc.state_bytes == plain.state_bytes
    args = ["predict", "transformers:GPT2Config/GPT2LMHeadModel", "--config-kwargs", TINY_GPT2, "--seq", "64",
            "--batch", "8", "--precision", "bf16", "--json"]
    assert main(args) == 0
    without = json.loads(capsys.readouterr().out)
    assert main([*args, "--grad-checkpointing"]) == 0
    with_gc = json.loads(capsys.readouterr().out)
    assert with_gc["grad_checkpointing"] and "gradient checkpointing" in with_gc["note"]
    assert with_gc["analytical"]["activation_bytes"] < without["analytical"]["activation_bytes"]
    assert with_gc["step_time_seconds"]["p50"] > without["step_time_seconds"]["p50"]  # never faster
    assert with_gc["gpu_utilization"] == without["gpu_utilization"]
    # timm's switch: its checkpoint calls get the same arguments for the replay, and are left as they were
    import torch.utils.checkpoint

    original = torch.utils.checkpoint.checkpoint
    timm_spec = parse_spec("timm:resnet18")
    plain = replay_training_step(timm_spec, batch=8, precision="bf16", image=64)
    gc = replay_training_step(timm_spec, batch=8, precision="bf16", image=64, grad_checkpointing=True)
    assert gc.activation_bytes < plain.activation_bytes and plain.flops < gc.flops < 1.5 * plain.flops
    assert torch.utils.checkpoint.checkpoint is original
    assert main(["predict", "torchvision:resnet18", "--batch", "8", "--grad-checkpointing"]) == 2
    assert "gradient checkpointing is replayed for transformers and timm models" in capsys.readouterr().err


@pytest.mark.parametrize(("kv_heads", "enable_gqa", "fused"), [(12, False, True), (1, False, False), (4, True, True)])
def test_attention_replays_the_kernel_cuda_would_pick(kv_heads, enable_gqa, fused) -> None:
    """SDPA's fused kernels keep q, k, v and the output; a key and value broadcast over the heads (multi-query
    attention passed as is) fall back to the math kernel, which keeps the fp32 attention matrix."""
    from dprobe.profiling.coldstart.autocast import AutocastEmulation, fused_attention_applies
    from dprobe.profiling.coldstart.memtrack import MemoryTracker

    b, h, n, d = 2, 12, 1024, 64
    with torch.device("meta"):
        q = torch.randn(b, h, n, d, requires_grad=True)
        k, v = (torch.randn(b, kv_heads, n, d, requires_grad=True) for _ in range(2))
        mask = torch.zeros(b, 1, n, n)
    assert fused_attention_applies(q, k, v, enable_gqa) is fused
    tracker = MemoryTracker()
    for t in (q, k, v, mask):
        tracker.track(t)
    before = tracker.current
    with tracker, AutocastEmulation(torch.bfloat16):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
    kept = tracker.current - before
    assert out.shape == (b, h, n, d) and out.dtype == torch.bfloat16
    attention_matrix = b * h * n * n * 4
    assert (kept >= attention_matrix) is not fused
    assert kept < attention_matrix / 4 or not fused


def test_unfused_attention_keeps_the_attention_matrix() -> None:
    """A stack without fused kernels runs attention as matmuls and a softmax: under fp16 autocast the scores
    in fp16, the softmax's fp32 output kept for backward, no fused-attention FLOPs; the fused stand-in keeps
    none of it."""
    from dprobe.profiling.coldstart.autocast import AutocastEmulation
    from dprobe.profiling.coldstart.memtrack import MemoryTracker

    b, h, n, d = 2, 4, 256, 32
    kept = {}
    for fused in (True, False):
        with torch.device("meta"):
            q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
        tracker = MemoryTracker()
        for t in (q, k, v):
            tracker.track(t)
        before = tracker.current
        with tracker, AutocastEmulation(torch.float16, fused_attention=fused) as emul:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert out.shape == (b, h, n, d) and out.dtype == torch.float16
        kept[fused] = tracker.current - before
        assert (emul.attention_flops > 0) is fused
    matrix = b * h * n * n
    assert kept[True] < 2 * matrix <= 6 * matrix <= kept[False]  # bytes: fp32 softmax output and its fp16 copy


def test_the_stack_is_an_input_with_a_default_per_gpu() -> None:
    from dprobe.profiling.coldstart.stack import STACKS, resolve_stack, stack_of_record

    assert resolve_stack("h200") == STACKS["h200-profiles"] == resolve_stack("a100")
    timm = resolve_stack("rtx3090")
    assert (timm.preset, timm.torch, timm.cudnn_benchmark, timm.attention) == ("timm-2022", "1.12", True, "unfused")
    mixed = resolve_stack("rtx3090", {"cudnn_benchmark": False, "memory_format": "nhwc"})
    assert mixed.preset == "timm-2022" and mixed.overrides == ("cudnn_benchmark", "memory_format")
    assert not mixed.cudnn_benchmark and mixed.attention == "unfused"
    # a PyTorch before 2.0 had no scaled_dot_product_attention: unfused unless told, and fused refused
    assert resolve_stack("h200", {"torch": "1.13.1+cu117"}).attention == "unfused"
    assert resolve_stack("h200", {"torch": "2.4", "preset": "timm-2022"}).attention == "fused"
    for bad, message in (({"torch": "1.12", "attention": "fused"}, "no scaled_dot_product_attention"),
                         ("pytorch-3", "unknown stack 'pytorch-3'"), ({"attention": "flash"}, "--attention 'flash'"),
                         ({"torch": "latest"}, "expected MAJOR.MINOR"), ({"tf32": True}, "unknown stack setting")):
        with pytest.raises(ValueError, match=message):
            resolve_stack("h200", bad)
    recorded = stack_of_record({"torch": "2.11.0+cu130", "cudnn_benchmark": True})
    assert recorded.preset == "recorded" and recorded.cudnn_benchmark and recorded.attention == "fused"


def test_h200_runs_are_on_the_h200s_default_stack(small_h200_dir) -> None:
    """The H200 runs' stack is what `dprobe predict --gpu h200` assumes, but collection 1's cudnn.benchmark."""
    from dprobe.data import load_h200_profiles
    from dprobe.profiling.coldstart.dataset import run_stack
    from dprobe.profiling.coldstart.stack import default_stack

    profiles = load_h200_profiles(small_h200_dir)
    for _, row in profiles.train_runs().iterrows():
        stack = run_stack(row, profiles.env)
        if int(row["collection"]) == 1:
            assert stack.cudnn_benchmark and stack.preset == "recorded"
        else:
            assert stack == default_stack("h200")


@pytest.mark.slow
def test_cli_predict_takes_and_prints_the_stack(capsys) -> None:
    """--stack, --cudnn-benchmark, --attention, --memory-format, --torch reach the prediction and its JSON;
    cudnn.benchmark moves the step time (a feature), unfused attention the replay."""
    from dprobe.cli import main

    args = ["predict", "transformers:GPT2Config/GPT2LMHeadModel", "--config-kwargs", TINY_GPT2, "--seq", "64",
            "--batch", "4", "--precision", "fp16", "--optimizer", "sgd", "--json"]
    outs = {}
    for name, extra in (("default", []), ("benchmark", ["--cudnn-benchmark"]), ("unfused", ["--attention", "unfused"]),
                        ("timm", ["--stack", "timm-2022"]), ("3090", ["--gpu", "rtx3090"]),
                        ("3090-now", ["--gpu", "rtx3090", "--stack", "h200-profiles"])):
        assert main([*args, *extra]) == 0
        outs[name] = json.loads(capsys.readouterr().out)
    assert outs["default"]["stack"] == {"preset": "h200-profiles", "torch": "2.11", "cudnn_benchmark": False,
                                        "attention": "fused", "memory_format": "nchw", "overrides": []}
    assert outs["benchmark"]["stack"]["overrides"] == ["cudnn_benchmark"]
    assert outs["benchmark"]["analytical"] == outs["default"]["analytical"]
    assert outs["benchmark"]["step_time_seconds"] != outs["default"]["step_time_seconds"]
    unfused, fused = outs["unfused"]["analytical"], outs["default"]["analytical"]
    assert unfused["peak_memory_bytes"] > fused["peak_memory_bytes"]
    assert unfused["kernels_per_step"] > fused["kernels_per_step"]
    assert outs["timm"]["stack"]["preset"] == "timm-2022" and outs["timm"]["analytical"] == unfused
    assert outs["3090"]["stack"] == outs["timm"]["stack"]  # the 3090's training rows' stack
    assert outs["3090-now"]["stack"] == outs["default"]["stack"]
    assert outs["3090-now"]["step_time_seconds"] != outs["3090"]["step_time_seconds"]
    # refused before anything is replayed, naming the option
    assert main([*args, "--torch", "1.12", "--attention", "fused"]) == 2
    assert "no scaled_dot_product_attention" in capsys.readouterr().err
    assert main([*args[:-1], "--stack", "timm-2022", "--no-cudnn-benchmark"]) == 0
    assert "software stack  timm-2022 + cudnn_benchmark: torch 1.12, cudnn.benchmark off" in capsys.readouterr().out


@pytest.mark.slow
def test_channels_last_training_is_replayed_channels_last_and_says_so(capsys) -> None:
    from dprobe.cli import main

    assert main(["predict", "torchvision:resnet18", "--batch", "2", "--image", "32", "--memory-format",
                 "channels-last", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"]["memory_format"] == "nhwc" and "memory format channels-last: replayed channels-last" in out["note"]


def _synthetic_runs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, analytical baselines and measurements of ``n`` made-up runs (5 % off the baseline)."""
    rng = np.random.default_rng(seed)
    feats = rng.normal(size=(n, len(FEATURES)))
    base = np.abs(rng.normal(size=(n, 4))) + 1.0
    base[:, 2] = 0.5
    y = base * np.exp(rng.normal(scale=0.05, size=(n, 4)))
    y[:, 2] = 0.6
    return feats, base, y


@pytest.mark.slow
def test_train_and_checkpoint(tmp_path, monkeypatch) -> None:
    n = 12
    feats, base, y = _synthetic_runs(n, 0)
    from dprobe.graph import build_model_graph
    from dprobe.graph.encoder import graph_to_data

    g = graph_to_data(build_model_graph("torchvision:resnet18", batch=2, image=64))
    ds = make_dataset([g] * n, feats, base, y, [f"f{i % 3}" for i in range(n)], [str(i) for i in range(n)])
    ds.skipped = ["run r999 (timm:gone): RuntimeError: cannot replay"]
    monkeypatch.setattr(cs_train, "load_dataset", lambda *a, **k: ds)
    for graph_dim in (0, 4):
        result = cs_train.train_coldstart("unused", str(tmp_path / f"g{graph_dim}"), max_epochs=5,
                                          graph_dim=graph_dim, hidden=8)
        model, ckpt = load_checkpoint(result["checkpoint"])
        assert ckpt["version"] == VERSION and "learned" in result["metrics"]
        assert ckpt["gpus"] == ["h200"]  # the GPUs it learnt from, for predict's note
        assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the leave-family-out picture
        from dprobe.profiling.coldstart.report import ROWS

        rows = [line for line in result["table"].splitlines() if line.endswith((" PASS", " MISS"))]
        assert len(rows) == len(ROWS) and f"{result['metrics']['learned']['step_mape']:.3f}" in result["table"]
        assert (tmp_path / f"g{graph_dim}" / "report.txt").read_text().strip() == result["table"]
        assert result["table"].endswith("left out: " + ds.skipped[0])
        assert sorted(result["cv_util"]) == sorted(ds.run_ids)  # each run's held-out utilisation, for job scale
        assert all(0 < u < 1 for u in result["cv_util"].values())
        res = predict_residuals(model, [g], feats[:1])
        assert res.shape == (1, 4, 2) and (res[..., 1] >= res[..., 0]).all()
    torch.save({"kind": "other"}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a dprobe cold-start checkpoint"):
        load_checkpoint(tmp_path / "bad.pt")


def test_precision_and_optimizer_choices_are_what_the_replay_knows() -> None:
    """The CLI and the sidecar's job specs list them without importing torch; they must stay the replay's."""
    from dprobe.cli import build_parser
    from dprobe.profiling.coldstart.replay import OPTIMIZERS, PRECISIONS
    from dprobe.services.sidecar import jobs

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    choices = {a.dest: a.choices for a in sub.choices["predict"]._actions}
    assert list(choices["precision"]) == list(PRECISIONS) == list(jobs.PRECISIONS)
    assert list(choices["optimizer"]) == list(OPTIMIZERS) == list(jobs.OPTIMIZERS)


@pytest.mark.slow
def test_every_gpu_spec_is_a_predict_choice(capsys) -> None:
    """--gpu offers exactly the GPUs dprobe has a spec for; a slower GPU gives a slower step and may not fit."""
    from dprobe.cli import build_parser, main
    from dprobe.core.gpus import GPUS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    gpu = next(a for a in sub.choices["predict"]._actions if a.dest == "gpu")
    assert sorted(gpu.choices) == sorted(GPUS)
    args = ["predict", "torchvision:resnet18", "--batch", "64", "--precision", "bf16", "--json"]
    by_gpu = {}
    for name in ("h200", "l4"):
        assert main([*args, "--gpu", name]) == 0
        by_gpu[name] = json.loads(capsys.readouterr().out)
    assert by_gpu["l4"]["step_time_seconds"]["p50"] > 2 * by_gpu["h200"]["step_time_seconds"]["p50"]
    assert by_gpu["l4"]["gpu_memory_bytes"] == GPUS["l4"].memory_bytes < GPUS["h200"].memory_bytes


@pytest.mark.slow
def test_cli_predict(capsys, tmp_path) -> None:
    from dprobe.cli import main

    args = ["predict", "transformers:GPT2Config/GPT2LMHeadModel", "--config-kwargs", TINY_GPT2, "--seq", "32",
            "--batch", "4", "--precision", "bf16", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("peak_memory_bytes", "device_memory_bytes", "gpu_utilization", "step_time_seconds"):
        assert out[key]["p90"] >= out[key]["p50"] > 0
    assert 0 <= out["gpu_utilization"]["p50"] <= 1
    assert out["unknown_nodes"] == 0 and out["analytical"]["peak_memory_bytes"] > 0
    assert "note" not in out  # the shipped checkpoint learnt from H200 runs
    assert main([*args, "--gpu", "a100"]) == 0
    on_a100 = json.loads(capsys.readouterr().out)
    assert on_a100["gpu_seen_in_training"] is False and out["gpu_seen_in_training"] is True
    assert "trained on h200, rtx3090 measurements only, not a100" in on_a100["note"]
    assert main([*args[:-1], "--gpu", "a100"]) == 0  # the report says it too
    assert "note: gpu_seen_in_training: false" in capsys.readouterr().err
    # no training run was on an A100: the corrections are those learnt on the H200 and the 3090 together
    assert main([*args[:-2], "fp16", "--json"]) == 0
    in_fp16 = json.loads(capsys.readouterr().out)
    assert in_fp16["gpu_seen_in_training"] and "note" not in in_fp16
    assert main([*args, "--optimizer", "adam"]) == 0  # Adam keeps AdamW's two states per parameter
    with_adam = json.loads(capsys.readouterr().out)
    assert with_adam["analytical"]["optimizer_state_bytes"] == out["analytical"]["optimizer_state_bytes"]
    assert with_adam["peak_memory_bytes"]["p50"] == pytest.approx(out["peak_memory_bytes"]["p50"], rel=0.01)
    for unseen in (on_a100, in_fp16):
        for key in ("peak_memory_bytes", "device_memory_bytes", "step_time_seconds"):
            assert 1 / 3 < unseen[key]["p50"] / out[key]["p50"] < 3, (key, unseen[key], out[key])
    assert main(["predict", "torchvision:nope", "--batch", "2", "--json"]) == 2
    assert "unknown torchvision model" in capsys.readouterr().err
    # batch norm after global pooling cannot train on one sample: said plainly, with what to do
    assert main(["predict", "timm:rexnet_100", "--batch", "1", "--json"]) == 2
    assert "cannot train at batch 1" in capsys.readouterr().err
    # a damaged checkpoint is named, with no traceback
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a torch file" * 10)
    assert main([*args, "--checkpoint", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {damaged}: cannot be read" in err and "Traceback" not in err


@pytest.mark.slow
def test_predict_from_an_onnx_file(tmp_path, capsys) -> None:
    """An ONNX file has no module to replay: the step is estimated from its graph, close to the replay's
    (convolutions, batch norms, ReLU, ReLU6 as Clip, SiLU as x * sigmoid(x), squeeze-excitation products)."""
    import torchvision

    from dprobe.cli import main
    from dprobe.graph.onnx_reader import read_onnx
    from dprobe.profiling.coldstart.graph_estimate import estimate_from_graph

    for name in ("resnet18", "mobilenet_v2", "efficientnet_b0"):
        path = tmp_path / f"{name}.onnx"  # exported for training: batch norms kept, not folded into the convolutions
        torch.onnx.export(torchvision.models.get_model(name), (torch.randn(2, 3, 64, 64),), str(path), dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
        for precision in ("fp32", "bf16"):
            replayed = replay_training_step(parse_spec(f"torchvision:{name}"), batch=16, precision=precision,
                                            optimizer="sgd", image=64)
            estimated = estimate_from_graph(read_onnx(path, batch=16), 16, precision, "sgd")
            assert estimated.state_bytes == pytest.approx(replayed.state_bytes, rel=0.01)  # the optimizer, replayed
            assert estimated.flops == pytest.approx(replayed.flops, rel=0.05)
            assert estimated.activation_bytes == pytest.approx(replayed.activation_bytes, rel=0.05)
            assert estimated.peak_bytes == pytest.approx(replayed.peak_bytes, rel=0.05)
    path = tmp_path / "resnet18.onnx"
    assert main(["predict", str(path), "--batch", "16", "--precision", "bf16", "--optimizer", "sgd", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "ONNX file" in out["note"] and out["unknown_nodes"] == 0 and out["method"] == "learned"
    for key in ("peak_memory_bytes", "device_memory_bytes", "gpu_utilization", "step_time_seconds"):
        assert out[key]["p90"] >= out[key]["p50"] > 0
    path.write_bytes(b"not onnx" * 20)
    assert main(["predict", str(path), "--batch", "16"]) == 2
    assert "corrupt ONNX" in capsys.readouterr().err


def test_onnx_convolutions_hold_the_replays_workspace(tmp_path) -> None:
    """From an ONNX graph too, a dense 3x3 convolution holds a cuDNN workspace while it runs; 1x1 and
    depthwise ones do not (the graph has no weight shapes: the rule reads FLOPs per output element)."""
    from dprobe.graph.onnx_reader import read_onnx
    from dprobe.profiling.coldstart.graph_estimate import estimate_from_graph

    def peak(conv: torch.nn.Conv2d) -> float:
        path = tmp_path / "conv.onnx"
        torch.onnx.export(conv, (torch.randn(2, 16, 64, 64),), str(path),
                          dynamo=False, training=torch.onnx.TrainingMode.TRAINING, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
        return estimate_from_graph(read_onnx(path, batch=32), 32, "fp32", "sgd").peak_bytes

    x_bytes = 32 * 16 * 64 * 64 * 4
    dense = peak(torch.nn.Conv2d(16, 16, 3, padding=1))
    for other in (torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)):
        assert dense - peak(other) >= x_bytes  # the workspace: at least a copy of the input


def test_onnx_attention_is_estimated_as_pytorch_runs_it(tmp_path) -> None:
    """An exported attention (MatMul, Softmax, MatMul) is counted as the fused kernel: no probabilities kept."""
    from dprobe.graph.onnx_reader import read_onnx
    from dprobe.profiling.coldstart.graph_estimate import estimate_from_graph, fused_attention

    # 257 tokens: the probabilities (batch x heads x 257 x 257) would be most of the memory if they were held
    kw = {"image_size": 64, "patch_size": 4, "num_layers": 2, "num_heads": 4, "hidden_dim": 32, "mlp_dim": 64}
    spec = parse_spec("module:torchvision.models.vision_transformer:VisionTransformer", kw)
    from torchvision.models.vision_transformer import VisionTransformer

    path = tmp_path / "vit.onnx"
    torch.onnx.export(VisionTransformer(**kw), (torch.randn(2, 3, 64, 64),), str(path), dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    graph = read_onnx(path, batch=16)
    producers: dict[int, list[int]] = {}
    consumers: dict[int, list[int]] = {}
    for a, b in graph.edges:
        producers.setdefault(b, []).append(a)
        consumers.setdefault(a, []).append(b)
    roles = fused_attention(graph, producers, consumers)
    assert list(roles.values()).count("output") == kw["num_layers"]
    replayed = replay_training_step(spec, batch=16, precision="fp32", optimizer="adamw", image=64)
    estimated = estimate_from_graph(graph, 16, "fp32", "adamw")
    assert estimated.peak_bytes == pytest.approx(replayed.peak_bytes, rel=0.05)


def test_predict_a_model_that_reads_its_mask_values(capsys) -> None:
    from dprobe.cli import main

    bart = ('{"encoder_layers": 1, "decoder_layers": 1, "d_model": 32, "encoder_attention_heads": 2, '
            '"decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 100}')
    assert main(["predict", "transformers:BartConfig/BartForConditionalGeneration", "--config-kwargs", bart,
                 "--seq", "8", "--batch", "2", "--precision", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["peak_memory_bytes"]["p50"] > 0 and out["analytical"]["peak_memory_bytes"] > 0


TINY_DEBERTA_V2 = ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128, '
                   '"vocab_size": 1000}')
TINY_WAV2VEC2 = ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128, '
                 '"conv_dim": [32, 32], "conv_kernel": [10, 3], "conv_stride": [5, 2], "num_conv_pos_embeddings": 16, '
                 '"vocab_size": 32}')


@pytest.mark.slow
def test_predict_a_model_that_reads_its_labels(capsys) -> None:
    """DeBERTa-v2 keeps the labels >= 0 (``nonzero``) and checks its token ids for padding, neither possible
    on meta: replayed again with every label valid, and the prediction says so."""
    from torch.fx.experimental import _config as fx_config
    from transformers.modeling_utils import PreTrainedModel

    from dprobe.cli import main

    warn = PreTrainedModel.warn_if_padding_and_no_attention_mask
    assert main(["predict", "transformers:DebertaV2Config/DebertaV2ForSequenceClassification", "--config-kwargs",
                 TINY_DEBERTA_V2, "--seq", "32", "--batch", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["analytical"]["peak_memory_bytes"] > out["analytical"]["param_bytes"] > 0
    assert "every mask and label taken as valid" in out["note"]
    # what the retry changed is put back
    assert PreTrainedModel.warn_if_padding_and_no_attention_mask is warn
    assert not fx_config.meta_nonzero_assume_all_nonzero


def test_replay_of_an_audio_model_leaves_out_spec_augment() -> None:
    """wav2vec2-likes mask random spans of their features in training (SpecAugment, drawn from values):
    the replay leaves the masking out, as it changes no tensor's size, and needs no retry."""
    from dprobe.graph.zoo import parse_spec

    spec = parse_spec("transformers:Wav2Vec2Config/Wav2Vec2ForCTC", TINY_WAV2VEC2)
    est = replay_training_step(spec, batch=2, precision="fp32", seq=4000)
    assert est.peak_bytes > est.param_bytes > 0 and est.values_assumed == 0


def test_predict_names_a_step_that_cannot_be_replayed(monkeypatch, capsys) -> None:
    """An op PyTorch refuses on meta tensors (or on the GPU) is an error naming the job, not a traceback."""
    from dprobe.cli import main
    from dprobe.profiling.coldstart import job

    def refuse(*args, **kwargs):
        raise RuntimeError("Expected mat_a to be BFloat16 or supported Float16 matrix, got torch.float32.")

    monkeypatch.setattr(job, "analytical_for", refuse)  # where a prediction replays the job
    assert main(["predict", "torchvision:resnet18", "--batch", "2", "--precision", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "cannot replay a training step (bf16) of torchvision:resnet18: RuntimeError: Expected mat_a" in err
    assert '"experts_implementation": "batched_mm"' in err  # and what to change
    # a model whose forward wants other inputs (two tensors) gets a hint at what to do
    monkeypatch.undo()
    bilinear = '{"in1_features": 4, "in2_features": 4, "out_features": 2}'
    assert main(["predict", "module:torch.nn:Bilinear", "--config-kwargs", bilinear, "--batch", "2"]) == 2
    assert "TypeError" in (err := capsys.readouterr().err) and "example_inputs(batch)" in err


def test_collection_settings_fill_cudnn_benchmark(tmp_path) -> None:
    import shutil

    import pandas as pd

    from dprobe.data import load_h200_profiles

    src = "datasets/h200-profiles"
    for name in ("runs.csv", "samples.csv", "steps.csv"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs.loc[runs["collection"] == 1, "cudnn_benchmark"].isna().all()  # blank in the file
    loaded = load_h200_profiles(tmp_path).runs
    assert loaded.loc[loaded["collection"] == 1, "cudnn_benchmark"].all()
    assert not loaded.loc[loaded["collection"] == 2, "cudnn_benchmark"].any()
    runs.drop(columns=["cudnn_benchmark", "phases"]).assign(collection=3).to_csv(tmp_path / "runs.csv", index=False)
    other = load_h200_profiles(tmp_path).runs
    assert not other["cudnn_benchmark"].any()  # unknown: off
    assert (other["host_stall_s"] == 0).all()  # no phases column: no stalls


@pytest.mark.slow
def test_p90_calibration_moves_coverage_towards_90_percent(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    n, fams = 120, 24  # fewer runs leave the coverage to a run or two either way
    feats = rng.normal(size=(n, len(FEATURES)))
    base = np.abs(rng.normal(size=(n, 4))) + 1.0
    base[:, 2] = 0.5
    family = np.arange(n) % fams
    y = base * np.exp(rng.normal(scale=0.2, size=(n, 4)) + 0.1 * family[:, None] / fams)
    y[:, 2] = np.clip(0.5 + rng.normal(scale=0.15, size=n), 0.05, 0.95)
    ds = make_dataset([None] * n, feats, base, y, [f"f{f}" for f in family], [str(i) for i in range(n)])
    hp = {**cs_fit.DEFAULTS, "ensemble": 2, "hidden": 8}
    shift = cs_fit.fit(ds, np.arange(n), 60, 0, hp).p90_shift.numpy()
    assert shift.shape == (4,) and np.isfinite(shift).all() and (shift != 0).any()
    assert np.array_equal(shift, cs_fit.fit(ds, np.arange(n), 60, 0, hp).p90_shift.numpy())  # deterministic for a seed

    def miss(calibrate: bool) -> float:
        cv = cross_validate("unused", "unused", max_epochs=60, ds=ds, ensemble=2, hidden=8, calibrate=calibrate)
        return float(np.mean([abs(cv.learned[f"p90_coverage_{t}"] - 0.9) for t in TARGETS]))

    assert miss(True) < miss(False)


@pytest.mark.slow
def test_members_fitted_together_are_members_fitted_one_by_one() -> None:
    """Without dropout (the one draw that differs) a member of :func:`fit_members` is the member fitted
    alone on its runs, up to rounding: its own runs, its own standardisation, its own seed."""
    n = 40
    feats, base, y = _synthetic_runs(n, 3)
    ds = make_dataset([None] * n, feats, base, y, [f"f{i % 5}" for i in range(n)], [str(i) for i in range(n)])
    hp = {**cs_fit.DEFAULTS, "hidden": 8, "dropout": 0.0}
    subsets = [np.arange(n), np.arange(0, n, 2), np.arange(10, 35)]
    together = cs_fit.fit_members(ds, subsets, 80, [0, 1, 2], hp)
    x = torch.tensor(feats, dtype=torch.float32)
    for member, rows, seed in zip(together, subsets, [0, 1, 2], strict=True):
        alone = cs_fit._fit_member(ds, rows, 80, seed, hp)
        assert torch.allclose(member.mu, alone.mu) and torch.allclose(member.sd, alone.sd)
        with torch.no_grad():
            assert torch.allclose(member(None, x), alone(None, x), atol=1e-4)
    with torch.no_grad():  # and they differ from each other
        assert not torch.allclose(together[1](None, x), together[2](None, x), atol=1e-2)


def _six_families_recording_fits(monkeypatch, seed: int) -> tuple[ProfileDataset, list[str], list[set[str]]]:
    """24 made-up runs of 6 families, and the families each ``fit`` of a cross-validation trains on."""
    n = 24
    feats, base, y = _synthetic_runs(n, seed)
    family = [f"f{i % 6}" for i in range(n)]
    ds = make_dataset([None] * n, feats, base, y, family, [str(i) for i in range(n)])
    seen: list[set[str]] = []
    fit = crossval.fit

    def recording_fit(ds_, idx, *args, **kwargs):
        seen.append({ds_.families[i] for i in idx})
        return fit(ds_, idx, *args, **kwargs)

    monkeypatch.setattr(crossval, "fit", recording_fit)
    return ds, family, seen


def test_cross_validation_on_fewer_families(monkeypatch) -> None:
    """The learning curve's folds: K other families drawn per held-out family, never the family itself."""
    ds, family, seen = _six_families_recording_fits(monkeypatch, 2)
    cv = cross_validate("unused", "unused", max_epochs=5, ds=ds, progress=False, train_families=2,
                        ensemble=1, hidden=8)
    assert np.isfinite(cv.p50).all() and len(seen) == 6
    for held_out, trained_on in zip(sorted(set(family)), seen, strict=True):
        assert len(trained_on) == 2 and held_out not in trained_on
    assert len({tuple(sorted(f)) for f in seen}) > 1  # drawn, not the same pair each time


def test_cross_validation_in_grouped_folds(monkeypatch) -> None:
    """``folds``: the families dealt into groups, each group held out once and never trained on."""
    ds, family, seen = _six_families_recording_fits(monkeypatch, 3)
    cv = cross_validate("unused", "unused", max_epochs=5, ds=ds, progress=False, folds=3, ensemble=1, hidden=8)
    assert cv.folds == 3 and len(seen) == 3 and np.isfinite(cv.p50).all()
    held_out = [set(family) - trained_on for trained_on in seen]
    assert all(len(h) == 2 for h in held_out)  # 6 families in 3 groups
    assert set().union(*held_out) == set(family)  # every family scored once
    with pytest.raises(ValueError, match="folds"):
        cross_validate("unused", "unused", max_epochs=5, ds=ds, progress=False, folds=1)


@pytest.mark.slow
def test_cross_validation_in_worker_processes_scores_the_same() -> None:
    """Folds fitted in two spawned processes give exactly the scores of one process."""
    n = 24
    feats, base, y = _synthetic_runs(n, 5)
    ds = make_dataset([None] * n, feats, base, y, [f"f{i % 6}" for i in range(n)], [str(i) for i in range(n)])
    hp = {"max_epochs": 20, "ds": ds, "progress": False, "ensemble": 2, "hidden": 8, "folds": 3}
    alone = cross_validate("unused", "unused", workers=1, **hp)
    pooled = cross_validate("unused", "unused", workers=2, **hp)
    np.testing.assert_allclose(pooled.p50, alone.p50, rtol=1e-6)
    np.testing.assert_allclose(pooled.p90, alone.p90, rtol=1e-6)
    assert pooled.learned == pytest.approx(alone.learned)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        cross_validate("unused", "unused", workers=0, **hp)


def test_cross_validation_goes_on_when_its_workers_die(monkeypatch, caplog) -> None:
    """A worker that dies (out of memory, say) costs time, not the run: the folds are fitted in-process."""
    from concurrent.futures.process import BrokenProcessPool

    import dprobe.core.workers

    class DeadPool:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, *args):
            raise BrokenProcessPool("a worker process was terminated abruptly")

    monkeypatch.setattr(dprobe.core.workers, "spawn_pool", lambda *a, **k: DeadPool())
    n = 24
    feats, base, y = _synthetic_runs(n, 5)
    ds = make_dataset([None] * n, feats, base, y, [f"f{i % 6}" for i in range(n)], [str(i) for i in range(n)])
    hp = {"max_epochs": 5, "ds": ds, "progress": False, "ensemble": 1, "hidden": 8, "folds": 3}
    with caplog.at_level("WARNING", logger="dprobe.core.workers"):
        cv = cross_validate("unused", "unused", workers=2, **hp)
    assert "fitting the folds in this process" in caplog.text
    np.testing.assert_allclose(cv.p50, cross_validate("unused", "unused", workers=1, **hp).p50)


@pytest.mark.slow
def test_uncalibrated_cross_validation_keeps_the_p50() -> None:
    """The learning curve skips the p90 calibration: same p50, p90 without the conformal shift."""
    n = 30
    feats, base, y = _synthetic_runs(n, 3)
    ds = make_dataset([None] * n, feats, base, y, [f"f{i % 6}" for i in range(n)], [str(i) for i in range(n)])
    hp = {"max_epochs": 20, "ds": ds, "progress": False, "ensemble": 1, "hidden": 8}
    calibrated = cross_validate("unused", "unused", **hp)
    plain = cross_validate("unused", "unused", calibrate=False, **hp)
    assert np.allclose(plain.p50, calibrated.p50)
    assert not np.allclose(plain.p90, calibrated.p90)
    assert not cs_fit.fit(ds, np.arange(n), 20, 0, {**cs_fit.DEFAULTS, "ensemble": 1, "hidden": 8},
                          calibrate=False).p90_shift.any()


def test_replay_logs_kernels_by_phase_and_class() -> None:
    from dprobe.core.gpus import GPUS
    from dprobe.profiling.coldstart.features import roofline_seconds
    from dprobe.profiling.coldstart.memtrack import BACKWARD, FORWARD, OP_CLASSES, OPTIMIZER

    est = replay_training_step(parse_spec("torchvision:mobilenet_v2"), batch=4, precision="fp32",
                               optimizer="sgd", image=64)
    ops = np.array(est.ops)
    assert len(ops) == est.kernels and ops.shape[1] == 5
    assert {FORWARD, BACKWARD, OPTIMIZER} <= set(ops[:, 0].astype(int))
    classes = {OP_CLASSES[int(c)] for c in ops[:, 1]}
    assert {"conv", "conv_grouped", "norm", "elementwise", "optimizer"} <= classes  # depthwise convs apart
    assert not ops[:, 2].any()  # fp32: no low-precision kernel
    assert abs(ops[:, 3].sum() - est.flops) / est.flops < 1e-6
    t = roofline_seconds(est, "fp32", GPUS["h200"])
    assert t["roof"] == max(t["gpu"], t["host"]) and t["gpu"] >= t["compute"]
    assert abs(sum(t[f"share_{c}"] for c in OP_CLASSES) - 1) < 0.05  # shares of GPU time (attention apart)
    # fp32 matmuls and convolutions without TF32 run on the CUDA cores: slower
    assert roofline_seconds(est, "fp32", GPUS["h200"], tf32=False)["gpu"] > t["gpu"]


def test_host_stall_lowers_utilisation_only() -> None:
    from dprobe.profiling.coldstart.residual import busy_utilisation, with_stall

    util, step, stall = np.array([0.6, 0.6]), np.array([0.02, 0.02]), np.array([0.0, 0.01])
    busy = busy_utilisation(util, step, stall)
    assert busy[0] == pytest.approx(0.6) and busy[1] == pytest.approx(0.9)
    assert np.allclose(with_stall(busy, step, stall), util)


def test_predict_with_host_stall(capsys) -> None:
    from dprobe.profiling.coldstart.predict import predict_job

    kw = dict(batch=4, precision="bf16", seq=32, config_kwargs=TINY_GPT2)
    plain = predict_job("transformers:GPT2Config/GPT2LMHeadModel", **kw)
    stalled = predict_job("transformers:GPT2Config/GPT2LMHeadModel", host_stall_s=0.05, **kw)
    assert stalled.gpu_utilization.p50 < plain.gpu_utilization.p50
    assert stalled.step_time_seconds == plain.step_time_seconds
    assert stalled.peak_memory_bytes == plain.peak_memory_bytes
    with pytest.raises(ValueError, match="host-stall"):
        predict_job("transformers:GPT2Config/GPT2LMHeadModel", host_stall_s=-1, **kw)


def test_targets_a_run_does_not_have_are_not_learnt(monkeypatch) -> None:
    n = 24
    feats, base, y = _synthetic_runs(n, 2)
    valid = np.ones((n, 4), dtype=bool)
    valid[: n // 2, 1] = False
    fams, ids = [f"f{i % 4}" for i in range(n)], [str(i) for i in range(n)]
    hp = {**cs_fit.DEFAULTS, "ensemble": 1, "hidden": 8}

    def fitted(y_nvml_scale: float) -> np.ndarray:
        yy = y.copy()
        yy[: n // 2, 1] *= y_nvml_scale  # measurements marked invalid: their values must not matter
        ds = make_dataset([None] * n, feats, base, yy, fams, ids, valid=valid)
        model = cs_fit.fit(ds, np.arange(n), 30, 0, hp)
        return predict_residuals(model, [None] * n, feats)

    assert np.allclose(fitted(1.0), fitted(3.0))
    # a missing measurement (NaN) is invalid by default: left out of the loss and the scores
    yy = y.copy()
    yy[:3, 1] = np.nan
    ds = make_dataset([None] * n, feats, base, yy, fams, ids)
    assert not ds.valid[:3, 1].any() and ds.valid[3:].all() and ds.valid[:, [0, 2, 3]].all()
    cv = cross_validate("unused", "unused", max_epochs=30, ds=ds, ensemble=1, hidden=8)
    assert all(np.isfinite(v) for v in cv.learned.values())
    assert np.isfinite(cv.p50).all()


def test_loader_derives_stalls(tmp_path) -> None:
    from dprobe.data import load_h200_profiles
    from dprobe.data.h200 import PHASE_EVERY, PHASE_STALL_S

    runs = load_h200_profiles("datasets/h200-profiles").train_runs()
    phases = runs["phases"].astype(str).str.lower().eq("true")
    assert phases.any() and (~phases).any()
    assert np.allclose(runs.loc[phases, "host_stall_s"], PHASE_STALL_S / PHASE_EVERY)
    assert (runs.loc[~phases, "host_stall_s"] == 0).all()


def test_host_factors_per_machine() -> None:
    """A machine whose host-bound runs step 1.5 times slower gets a host factor 1.5 times the other's; the
    factors are centred on the typical machine; one with too few host-bound runs counts as typical."""
    n = 16
    feats, base, y = _synthetic_runs(n, 1)
    host, gpu, roof = (FEATURES.index(k) for k in ("log_t_host", "log_t_gpu", "log_t_roof"))
    feats[:, host] = np.log(0.02)
    feats[:, gpu] = np.log(0.01)
    feats[:, roof] = feats[:, host]
    machines = ["fast"] * 6 + ["slow"] * 6 + ["rare"] * 4
    y[:, 2] = 0.3  # GPU busy 30 % of each step: host-bound
    y[:, 3] = 0.02 * np.array([1.0] * 6 + [1.5] * 6 + [3.0] * 4)
    y[-2:, 2] = 0.9  # "rare" has two host-bound runs only
    ds = make_dataset([None] * n, feats, base, y, ["f"] * n, [str(i) for i in range(n)], machines=machines)
    factors = cs_fit.host_factors(ds, np.arange(n))
    assert factors["slow"] - factors["fast"] == pytest.approx(np.log(1.5))
    assert factors["fast"] + factors["slow"] == pytest.approx(0.0) and factors["rare"] == 0.0
    # from the runs given only: without the slow machine's runs it is not known, so typical
    assert cs_fit.host_factors(ds, np.arange(6))["fast"] == 0.0
    on = cs_fit.for_machines(ds, factors)
    slow = 6
    assert on.feats[slow, host] == pytest.approx(np.log(0.02) + factors["slow"])
    assert on.feats[slow, roof] == pytest.approx(on.feats[slow, host])  # the host still binds
    assert on.base[slow, 3] == pytest.approx(0.02 * np.exp(factors["slow"]))
    assert on.base[slow, 2] == pytest.approx(0.01 / (0.02 * np.exp(factors["slow"])))
    fast = on.feats[0]
    assert fast[roof] == pytest.approx(max(fast[gpu], fast[host]))
    np.testing.assert_array_equal(on.base[:, :2], ds.base[:, :2])  # memory does not depend on the host


def test_predict_on_a_slower_host() -> None:
    """``host_factor`` lengthens a host-bound job's step and lowers its utilisation; bad values are refused."""
    from dprobe.profiling.coldstart.predict import predict_job

    job = ("transformers:GPT2Config/GPT2LMHeadModel", 2)
    kw = {"precision": "bf16", "seq": 32, "config_kwargs": TINY_GPT2}
    typical = predict_job(*job, **kw)
    slow = predict_job(*job, **kw, host_factor=2.0)
    assert slow.host_factor == 2.0
    assert slow.analytical.step_time_seconds == pytest.approx(2 * typical.analytical.step_time_seconds)
    assert slow.step_time_seconds.p50 > 1.3 * typical.step_time_seconds.p50
    assert slow.gpu_utilization.p50 < typical.gpu_utilization.p50
    assert slow.peak_memory_bytes == typical.peak_memory_bytes
    assert slow.device_memory_bytes == typical.device_memory_bytes  # the memory head sees no host timing
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="--host-factor must be a positive number"):
            predict_job(*job, **kw, host_factor=bad)


def test_memory_head_sees_the_op_mix_but_no_timing() -> None:
    """Memory residuals may depend on the job's shape and op mix (convolution and matmul libraries keep
    workspaces), never on host or roofline time; utilisation and step time see every feature."""
    from dprobe.profiling.coldstart.model import target_groups

    (memory_targets, memory), (timing_targets, timing) = target_groups(FEATURES)
    assert memory_targets == [0, 1] and timing_targets == [2, 3] and timing == list(range(len(FEATURES)))
    names = {FEATURES[i] for i in memory}
    assert {"share_conv", "share_conv_grouped", "share_matmul", "log_peak", "half"} <= names
    assert not names & {"log_t_compute", "log_t_memory", "log_t_gpu", "log_t_host", "log_t_roof"}


PREDICTION_SCRIPT = """
import json, sys
import numpy as np, pandas as pd
from dprobe.profiling.coldstart.predict import predict_job

predict_job("torchvision:resnet18", 2, image=32)
cold_start = sorted(sys.modules)
from dprobe.profiling.predict import predict_with_samples

n = 12  # a started job's first second, one sample every 0.1 s
samples = pd.DataFrame({"t_rel": np.arange(n) * 0.1, "mem_used_bytes": np.linspace(1, 3, n) * 2**30,
                        "gpu_util_pct": np.linspace(0, 90, n), "mem_total_bytes": [140 * 2**30] * n})
assert predict_with_samples("torchvision:resnet18", 2, samples, image=32).job_scale.samples_used == 11
print(json.dumps({"cold_start": cold_start, "with_samples": sorted(sys.modules)}))
"""
# what only training imports: the profilers' training sets, fitting, cross-validation and reports, the
# forecaster's training
TRAINING_MODULES = {*(f"dprobe.profiling.coldstart.{m}" for m in ("dataset", "fit", "crossval", "train", "report")),
                    *(f"dprobe.profiling.jobscale.{m}" for m in ("data", "train", "report")), "dprobe.training"}


@pytest.mark.slow
def test_prediction_imports_no_training_module() -> None:
    """``dprobe predict`` (cold start, and job scale with a started job's samples) runs without importing
    anything of training, and the cold-start prediction without job scale."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PREDICTION_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    for modules in loaded.values():
        assert not TRAINING_MODULES & set(modules)
        assert not [m for m in modules if m.split(".")[0] in ("pytorch_lightning", "lightning")]
    assert not [m for m in loaded["cold_start"] if m.startswith("dprobe.profiling.jobscale")]
    assert "dprobe.profiling.jobscale.predict" in loaded["with_samples"]


@pytest.mark.slow
def test_predict_says_when_a_job_will_not_fit(monkeypatch, capsys) -> None:
    from dataclasses import replace

    from dprobe.cli import main
    from dprobe.core import gpus
    from dprobe.profiling.coldstart.predict import fits_on_gpu
    from dprobe.profiling.coldstart.replay import CUDA_CONTEXT_BYTES

    gib = 1 << 30
    assert fits_on_gpu(10 * gib, 12 * gib, 80 * gib) == "yes"
    assert fits_on_gpu(70 * gib, 82 * gib, 80 * gib) == "maybe"  # only the p90 is over
    assert fits_on_gpu(80 * gib - CUDA_CONTEXT_BYTES + 1, 90 * gib, 80 * gib) == "no"
    args = ["predict", "transformers:GPT2Config/GPT2LMHeadModel", "--config-kwargs", TINY_GPT2, "--seq", "32",
            "--batch", "4"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] == "yes" and out["gpu_memory_bytes"] == gpus.GPUS["h200"].memory_bytes
    # the same job on a GPU smaller than its CUDA context alone
    monkeypatch.setitem(gpus.GPUS, "h200", replace(gpus.GPUS["h200"], memory_bytes=gib))
    assert main(args) == 0
    assert "will not fit on the H200 at batch 4" in capsys.readouterr().out


UNGUARDED_SCRIPT = '''
import logging, sys
import numpy as np
from dprobe.profiling.coldstart.crossval import cross_validate
from dprobe.profiling.coldstart.dataset import make_dataset
from dprobe.profiling.coldstart.features import FEATURES

logging.basicConfig(level=logging.WARNING)
# no `if __name__ == "__main__":`: each spawned worker re-runs this script and dies starting its own pool
rng = np.random.default_rng(0)
n = 24
feats = rng.normal(size=(n, len(FEATURES)))
base = np.abs(rng.normal(size=(n, 4))) + 1.0
y = base * np.exp(rng.normal(scale=0.05, size=(n, 4)))
ds = make_dataset([None] * n, feats, base, y, [f"f{i % 6}" for i in range(n)], [str(i) for i in range(n)])
ds.padding = np.zeros(2_000_000)  # a data set far larger than a pipe's buffer
cv = cross_validate("unused", "unused", max_epochs=2, ds=ds, progress=False, ensemble=1, hidden=8, folds=3,
                    workers=2)
print("scored", int(np.isfinite(cv.p50).all()))
'''


@pytest.mark.slow
def test_cross_validation_from_a_script_without_main_guard_does_not_hang(tmp_path) -> None:
    """Spawned workers that die before they start (here: a script without a main guard) cost the pool,
    not the run: the folds are fitted in-process instead of the parent waiting on them for ever."""
    import subprocess
    import sys

    script = tmp_path / "cv_script.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scored 1" in done.stdout
    assert "fitting the folds in this process" in done.stderr


RECURRENT_MODULE = '''
import torch
from torch import nn


class Recurrent(nn.Module):
    """Two recurrent layers of different widths (an encoder whose final state starts the decoder)."""

    def __init__(self, mode="LSTM", steps=50):
        super().__init__()
        self.steps = steps
        self.encoder = getattr(nn, mode)(16, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.decoder = getattr(nn, mode)(64, 32, num_layers=1, batch_first=True)

    def forward(self, x):
        out, state = self.encoder(x)
        if isinstance(state, tuple):
            state = tuple(s[-1:] for s in state)
        else:
            state = state[-1:]
        out, _ = self.decoder(out, state)
        return out

    def example_inputs(self, batch):
        return torch.randn(batch, self.steps, 16)


def make(mode="LSTM", steps=50):
    return Recurrent(mode, steps)
'''


def _recurrent_flops(mode: str, steps: int, batch: int) -> float:
    """Matrix-product FLOPs of a training step of RECURRENT_MODULE: forward, and twice that in backward."""
    gates = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1}[mode]
    layers = [(16, 32)] * 2 + [(64, 32)] * 2 + [(64, 32)]  # (input, hidden) per layer and direction
    return 3 * sum(2 * steps * batch * gates * h * (i + h) for i, h in layers)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_replay_as_fused_kernels(tmp_path, monkeypatch, mode) -> None:
    """cuDNN runs a recurrent layer as a few kernels, not a few per time step: the replay's kernel count
    does not grow with the sequence, its FLOPs are the recurrences', and its memory stays near what
    PyTorch's step-by-step reference keeps."""
    import contextlib

    from dprobe.graph.zoo import parse_spec
    from dprobe.profiling.coldstart import replay

    (tmp_path / "recurrent_model.py").write_text(RECURRENT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = lambda steps: parse_spec("module:recurrent_model:make", {"mode": mode, "steps": steps})  # noqa: E731
    short, long = (replay_training_step(spec(t), batch=8, precision="bf16") for t in (50, 100))
    assert short.kernels == long.kernels < 200
    key = "RNN_TANH" if mode == "RNN" else mode
    assert short.matmul_flops == _recurrent_flops(key, 50, 8)
    assert long.matmul_flops == _recurrent_flops(key, 100, 8)
    monkeypatch.setattr(replay, "fused_recurrent_layers", lambda model: contextlib.nullcontext())
    reference = replay_training_step(spec(50), batch=8, precision="bf16")
    assert reference.kernels > 10 * short.kernels
    assert 0.3 < short.peak_bytes / reference.peak_bytes < 2.0


def test_fused_recurrence_passes_gradients_everywhere(tmp_path, monkeypatch) -> None:
    """On real tensors too: every weight, the encoder's through the decoder's initial state, gets a
    gradient of its own shape, and the layers get their own forward back afterwards."""
    import importlib

    from dprobe.graph.rnn import fused_recurrent_layers

    (tmp_path / "recurrent_model.py").write_text(RECURRENT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("recurrent_model").make("LSTM", 7)
    with fused_recurrent_layers(model) as swapped:
        out = model(torch.randn(3, 7, 16))
        out.float().sum().backward()
    assert swapped == 2 and out.shape == (3, 7, 32)
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
    assert "forward" not in vars(model.encoder) and "forward" not in vars(model.decoder)
