"""The software stack a cold-start prediction assumes: the PyTorch version, cuDNN autotuning
(``cudnn.benchmark``), the attention kernels and the memory format; named presets (the stacks the
training runs were measured on), the default per GPU, and the stack of a recorded run.

Plain data without torch, so that a sidecar installed without it still checks a job's stack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

ATTENTION = ("fused", "unfused")  # fused: scaled_dot_product_attention's kernels; unfused: matmuls and a softmax
MEMORY_FORMATS = ("nchw", "nhwc")
# what --memory-format also takes: PyTorch's names (torch.contiguous_format / torch.channels_last)
MEMORY_FORMAT_ALIASES = {"channels-first": "nchw", "channels-last": "nhwc"}
SETTINGS = ("torch", "cudnn_benchmark", "attention", "memory_format")  # what a stack fixes


@dataclass(frozen=True)
class SoftwareStack:
    """What a training job runs on besides the GPU. ``preset``: the named stack it starts from;
    ``overrides``: the settings given on top of it."""

    preset: str
    torch: str  # major.minor
    cudnn_benchmark: bool
    attention: str  # one of ATTENTION
    memory_format: str = "nchw"  # one of MEMORY_FORMATS (image models' activations)
    overrides: tuple[str, ...] = field(default=(), compare=False)

    def settings(self) -> dict[str, Any]:
        """The four settings, without the names."""
        return {k: getattr(self, k) for k in SETTINGS}

    def as_dict(self) -> dict[str, Any]:
        """The stack as ``dprobe predict --json`` prints it (``stack``)."""
        return {"preset": self.preset, **self.settings(), "overrides": list(self.overrides)}


# The stacks the shipped checkpoint learnt from. h200-profiles: collections 2-4 (208 of its 222 training
# runs; collection 1 had cudnn.benchmark on), PyTorch 2.11, scaled_dot_product_attention, NCHW.
# timm-2022: timm's own training benchmark on the RTX 3090 (datasets/timm-train-rtx3090/stack.json),
# PyTorch 1.12, which had no scaled_dot_product_attention, cudnn.benchmark on; NCHW is the table trained on.
STACKS = {
    "h200-profiles": SoftwareStack("h200-profiles", torch="2.11", cudnn_benchmark=False, attention="fused"),
    "timm-2022": SoftwareStack("timm-2022", torch="1.12", cudnn_benchmark=True, attention="unfused"),
    # timm's inference benchmarks (datasets/timm-infer-gpus): PyTorch 2.4 and 2.9, benchmark.py's
    # cudnn.benchmark on, scaled_dot_product_attention; what the inference step model learnt from
    "timm-infer": SoftwareStack("timm-infer", torch="2.4", cudnn_benchmark=True, attention="fused"),
}
INFERENCE_STACK = "timm-infer"  # the default of --mode inference on every GPU
GPU_STACKS = {"rtx3090": "timm-2022"}  # a GPU's training rows were measured on this stack
DEFAULT_STACK = "h200-profiles"  # any other GPU: today's PyTorch as h200-profiles ran it

StackChoice = SoftwareStack | str | Mapping[str, Any] | None


def default_stack(gpu: str, mode: str = "train") -> SoftwareStack:
    """The stack a prediction on ``gpu`` (a key of ``GPUS``, or a spec's name) assumes unless told: the one
    its training rows were measured on, else h200-profiles'; an inference step (``mode="inference"``):
    timm-infer's, what the inference step model learnt from, on every GPU."""
    if mode == "inference":
        return STACKS[INFERENCE_STACK]
    return STACKS[GPU_STACKS.get(gpu, DEFAULT_STACK)]


def torch_version(value: Any) -> str:
    """``major.minor`` of a PyTorch version ("2.11.0+cu130" -> "2.11", "2" -> "2.0"); a ValueError for
    anything else."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+)(?:[.+a-z]\S*)?)?\s*$", str(value))
    if not m:
        raise ValueError(f"torch version {value!r}: expected MAJOR.MINOR, e.g. 2.4 or 1.12")
    return f"{int(m.group(1))}.{int(m.group(2) or 0)}"


def has_sdpa(torch: str) -> bool:
    """Whether that PyTorch has ``scaled_dot_product_attention`` (2.0 on)."""
    return int(torch_version(torch).split(".")[0]) >= 2


def resolve_stack(gpu: str, choice: StackChoice = None, mode: str = "train") -> SoftwareStack:
    """The stack of a prediction on ``gpu``: ``choice`` a :class:`SoftwareStack` (taken as it is), a preset's
    name, or a mapping of settings (``preset``, ``torch``, ``cudnn_benchmark``, ``attention``,
    ``memory_format``; None or absent: the preset's) over the GPU's default (:func:`default_stack`) or the
    named preset. A ``torch`` without ``attention`` implies it (unfused before 2.0). A ValueError names an
    unknown preset or setting, and fused attention on a PyTorch before 2.0. ``mode``: the step's
    (:func:`default_stack`)."""
    if isinstance(choice, SoftwareStack):
        return check_stack(choice)
    given = {"preset": choice} if isinstance(choice, str) else dict(choice or {})
    unknown = sorted(set(given) - {"preset", *SETTINGS})
    if unknown:
        raise ValueError(f"unknown stack setting {unknown[0]!r} (preset, {', '.join(SETTINGS)})")
    name = given.pop("preset", None)
    if name is not None and name not in STACKS:
        raise ValueError(f"unknown stack {name!r} ({', '.join(STACKS)})")
    base = STACKS[name] if name is not None else default_stack(gpu, mode)
    given = {k: v for k, v in given.items() if v is not None}
    if "memory_format" in given:
        given["memory_format"] = MEMORY_FORMAT_ALIASES.get(given["memory_format"], given["memory_format"])
    if "torch" in given:
        given["torch"] = torch_version(given["torch"])
        given.setdefault("attention", "fused" if has_sdpa(given["torch"]) else "unfused")
    changed = tuple(k for k in SETTINGS if k in given and given[k] != getattr(base, k))
    return check_stack(replace(base, **given, overrides=changed))


def check_stack(stack: SoftwareStack) -> SoftwareStack:
    """``stack``, or a ValueError naming the setting that cannot be."""
    if stack.attention not in ATTENTION:
        raise ValueError(f"--attention {stack.attention!r}: one of {', '.join(ATTENTION)}")
    if stack.memory_format not in MEMORY_FORMATS:
        raise ValueError(f"--memory-format {stack.memory_format!r}: one of {', '.join(MEMORY_FORMATS)}")
    if not isinstance(stack.cudnn_benchmark, bool):
        raise ValueError(f"cudnn_benchmark must be true or false, not {stack.cudnn_benchmark!r}")
    torch_version(stack.torch)
    if stack.attention == "fused" and not has_sdpa(stack.torch):
        raise ValueError(f"--attention fused: PyTorch {stack.torch} has no scaled_dot_product_attention (2.0 on)")
    return stack


def stack_of_record(record: Mapping[str, Any]) -> SoftwareStack:
    """The stack a run was measured on, from what its data set records of it: ``torch`` or ``pytorch``,
    ``cudnn_benchmark``, ``memory_format`` (default nchw) and ``attention`` (default: fused from PyTorch 2.0
    on). ``preset``: the preset with the same settings, else ``recorded``."""
    version = record.get("torch") or record.get("pytorch")
    if version is None:
        raise ValueError("the record names no PyTorch version (torch or pytorch)")
    torch = torch_version(version)
    stack = SoftwareStack("recorded", torch=torch, cudnn_benchmark=bool(record.get("cudnn_benchmark", False)),
                          attention=str(record.get("attention") or ("fused" if has_sdpa(torch) else "unfused")),
                          memory_format=str(record.get("memory_format") or "nchw"))
    same = next((name for name, s in STACKS.items() if s.settings() == stack.settings()), None)
    return check_stack(replace(stack, preset=same) if same else stack)


def add_stack_args(parser: Any) -> None:
    """``dprobe predict``'s stack options (each default: the GPU's stack, :func:`default_stack`)."""
    import argparse

    parser.add_argument("--stack", choices=list(STACKS), default=None,
                        help="the software stack the job runs on: h200-profiles (PyTorch 2.11, cudnn.benchmark "
                        "off, fused attention, NCHW), timm-2022 (PyTorch 1.12, cudnn.benchmark on, unfused "
                        "attention, NCHW) or timm-infer (PyTorch 2.4, cudnn.benchmark on, fused attention, NCHW); "
                        "default: the stack the GPU's training runs were measured on (rtx3090: timm-2022; any "
                        "other GPU: h200-profiles), with --mode inference timm-infer. The options below change "
                        "one setting")
    parser.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.backends.cudnn.benchmark on (autotuned convolution kernels) or off")
    parser.add_argument("--attention", choices=ATTENTION, default=None,
                        help="fused: scaled_dot_product_attention's kernels (PyTorch 2.0 on); unfused: matmuls "
                        "and a softmax (timm's and transformers' eager path, and any PyTorch before 2.0)")
    parser.add_argument("--memory-format", choices=[*MEMORY_FORMAT_ALIASES, *MEMORY_FORMATS], default=None,
                        help="image models' memory format: channels-first (nchw, the default) or channels-last "
                        "(nhwc: model.to(memory_format=torch.channels_last) and channels-last images), replayed "
                        "so; --mode inference corrects the step time by timm's channels-last table, training "
                        "predicts its step time as channels-first, with a note")
    parser.add_argument("--torch", default=None, metavar="VERSION",
                        help="the job's PyTorch (e.g. 2.4, 1.12); before 2.0 attention is unfused")


def stack_choice(args: Any) -> dict[str, Any]:
    """The stack options ``dprobe predict`` was given (for :func:`resolve_stack`)."""
    return {"preset": getattr(args, "stack", None), **{k: getattr(args, k, None) for k in SETTINGS}}


__all__ = ["ATTENTION", "GPU_STACKS", "INFERENCE_STACK", "MEMORY_FORMATS", "STACKS", "SoftwareStack", "add_stack_args",
           "check_stack", "default_stack", "resolve_stack", "stack_choice", "stack_of_record"]
