"""Tests of dprobe.graph: tracing, ONNX reading, JSON schema, encoder, CLI."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from dprobe.data.h200 import graph_for_run
from dprobe.graph import GraphError, ModelGraph, build_model_graph, load_model_graph, trace_module
from dprobe.graph.encoder import GraphEncoder, graph_to_data

TINY_GPT2 = '{"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 64}'


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: untraceable on meta tensors
            return self.a(x)
        return x


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, groups=8, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0(self.conv(x))  # an op outside the vocabulary


@pytest.fixture(scope="module")
def resnet18() -> ModelGraph:
    return build_model_graph("torchvision:resnet18", batch=2)


def test_resnet18_fx(resnet18: ModelGraph) -> None:
    assert resnet18.source == "fx"
    assert resnet18.num_params == 11_689_512
    assert 7.0e9 < resnet18.flops < 7.6e9  # ~1.8 GMAC = 3.6 GFLOP per image, batch 2
    assert resnet18.saved_bytes > 0 and resnet18.unknown_nodes == 0
    assert {"conv", "batchnorm", "relu", "linear"} <= set(resnet18.kind_counts())
    assert resnet18.nodes[-1].shapes == [[2, 1000]]


def test_json_round_trip(resnet18: ModelGraph, tmp_path) -> None:
    path = resnet18.save(tmp_path / "g.json")
    back = load_model_graph(path)
    assert back.to_dict() == resnet18.to_dict()
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match="version"):
        load_model_graph(path)


def test_grouped_conv_flops() -> None:
    g = trace_module(Odd().to("meta"), (torch.randn(1, 8, 4, 4, device="meta"),))
    conv = next(n for n in g.nodes if n.kind == "conv")
    assert conv.flops == 2 * 8 * 16 * 9  # one input channel per group
    assert g.unknown_nodes == 1 and any(n.kind == "other" for n in g.nodes)


def test_transformers_dispatch_fallback() -> None:
    g = build_model_graph("transformers:GPT2Config/GPT2LMHeadModel", batch=2, seq=16, config_kwargs=TINY_GPT2)
    assert g.source == "dispatch"
    assert g.num_params == g.meta["params_total"]
    assert g.inputs["seq"] == 16 and g.flops > 0 and len(g.edges) > len(g.nodes) / 2


class PooledNorm(nn.Module):
    """Batch norm after global pooling: one value per channel at batch 1."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x).mean(dim=(2, 3)))


@pytest.mark.parametrize("tracer", ["fx", "dispatch"])
def test_batch_of_one_through_pooled_batch_norm(tracer: str) -> None:
    model = PooledNorm().to("meta")
    g = trace_module(model, (torch.randn(1, 3, 8, 8, device="meta"),), tracer=tracer)
    assert "batchnorm" in g.kind_counts() and g.nodes[-1].shapes == [[1, 8]]
    assert "fails in PyTorch" in g.meta["note"]  # the graph says so: training at batch 1 would not run
    assert model.norm.running_mean is not None  # the module is left as it was
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.functional.batch_norm(torch.randn(1, 8), None, None, training=True)  # and so is PyTorch
    assert "note" not in trace_module(model, (torch.randn(2, 3, 8, 8, device="meta"),), tracer=tracer).meta


@pytest.mark.parametrize(("name", "kind"), [
    ("aten.swapaxes.default", "reshape"), ("aten.movedim.int", "reshape"), ("Unfold", "reshape"),
    ("aten.im2col.default", "reshape"), ("PixelShuffle", "reshape"), ("DepthToSpace", "reshape"),
    ("_patch_merging_pad", "concat"), ("Upsample", "elementwise"), ("aten.upsample_bilinear2d.vec", "elementwise"),
    ("interpolate", "elementwise"), ("Resize", "elementwise"), ("aten.remainder.Tensor", "elementwise"),
    ("Mod", "elementwise"), ("LSTM", "linear"), ("GRU", "linear"),
])
def test_op_vocabulary_covers_common_zoo_ops(name: str, kind: str) -> None:
    from dprobe.graph.ops import normalise_op

    assert normalise_op(name) == kind


def test_default_image_size_is_the_models_own() -> None:
    from dprobe.graph.zoo import default_image_size

    class Timm(nn.Module):
        pretrained_cfg = {"input_size": (3, 256, 256)}

    class Vit(nn.Module):
        image_size = 384

    assert (default_image_size(Timm()), default_image_size(Vit()), default_image_size(nn.Linear(2, 2))) == (
        256, 384, 224)
    g = build_model_graph("timm:botnet26t_256", batch=1)  # asserts its input is 256 x 256
    assert g.inputs["image"] == 256 and g.nodes[0].shapes == [[1, 3, 256, 256]]


TINY_BART = json.dumps({"encoder_layers": 1, "decoder_layers": 1, "d_model": 32, "encoder_attention_heads": 2,
                        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                        "vocab_size": 100})


def test_model_that_reads_its_mask_values() -> None:
    """BART reads its attention mask's values (not possible on meta): retried with masks built from shapes."""
    g = build_model_graph("transformers:BartConfig/BartForConditionalGeneration", batch=2, seq=8,
                          config_kwargs=TINY_BART)
    assert g.source == "dispatch" and g.unknown_nodes == 0 and g.flops > 0
    assert "masks built from shapes" in g.meta["note"]
    import transformers.masking_utils as masking

    assert not masking.is_tracing(torch.zeros(1))  # transformers is left as it was


TINY_VIT = json.dumps({"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                       "image_size": 32, "patch_size": 8, "num_labels": 5})
TINY_WHISPER = json.dumps({"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
                           "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                           "num_mel_bins": 8, "max_source_positions": 16})
TINY_CLIP = json.dumps({"text_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                        "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 16},
                        "vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                          "intermediate_size": 64, "image_size": 32, "patch_size": 8},
                        "projection_dim": 16})
TINY_SPEECH2TEXT = json.dumps({"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
                               "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                               "input_feat_per_channel": 8, "input_channels": 1, "conv_channels": 16,
                               "vocab_size": 100})
TINY_T5 = json.dumps({"d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2, "vocab_size": 100})


@pytest.mark.parametrize(("spec", "kwargs", "inputs", "loss"), [
    ("transformers:ViTConfig/ViTForImageClassification", TINY_VIT, {"pixel_values": [2, 3, 32, 32]}, "output"),
    # decoder labels of the default length, log-mel frames of its 30 s window (2 x max_source_positions)
    ("transformers:WhisperConfig/WhisperForConditionalGeneration", TINY_WHISPER,
     {"input_features": [2, 8, 32], "labels": [2, 128]}, "output"),
    # filterbank frames, [B, frames, features]: 1,000 of 10 ms by default
    ("transformers:Speech2TextConfig/Speech2TextForConditionalGeneration", TINY_SPEECH2TEXT,
     {"input_features": [2, 1000, 8], "labels": [2, 128]}, "output"),
    # text ids only as long as its positions go (16 < 128), an image beside them, its contrastive loss
    ("transformers:CLIPConfig/CLIPModel", TINY_CLIP, {"input_ids": [2, 16], "pixel_values": [2, 3, 32, 32]},
     "output"),
    # T5 keeps decoder_start_token_id out of its config; training shifts the labels right with it
    ("transformers:T5Config/T5ForConditionalGeneration", TINY_T5, {"input_ids": [2, 128], "labels": [2, 128]},
     "output"),
    ("torchvision:r3d_18", None, {"0": [2, 3, 16, 112, 112]}, "ce"),  # a clip: [B, C, T, H, W]
    ("torchvision:lraspp_mobilenet_v3_large", None, {"0": [2, 3, 520, 520]}, "ce"),  # a class per pixel
])
def test_example_inputs_beyond_images_and_token_ids(spec: str, kwargs: str | None, inputs: dict,
                                                    loss: str) -> None:
    from dprobe.graph.zoo import build_module, example_inputs, parse_spec
    from dprobe.profiling.coldstart.replay import replay_training_step

    parsed = parse_spec(spec, kwargs)
    ex = example_inputs(parsed, build_module(parsed), 2, labels=True)
    given = {**{str(i): a for i, a in enumerate(ex.args)}, **ex.kwargs}
    assert {k: list(given[k].shape) for k in inputs} == inputs and ex.loss == loss
    if spec.startswith("torchvision"):  # small images for the replay (the defaults are checked above)
        est = replay_training_step(parsed, 2, image=64)
    else:
        est = replay_training_step(parsed, 2)
    assert est.peak_bytes > est.param_bytes > 0 and est.flops > 0


def test_moe_experts_replay_with_batched_matmuls() -> None:
    """Mixtral's experts default to grouped GEMMs that refuse fp32 weights; the error says what to pass,
    and with it the model traces and replays."""
    from dprobe.graph.zoo import parse_spec
    from dprobe.profiling.coldstart.replay import replay_training_step

    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "num_local_experts": 4, "vocab_size": 100}
    spec = "transformers:MixtralConfig/MixtralForCausalLM"
    with pytest.raises(GraphError, match='add "experts_implementation": "batched_mm" to --config-kwargs'):
        build_model_graph(spec, batch=2, seq=8, config_kwargs=tiny)
    batched = {**tiny, "experts_implementation": "batched_mm"}
    assert build_model_graph(spec, batch=2, seq=8, config_kwargs=batched).unknown_nodes == 0
    est = replay_training_step(parse_spec(spec, batched), 2, "bf16", seq=8)
    assert est.peak_bytes > est.param_bytes > 0


@pytest.mark.parametrize(("spec", "pattern"), [
    ("torchvision:fasterrcnn_mobilenet_v3_large_fpn", "trains on lists of images with target boxes"),
    ("torchvision:raft_small", "pairs of frames"),
    ("torchvision:quantized_resnet18", "int8 model for inference"),
    ("transformers:PatchTSTConfig/PatchTSTForPrediction", "takes 'past_values'"),  # a time-series model
])
def test_models_whose_training_inputs_dprobe_does_not_make(spec: str, pattern: str) -> None:
    with pytest.raises(GraphError, match=pattern):
        build_model_graph(spec, batch=2)


GATED_MODULE = '''
import torch
from torch import nn


class Gated(nn.Module):
    """A model with keyword inputs, as a module: factory would give it."""

    def __init__(self, width=8):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x, *, mask, scale):
        return self.proj(x) * mask * scale

    def example_inputs(self, batch):
        return {"x": torch.randn(batch, 8), "mask": torch.ones(batch, 8), "scale": 0.5}


def make_gated(width=8):
    return Gated(width)
'''


def test_module_factory_with_keyword_example_inputs(tmp_path, monkeypatch) -> None:
    from dprobe.graph.zoo import parse_spec
    from dprobe.profiling.coldstart.replay import replay_training_step

    (tmp_path / "gated_model.py").write_text(GATED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "module:gated_model:make_gated"
    g = build_model_graph(spec, batch=4)
    assert g.unknown_nodes == 0 and [n.kind for n in g.nodes if n.kind not in ("input", "output")] == [
        "linear", "elementwise", "elementwise"]  # the keyword inputs reached the forward
    est = replay_training_step(parse_spec(spec), 4)
    assert est.matmul_flops == 2 * (2 * 4 * 8 * 8)  # forward, and the weight gradient (inputs need none)


def test_untraceable_module() -> None:
    with pytest.raises(GraphError, match="cannot trace model 'Branchy'.*torch.fx"):
        trace_module(Branchy().to("meta"), (torch.randn(2, 8, device="meta"),))


@pytest.mark.parametrize(("spec", "kwargs", "pattern"), [
    ("torchvision:not_a_net", None, "unknown torchvision model 'not_a_net'"),
    ("timm:not_a_net", None, "unknown timm model"),
    ("transformers:NopeConfig/GPT2LMHeadModel", None, "no config class 'NopeConfig'"),
    ("transformers:GPT2Config/GPT2LMHeadModel", '{"n_layer": ', "not valid JSON"),
    ("transformers:GPT2Config/GPT2LMHeadModel", '{"n_layerz": 2}', "n_layerz"),
    ("transformers:GPT2Config/GPT2LMHeadModel", "[1]", "JSON object"),
    ("foo:bar", None, "unknown source 'foo'"),
    ("module:os:getcwd", None, "not an nn.Module"),
])
def test_bad_specs(spec: str, kwargs: str | None, pattern: str) -> None:
    with pytest.raises(GraphError, match=pattern):
        build_model_graph(spec, config_kwargs=kwargs)


def _export_onnx(model: nn.Module, path, x: torch.Tensor) -> None:
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])


def test_onnx_reader(tmp_path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, groups=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    path = tmp_path / "m.onnx"
    _export_onnx(model, path, torch.randn(1, 3, 8, 8))
    g = build_model_graph(str(path))
    assert g.source == "onnx"
    assert g.num_params == sum(p.numel() for p in model.parameters())
    conv = next(n for n in g.nodes if n.kind == "conv")
    assert conv.flops == 2 * 8 * 36 * 27 and conv.shapes == [[1, 8, 6, 6]]


class ChannelShuffle(nn.Module):
    """A reshape to sizes read from the tensor's own shape: ONNX shape inference cannot follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.shape
        return y.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w).relu()


def test_onnx_external_data(tmp_path) -> None:
    """Weights saved beside the file (large exports) are read; without their data file, the error says so."""
    import onnx

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    _export_onnx(model, tmp_path / "m.onnx", torch.randn(1, 64))
    onnx.save_model(onnx.load(str(tmp_path / "m.onnx")), str(tmp_path / "ext.onnx"), save_as_external_data=True,
                    location="ext.data", size_threshold=0)
    g = build_model_graph(str(tmp_path / "ext.onnx"))
    assert g.num_params == sum(p.numel() for p in model.parameters())
    (tmp_path / "ext.data").unlink()
    with pytest.raises(GraphError, match=r"ext.onnx: its weights are stored in external data that cannot be read"):
        build_model_graph(str(tmp_path / "ext.onnx"))


def test_onnx_shapes_at_the_requested_batch(tmp_path) -> None:
    """Dims inference leaves unknown are learnt by running the model at batch 1 and 2, not taken as the batch."""
    path = tmp_path / "shuffle.onnx"
    torch.onnx.export(ChannelShuffle(), (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    g = build_model_graph(str(path), batch=32)
    shapes = {n.op: n.shapes[0] for n in g.nodes if n.op in ("Conv", "Transpose", "Relu")}
    assert shapes == {"Conv": [32, 8, 16, 16], "Transpose": [32, 4, 2, 16, 16], "Relu": [32, 8, 16, 16]}


def test_onnx_token_inputs_take_batch_then_seq(tmp_path) -> None:
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 8))
    path = tmp_path / "tokens.onnx"
    torch.onnx.export(model, (torch.zeros(1, 5, dtype=torch.long),), str(path), dynamo=False, input_names=["ids"],
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    g = build_model_graph(str(path), batch=4, seq=10)
    assert next(n for n in g.nodes if n.kind == "input").shapes == [[4, 10]]
    assert next(n for n in g.nodes if n.kind in ("linear", "matmul")).shapes == [[4, 10, 8]]


def test_onnx_unknown_op_and_corrupt(tmp_path, caplog) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu0"),
             helper.make_node("Frobnicate", ["h"], ["y"], name="mystery", domain="custom.ops")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)])
    path = tmp_path / "u.onnx"
    onnx.save(model, str(path))
    with caplog.at_level(logging.WARNING):
        g = build_model_graph(str(path))
    assert g.unknown_nodes == 1 and "mystery" in caplog.text
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a protobuf at all" * 10)
    with pytest.raises(GraphError, match="corrupt ONNX"):
        build_model_graph(str(bad))


def test_encoder(resnet18: ModelGraph) -> None:
    from torch_geometric.data import Batch

    small = build_model_graph("transformers:GPT2Config/GPT2LMHeadModel", seq=8, config_kwargs=TINY_GPT2)
    batch = Batch.from_data_list([graph_to_data(resnet18), graph_to_data(small)])
    z = GraphEncoder(hidden=16, out_dim=8, layers=2)(batch)
    assert z.shape == (2, 8) and torch.isfinite(z).all()


def test_graph_for_run_cache(tmp_path) -> None:
    row = {"run_id": "x", "lib": "torchvision", "model": "resnet18", "config": None, "arch": None,
           "config_kwargs": {}, "image": 64.0, "seq": float("nan"), "batch": 4}
    g1 = graph_for_run(row, tmp_path)
    assert len(list(tmp_path.glob("graph-*.json"))) == 1
    assert graph_for_run(row, tmp_path).to_dict() == g1.to_dict()


def test_cli_graph(tmp_path, capsys) -> None:
    from dprobe.cli import main

    out = tmp_path / "g.json"
    assert main(["graph", "torchvision:resnet18", "--batch", "2", "--image", "64", "--out", str(out)]) == 0
    assert load_model_graph(out).inputs["image"] == 64
    assert "resnet18" in capsys.readouterr().err
    assert main(["graph", "torchvision:nope"]) == 2
    assert "unknown torchvision model" in capsys.readouterr().err
    for flag in ("--seq", "--image", "--batch"):  # refused before anything is built
        assert main(["graph", "torchvision:resnet18", flag, "0"]) == 2
        assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_seq_counts_the_frames_of_a_filterbank_input() -> None:
    """For a Speech2Text-like, --seq is the audio's length in frames; its decoder labels keep theirs."""
    from dprobe.graph.zoo import build_module, example_inputs, parse_spec

    parsed = parse_spec("transformers:Speech2TextConfig/Speech2TextForConditionalGeneration", TINY_SPEECH2TEXT)
    ex = example_inputs(parsed, build_module(parsed), 2, seq=300, labels=True)
    assert list(ex.kwargs["input_features"].shape) == [2, 300, 8] and list(ex.kwargs["labels"].shape) == [2, 128]
    assert ex.meta["frames"] == 300


# a T5 run as the collector records it: transformers 5 keeps decoder_start_token_id out of T5Config's fields
RECORDED_T5 = ("T5Config", "T5ForConditionalGeneration", '{"decoder_start_token_id": 0, "pad_token_id": 0}')


def recorded_config_kwargs() -> list[tuple[str, str, str]]:
    """Every distinct (config, arch, config_kwargs) of h200-profiles' transformers runs, and the T5 run's."""
    from pathlib import Path

    import pandas as pd

    runs = pd.read_csv(Path(__file__).resolve().parents[1] / "datasets" / "h200-profiles" / "runs.csv")
    text = runs[runs["lib"] == "transformers"]
    found = {(str(c), str(a), k if isinstance(k, str) else "")
             for c, a, k in zip(text["config"], text["arch"], text["config_kwargs"], strict=True)}
    return sorted(found | {RECORDED_T5})


def test_every_recorded_config_kwargs_is_accepted() -> None:
    """What the recorded runs were built with, `dprobe predict --config-kwargs` takes, parser and builder alike."""
    from dprobe.cli import build_parser
    from dprobe.graph.zoo import check_config_kwargs, parse_spec

    recorded = recorded_config_kwargs()
    assert len(recorded) > 20 and RECORDED_T5 in recorded
    parser = build_parser()
    for config, arch, kwargs in recorded:
        args = parser.parse_args(["predict", f"transformers:{config}/{arch}", "--batch", "1", "--config-kwargs",
                                  kwargs, "--json"])
        check_config_kwargs(parse_spec(args.model, args.config_kwargs))
    with pytest.raises(GraphError, match="not accepted by T5Config: decoder_start_tokn_id"):
        check_config_kwargs(parse_spec("transformers:T5Config/T5ForConditionalGeneration",
                                       '{"decoder_start_tokn_id": 0}'))


def test_t5_built_with_its_recorded_token_ids() -> None:
    """The recorded T5 kwargs reach the config: training shifts the labels right by decoder_start_token_id."""
    from dprobe.graph.zoo import build_module, parse_spec

    kwargs = {**json.loads(TINY_T5), **json.loads(RECORDED_T5[2]), "decoder_start_token_id": 3}
    model = build_module(parse_spec("transformers:T5Config/T5ForConditionalGeneration", kwargs))
    assert model.config.decoder_start_token_id == 3 and model.config.pad_token_id == 0
