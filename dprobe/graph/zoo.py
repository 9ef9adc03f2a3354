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

from dprobe.graph.schema import GraphError

T = TypeVar("T")
LM_SUFFIXES = ("LMHeadModel", "ForCausalLM", "ForMaskedLM", "ForConditionalGeneration", "WithLMHead")
CLS_SUFFIXES = ("ForSequenceClassification", "ForImageClassification", "ForTokenClassification")


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


def _torchvision(name: str) -> nn.Module:
    import torchvision

    if name not in torchvision.models.list_models():
        raise GraphError(f"unknown torchvision model {name!r} (see torchvision.models.list_models())")
    # auxiliary heads change the training output; rebuild without them, skipping slow weight init
    for extra in ({"aux_logits": False, "init_weights": False}, {"init_weights": False}, {"aux_logits": False}):
        try:
            return torchvision.models.get_model(name, weights=None, **extra)
        except TypeError:
            continue
    return torchvision.models.get_model(name, weights=None)


def _timm(name: str) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise GraphError(f"unknown timm model {name!r} (see timm.list_models())")
    return timm.create_model(name, pretrained=False)


def _transformers(spec: ModelSpec) -> nn.Module:
    import transformers

    config_cls = getattr(transformers, spec.config, None)
    if config_cls is None or not isinstance(config_cls, type):
        raise GraphError(f"transformers has no config class {spec.config!r}")
    arch_cls = getattr(transformers, spec.arch, None)
    if arch_cls is None or not isinstance(arch_cls, type):
        raise GraphError(f"transformers has no model class {spec.arch!r}")
    known = set(config_cls().to_dict()) | set(inspect.signature(config_cls.__init__).parameters)
    unknown = sorted(k for k in spec.config_kwargs if k not in known)
    if unknown:
        raise GraphError(f"config kwargs not accepted by {spec.config}: {', '.join(unknown)}")
    try:
        config = config_cls(**spec.config_kwargs)
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


@contextlib.contextmanager
def transformers_masks_from_shapes() -> Iterator[None]:
    """Tell ``transformers`` it is being traced, so that it builds attention masks from shapes alone.

    Untraced, some models (BART) read a mask's values to decide whether it can be skipped, which
    meta tensors cannot answer; traced (as under torch.compile), they build it, as they do for a
    padded batch. Used only as a retry for models that fail otherwise, so that no model that traces
    today changes.
    """
    try:
        import transformers.masking_utils as masking
    except ImportError:
        yield
        return
    original = getattr(masking, "is_tracing", None)
    if original is None:
        yield
        return
    masking.is_tracing = lambda tensor=None: True
    try:
        yield
    finally:
        masking.is_tracing = original


def with_masks_from_shapes_if_needed(spec: ModelSpec, attempt: Callable[[], T]) -> tuple[T, bool]:
    """``attempt()``; for a ``transformers`` model that failed by reading a value on meta, ``attempt()``
    again under :func:`transformers_masks_from_shapes`. Returns the result and whether it was retried."""
    try:
        return attempt(), False
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the one failure a retry fixes
        if spec.lib != "transformers" or META_VALUE_ERROR not in str(exc):
            raise
    with transformers_masks_from_shapes():
        return attempt(), True


def default_image_size(model: nn.Module) -> int:
    """The input size a vision model is built for: timm's ``pretrained_cfg["input_size"]``,
    torchvision's ``image_size`` (ViT), else 224."""
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if isinstance(size, (tuple, list)) and len(size) == 3 and int(size[1]) > 0:
        return int(size[1])
    size = getattr(model, "image_size", None)
    return int(size) if isinstance(size, int) and size > 0 else 224


def example_inputs(spec: ModelSpec, model: nn.Module, batch: int, image: int | None = None,
                   seq: int | None = None, labels: bool = False, device: str = "meta") -> ExampleInputs:
    """Random inputs of the right shape (images ``3 x image x image``; token ids of length ``seq``)."""
    if spec.lib == "transformers":
        config = model.config
        seq = int(seq or 128)
        vocab = int(getattr(config, "vocab_size", 30522) or 30522)
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        kwargs: dict[str, Any] = {"input_ids": ids}
        loss = "mean"
        if labels and spec.arch.endswith(LM_SUFFIXES):
            kwargs["labels"] = ids
            loss = "output"
        elif labels and spec.arch.endswith(CLS_SUFFIXES):
            kwargs["labels"] = torch.randint(0, int(getattr(config, "num_labels", 2)), (batch,), device=device)
            loss = "output"
        elif getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
        return ExampleInputs((), kwargs, loss, {"batch": batch, "seq": seq, "vocab": vocab})
    factory_inputs = getattr(model, "example_inputs", None)
    if callable(factory_inputs):
        args = factory_inputs(batch)
        args = args if isinstance(args, tuple) else (args,)
        return ExampleInputs(tuple(a.to(device) for a in args), {}, "mean", {"batch": batch})
    image = int(image or default_image_size(model))
    x = torch.randn(batch, 3, image, image, device=device)
    return ExampleInputs((x,), {}, "ce", {"batch": batch, "image": image})
