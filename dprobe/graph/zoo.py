"""Model specs (``torchvision:NAME``, ``timm:NAME``, ``transformers:CONFIG/ARCH``, ``module:pkg.mod:factory``,
``path.onnx``): parsing, building on the meta device, and example inputs."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from dprobe.core.patch import replaced
from dprobe.graph.schema import GraphError

T = TypeVar("T")
LM_SUFFIXES = ("LMHeadModel", "ForCausalLM", "ForMaskedLM", "ForConditionalGeneration", "WithLMHead")
CLS_SUFFIXES = ("ForSequenceClassification", "ForImageClassification", "ForTokenClassification")
# kwargs every transformers config takes (and pops) that choose kernels: "eager", "sdpa", "batched_mm", ...
CONFIG_IMPLEMENTATION_KWARGS = {"attn_implementation", "experts_implementation"}
# special token ids every transformers config took before 5.0 (PretrainedConfig's arguments), which 5.x moved to
# the generation config but still keeps as attributes when given and which models read from their config (T5
# shifts its labels right by decoder_start_token_id); recorded runs give them
TOKEN_ID_KWARGS = {"bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id"}
AUDIO_SAMPLES = 16000  # default length of a raw-audio input (input_values): one second at 16 kHz
FEATURE_FRAMES = 1000  # default length of a filterbank input (Speech2Text's input_features): 10 s of 10 ms frames


@dataclass
class ModelSpec:
    """A parsed model spec."""

    text: str
    lib: str
    name: str
    config: str = ""
    arch: str = ""
    config_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_text(self) -> bool:
        return self.lib == "transformers"


def parse_config_kwargs(value: str | dict | None) -> dict[str, Any]:
    """``--config-kwargs``: a JSON object (or an already parsed dict)."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise GraphError(f"config kwargs are not valid JSON ({exc}): {value!r}") from exc
    if not isinstance(parsed, dict):
        raise GraphError(f"config kwargs must be a JSON object, got {type(parsed).__name__}: {value!r}")
    return parsed


def parse_spec(text: str, config_kwargs: str | dict | None = None) -> ModelSpec:
    """Parse a model spec string; raises GraphError naming what is wrong."""
    kwargs = parse_config_kwargs(config_kwargs)
    if text.lower().endswith(".onnx") or (Path(text).is_file() and ":" not in text):
        return ModelSpec(text=text, lib="onnx", name=text)
    lib, sep, rest = text.partition(":")
    if not sep or not rest:
        raise GraphError(f"model spec {text!r}: expected torchvision:NAME, timm:NAME, transformers:CONFIG/ARCH, "
                         "module:pkg.mod:factory or a path to an .onnx file")
    if lib == "transformers":
        config, slash, arch = rest.partition("/")
        if not slash or not config or not arch:
            raise GraphError(f"model spec {text!r}: transformers specs are transformers:CONFIG/ARCH "
                             "(e.g. transformers:GPT2Config/GPT2LMHeadModel)")
        return ModelSpec(text=text, lib=lib, name=arch, config=config, arch=arch, config_kwargs=kwargs)
    if lib in ("torchvision", "timm", "module"):
        if kwargs and lib != "module":
            raise GraphError(f"model spec {text!r}: --config-kwargs only applies to transformers: and module: specs")
        return ModelSpec(text=text, lib=lib, name=rest, config_kwargs=kwargs)
    raise GraphError(f"model spec {text!r}: unknown source {lib!r} (torchvision, timm, transformers, module, .onnx)")


# torchvision model groups whose training inputs are not a batch of tensors, or that do not train
TORCHVISION_UNSUPPORTED = {
    "detection": "trains on lists of images with target boxes",
    "optical_flow": "trains on pairs of frames with flow targets",
    "quantization": "is an int8 model for inference, not training",
}


def torchvision_group(name: str) -> str:
    """The ``torchvision.models`` subpackage a builder lives in ("resnet", "video", "segmentation", ...)."""
    import torchvision

    parts = torchvision.models.get_model_builder(name).__module__.split(".")
    return parts[2] if len(parts) > 2 else ""


def _torchvision(name: str) -> nn.Module:
    import torchvision

    if name not in torchvision.models.list_models():
        raise GraphError(f"unknown torchvision model {name!r} (see torchvision.models.list_models())")
    group = torchvision_group(name)
    if group in TORCHVISION_UNSUPPORTED:
        raise GraphError(f"torchvision:{name} {TORCHVISION_UNSUPPORTED[group]}, which dprobe does not replay; for "
                         "a model whose training step takes tensors, give a module:pkg.mod:factory whose model has "
                         "an example_inputs(batch) method")
    params = inspect.signature(torchvision.models.get_model_builder(name)).parameters
    # no weights of any part (segmentation and detection builders default to an ImageNet backbone, a
    # download), no auxiliary heads (they change the training output), no slow weight init
    kwargs: dict[str, Any] = {"weights": None}
    if "weights_backbone" in params:
        kwargs["weights_backbone"] = None
    if "aux_loss" in params:
        kwargs["aux_loss"] = False
    for extra in ({"aux_logits": False, "init_weights": False}, {"init_weights": False}, {"aux_logits": False}):
        try:
            return torchvision.models.get_model(name, **kwargs, **extra)
        except TypeError:
            continue
    return torchvision.models.get_model(name, **kwargs)


def _timm(name: str) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise GraphError(f"unknown timm model {name!r} (see timm.list_models())")
    return timm.create_model(name, pretrained=False)


def check_config_kwargs(spec: ModelSpec) -> tuple[type, type]:
    """A ``transformers`` spec's config and model classes; a GraphError naming a class transformers does not
    have or a config kwarg the config does not take (its fields and arguments, ``PretrainedConfig``'s, the
    kernel choices and the special token ids)."""
    import transformers

    found = getattr(transformers, spec.config, None)
    if not isinstance(found, type):
        raise GraphError(f"transformers has no config class {spec.config!r}")
    config_cls: type[Any] = found
    arch_cls = getattr(transformers, spec.arch, None)
    if not isinstance(arch_cls, type):
        raise GraphError(f"transformers has no model class {spec.arch!r}")
    known = (set(config_cls().to_dict()) | set(inspect.signature(config_cls.__init__).parameters)
             | set(inspect.signature(transformers.PretrainedConfig.__init__).parameters)
             | {n for n, v in inspect.getmembers(config_cls) if isinstance(v, property) and v.fset}  # num_labels
             | CONFIG_IMPLEMENTATION_KWARGS | TOKEN_ID_KWARGS)
    unknown = sorted(k for k in spec.config_kwargs if k not in known)
    if unknown:
        raise GraphError(f"config kwargs not accepted by {spec.config}: {', '.join(unknown)}")
    return config_cls, arch_cls


def _transformers(spec: ModelSpec) -> nn.Module:
    config_cls, arch_cls = check_config_kwargs(spec)
    try:
        config = config_cls(**spec.config_kwargs)
        if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
            # T5-likes keep it in their generation config; training shifts labels right with it
            config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
        return arch_cls(config)
    except Exception as exc:  # noqa: BLE001 - any construction failure is a spec problem
        raise GraphError(f"cannot build {spec.arch} from {spec.config}(**{spec.config_kwargs}): {exc}") from exc


def _module(spec: ModelSpec) -> nn.Module:
    mod_name, sep, factory = spec.name.rpartition(":")
    if not sep or not mod_name or not factory:
        raise GraphError(f"model spec {spec.text!r}: module specs are module:pkg.mod:factory")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise GraphError(f"model spec {spec.text!r}: cannot import {mod_name!r} ({exc})") from exc
    fn = getattr(mod, factory, None)
    if fn is None or not callable(fn):
        raise GraphError(f"model spec {spec.text!r}: {mod_name} has no callable {factory!r}")
    model = fn(**spec.config_kwargs)
    if not isinstance(model, nn.Module):
        raise GraphError(f"model spec {spec.text!r}: {factory}() returned {type(model).__name__}, not an nn.Module")
    return model


def build_module(spec: ModelSpec, device: str = "meta") -> nn.Module:
    """Build the model (untrained weights) on ``device`` (meta: no memory is used)."""
    if spec.lib == "onnx":
        raise GraphError(f"{spec.text}: an ONNX file is read as a graph, not built as a module")
    try:
        with torch.device(device):
            model = _build(spec)
    except (NotImplementedError, RuntimeError) as exc:
        if device != "meta":
            raise GraphError(f"cannot build {spec.text}: {exc}") from exc
        # some constructors compute with tensors (not possible on meta): build on CPU, then move
        model = _build(spec).to(device)
    return model.train()


def _build(spec: ModelSpec) -> nn.Module:
    if spec.lib == "torchvision":
        return _torchvision(spec.name)
    if spec.lib == "timm":
        return _timm(spec.name)
    if spec.lib == "transformers":
        return _transformers(spec)
    return _module(spec)


@dataclass
class ExampleInputs:
    """Positional and keyword inputs, and how a training loss is taken from the output."""

    args: tuple
    kwargs: dict[str, Any]
    loss: str  # "output" (model returns .loss), "ce" (cross-entropy vs random class labels), "mean"
    meta: dict[str, Any] = field(default_factory=dict)


META_VALUE_ERROR = "cannot be called on meta tensors"  # PyTorch's words for reading a value on meta
NONZERO_ERROR = "register_meta function for torch.nonzero"  # ... and for a shape that depends on values
VALUES_ASSUMED_NOTE = ("attention masks built from shapes, every mask and label taken as valid (the model reads "
                       "their values otherwise)")


@contextlib.contextmanager
def transformers_values_assumed() -> Iterator[None]:
    """Let a ``transformers`` model that reads tensor values run on meta tensors, taking every mask and
    label as valid.

    - Attention masks: tell ``transformers`` it is being traced, so that it builds them from shapes
      alone. Untraced, some models (BART) read a mask's values to decide whether it can be skipped; traced
      (as under torch.compile), they build it, as they do for a padded batch.
    - The warning some models give when token ids hold padding without a mask (DeBERTa-v2) is skipped: it
      reads the ids, and computes nothing.
    - ``nonzero`` (e.g. the labels to keep, ``labels >= 0``) answers as if every element were non-zero,
      PyTorch's own meta rule behind ``meta_nonzero_assume_all_nonzero``: all labels valid, as in a batch
      without padding.

    Used only as a retry for models that fail otherwise, so that no model that traces today changes.
    """
    try:
        import transformers.masking_utils as masking
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:
        yield
        return
    from torch.fx.experimental import _config as fx_config

    with (replaced(masking, "is_tracing", lambda tensor=None: True),
          replaced(PreTrainedModel, "warn_if_padding_and_no_attention_mask", lambda self, *args, **kwargs: None),
          # patch() is added to the module at its import (install_config_module), which its types do not say
          fx_config.patch(meta_nonzero_assume_all_nonzero=True)):  # type: ignore[attr-defined]
        yield


def reads_values(exc: BaseException) -> bool:
    """Whether ``exc`` is PyTorch refusing, on meta tensors, to read a value or size a tensor by values."""
    return META_VALUE_ERROR in str(exc) or NONZERO_ERROR in str(exc)


def remedy(exc: BaseException) -> str:
    """What to do about a known reason a model cannot be replayed on meta tensors ("" if none is known)."""
    text = str(exc)
    if "Expected mat_a to be BFloat16" in text:  # transformers' MoE experts on torch's grouped GEMM
        return ("; grouped expert GEMMs take bf16 weights only (on the GPU too), and dprobe's graphs hold weights "
                "in fp32: add \"experts_implementation\": \"batched_mm\" to --config-kwargs")
    if reads_values(exc):
        return "; the forward reads tensor values (data-dependent shapes), which a replay on meta tensors cannot"
    return ""


def with_values_assumed_if_needed(spec: ModelSpec, attempt: Callable[[], T]) -> tuple[T, bool]:
    """``attempt()``; for a ``transformers`` model that failed by reading a value on meta, ``attempt()``
    again under :func:`transformers_values_assumed`. Returns the result and whether it was retried."""
    try:
        return attempt(), False
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the one failure a retry fixes
        if spec.lib != "transformers" or not reads_values(exc):
            raise
    with transformers_values_assumed():
        return attempt(), True


def default_image_size(model: nn.Module, spec: ModelSpec | None = None) -> int:
    """The input size a vision model is built for: timm's ``pretrained_cfg["input_size"]``,
    torchvision's ``image_size`` (ViT), a torchvision segmentation model's training resize (520),
    else 224."""
    if spec is not None and spec.lib == "torchvision" and torchvision_group(spec.name) == "segmentation":
        import torchvision

        return int(torchvision.models.get_model_weights(spec.name).DEFAULT.transforms().resize_size[0])
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if isinstance(size, (tuple, list)) and len(size) == 3 and int(size[1]) > 0:
        return int(size[1])
    size = getattr(model, "image_size", None)
    return int(size) if isinstance(size, int) and size > 0 else 224


def example_inputs(spec: ModelSpec, model: nn.Module, batch: int, image: int | None = None,
                   seq: int | None = None, labels: bool = False, device: str = "meta") -> ExampleInputs:
    """Random inputs of the right shape: images ``3 x image x image`` (video: clips of frames), token
    ids of length ``seq``, or what a ``transformers`` model's ``main_input_name`` asks for."""
    if spec.lib == "transformers":
        return _transformers_inputs(spec, model, batch, image, seq, labels, device)
    factory_inputs = getattr(model, "example_inputs", None)
    if callable(factory_inputs):  # a tensor, a tuple of positional inputs, or a dict of keyword inputs
        given = factory_inputs(batch)
        if isinstance(given, dict):
            return ExampleInputs((), {k: _on(device, v) for k, v in given.items()}, "mean", {"batch": batch})
        args = given if isinstance(given, tuple) else (given,)
        return ExampleInputs(tuple(_on(device, a) for a in args), {}, "mean", {"batch": batch})
    if spec.lib == "torchvision" and torchvision_group(spec.name) == "video":
        frames, side = _video_clip(spec.name)
        image = int(image or side)
        x = torch.randn(batch, 3, frames, image, image, device=device)  # [B, C, T, H, W]
        return ExampleInputs((x,), {}, "ce", {"batch": batch, "image": image, "frames": frames})
    image = int(image or default_image_size(model, spec))
    x = torch.randn(batch, 3, image, image, device=device)
    return ExampleInputs((x,), {}, "ce", {"batch": batch, "image": image})


def _on(device: str, value: Any) -> Any:
    """A tensor moved to ``device``; anything else as it is."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _transformers_inputs(spec: ModelSpec, model: nn.Module, batch: int, image: int | None, seq: int | None,
                         labels: bool, device: str) -> ExampleInputs:
    """Token ids, pixel values or audio by the model's ``main_input_name``, and labels for its own loss."""
    config: Any = model.config  # the model's transformers config (nn.Module types attributes as tensors)
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    # token ids: the text input, or the labels / decoder input of a model whose main input is not text;
    # 128 of them, or fewer where the text positions end sooner (CLIP's 77); --seq counts them, or audio
    # samples for a raw-audio model, or filterbank frames for a Speech2Text-like
    text = getattr(config, "text_config", None) or config
    tokens = min(128, int(getattr(text, "max_position_embeddings", None) or 128))
    filterbank = main == "input_features" and bool(getattr(config, "input_feat_per_channel", None))
    if main != "input_values" and not filterbank:
        tokens = int(seq or tokens)
    vocab = int(getattr(config, "vocab_size", 30522) or 30522)
    ids = torch.randint(0, vocab, (batch, tokens), device=device)
    kwargs: dict[str, Any] = {"input_ids": ids} if main == "input_ids" else {}
    meta: dict[str, Any] = {"batch": batch, "seq": tokens, "vocab": vocab}
    if main == "pixel_values" or ("pixel_values" in params and hasattr(config, "vision_config")):  # + CLIP-likes
        vision = getattr(config, "vision_config", None) or config
        meta["image"] = int(image or getattr(vision, "image_size", 224) or 224)
        channels = int(getattr(vision, "num_channels", 3) or 3)
        kwargs["pixel_values"] = torch.randn(batch, channels, meta["image"], meta["image"], device=device)
    elif main == "input_features" and getattr(config, "num_mel_bins", None) and getattr(
            config, "max_source_positions", None):  # Whisper-likes: log-mel frames of a 30 s window
        frames = 2 * int(config.max_source_positions)
        kwargs["input_features"] = torch.randn(batch, int(config.num_mel_bins), frames, device=device)
    elif filterbank:
        # Speech2Text-likes: filterbank frames, [B, frames, features x channels]; --seq frames (10 ms each)
        meta["frames"] = int(seq or FEATURE_FRAMES)
        width = int(config.input_feat_per_channel) * int(getattr(config, "input_channels", 1) or 1)
        kwargs["input_features"] = torch.randn(batch, meta["frames"], width, device=device)
    elif main == "input_values":  # wav2vec2-likes: raw audio
        meta["samples"] = int(seq or AUDIO_SAMPLES)
        kwargs["input_values"] = torch.randn(batch, meta["samples"], device=device)
    elif main != "input_ids":
        raise GraphError(f"{spec.arch} takes {main!r}, for which dprobe makes no example input; give a "
                         "module:pkg.mod:factory whose model has an example_inputs(batch) method")
    loss = "mean"
    if labels and spec.arch.endswith(LM_SUFFIXES):
        kwargs["labels"] = ids
        loss = "output"
    elif labels and spec.arch.endswith(CLS_SUFFIXES):
        kwargs["labels"] = torch.randint(0, int(getattr(config, "num_labels", 2)), (batch,), device=device)
        loss = "output"
    elif labels and "return_loss" in params:  # contrastive (CLIP)
        kwargs["return_loss"] = True
        loss = "output"
    elif getattr(config, "is_encoder_decoder", False):
        kwargs["decoder_input_ids"] = ids
    return ExampleInputs((), kwargs, loss, meta)


def _video_clip(name: str) -> tuple[int, int]:
    """Frames and side of a torchvision video model's training clip: its weights' crop and at least 16
    frames (the Kinetics recipes' clip length, or the model's minimum where that is longer)."""
    import torchvision

    weights = torchvision.models.get_model_weights(name).DEFAULT
    frames = max(16, int(weights.meta.get("min_temporal_size") or 0))
    return frames, int(weights.transforms().crop_size[0])
