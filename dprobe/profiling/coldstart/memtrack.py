"""Live-byte tracking of tensor storages under a dispatch mode, with per-op counts for a roofline."""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dprobe.graph.meta_calls import RememberingMode, call_on_meta
from dprobe.graph.ops import normalise_op
from dprobe.graph.recorder import op_flops, tensors_of

ALIGN = 512
_META_KINDS = {"reshape", "constant"}
FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2
# kernel classes of the per-op roofline (features.roofline_seconds: peak by class, GPU time shares)
OP_CLASSES = ("elementwise", "norm", "matmul", "conv", "conv_grouped", "optimizer")
TENSOR_CORE_CLASSES = (OP_CLASSES.index("matmul"), OP_CLASSES.index("conv"), OP_CLASSES.index("conv_grouped"))
NORM_KINDS = {"batchnorm", "layernorm", "norm", "softmax", "reduce", "loss"}


class ReplayOp(NamedTuple):
    """One kernel of a replayed training step, as the per-kernel roofline reads it (a list of five numbers
    in the replay cache's JSON)."""

    phase: float  # FORWARD, BACKWARD or OPTIMIZER
    op_class: float  # index into OP_CLASSES
    low_precision: float  # 1: a bf16 / fp16 kernel, 0: fp32
    flops: float
    bytes_moved: float


def op_class(kind: str, grouped: bool = False) -> int:
    """The ``OP_CLASSES`` index of a forward or backward kernel of an op of ``kind`` (``grouped``: a grouped
    or depthwise convolution)."""
    if kind in ("conv", "conv_transpose"):
        return OP_CLASSES.index("conv_grouped" if grouped else "conv")
    if kind in ("linear", "matmul", "attention"):
        return OP_CLASSES.index("matmul")
    return OP_CLASSES.index("norm" if kind in NORM_KINDS else "elementwise")


def _conv_groups(func: Any, args: tuple) -> int:
    index = 9 if func._overloadpacket is torch.ops.aten.convolution_backward else 8
    return int(args[index]) if len(args) > index and isinstance(args[index], int) else 1


def conv_workspace_bytes(func: Any, args: tuple) -> int:
    """Bytes of the cuDNN workspace a convolution kernel holds while it runs, by an empirical rule.

    A dense (ungrouped) convolution with a spatial kernel larger than 1x1 takes a workspace the size of
    its input in the forward and of its output gradient plus input in the backward (the operands in
    the layout its algorithm wants). Depthwise / grouped and 1x1 convolutions take none. On
    h200-profiles' CNN runs this brings the caching-allocator replay's reserved bytes from 5.8 % to
    3.6 % MAPE (fp32) and from 8.8 % to 5.5 % (bf16); the size rule was chosen on those runs.
    """
    backward = func._overloadpacket is torch.ops.aten.convolution_backward
    if not backward and func._overloadpacket is not torch.ops.aten.convolution:
        return 0
    weight = args[2] if backward else args[1]
    if _conv_groups(func, args) != 1 or not isinstance(weight, torch.Tensor) or max(weight.shape[2:], default=1) <= 1:
        return 0
    operands = args[:2] if backward else args[:1]
    return int(sum(t.numel() * t.element_size() for t in operands if isinstance(t, torch.Tensor)))


def conv_output_format(func: Any, args: tuple, out: Any) -> Any:
    """A convolution's output in the memory format CUDA gives it: channels-last where its input or weight is
    (cuDNN's ``cudnn_conv_suggest_memory_format``). PyTorch's meta kernel leaves every output contiguous,
    which would make a channels-last model's replay channels-first after its first convolution."""
    if func._overloadpacket is not torch.ops.aten.convolution or not isinstance(out, torch.Tensor) or out.dim() != 4:
        return out
    operands = [a for a in args[:2] if isinstance(a, torch.Tensor) and a.dim() == 4]
    if not any(a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous() for a in operands):
        return out
    n, c, h, w = out.shape
    return torch.empty_strided(out.shape, (h * w * c, 1, w * c, c), dtype=out.dtype, device=out.device)


def round_alloc(nbytes: int) -> int:
    """CUDA caching allocator request rounding (multiples of 512 bytes)."""
    return max(ALIGN, (int(nbytes) + ALIGN - 1) // ALIGN * ALIGN) if nbytes > 0 else 0


def conv_backward_flops(args: tuple) -> float:
    """Grouped-conv-correct FLOPs of ``convolution_backward``: input and weight gradients each cost a forward."""
    grad_out, _, weight = args[:3]
    mask = args[-1] if isinstance(args[-1], (list, tuple)) else [True, True, True]
    fwd = 2.0 * grad_out.numel() * weight[0].numel() if weight.dim() > 1 else 0.0
    return fwd * (int(bool(mask[0])) + int(bool(mask[1])))


class MemoryTracker(RememberingMode):
    """Tracks live (rounded) bytes of storages created by ops; frees when a storage dies."""

    def __init__(self) -> None:
        super().__init__()
        self.live: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current = 0
        self.peak = 0
        self.sizes: list[int] = []
        self.events: list[tuple[str, int, int]] = []  # the alloc / free trace, for the allocator model
        self.phase = FORWARD  # set by the caller: FORWARD, BACKWARD or OPTIMIZER
        self.ops: list[ReplayOp] = []  # per kernel

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage in self.live:
            return
        size, key = self._alloc(storage.nbytes())
        self.live[storage] = size
        self.sizes.append(size)
        weakref.finalize(storage, self._free, size, key)

    def _alloc(self, nbytes: int) -> tuple[int, int]:
        """Allocate ``nbytes`` in the trace (a tensor's storage, or a kernel's scratch workspace); the
        handle ``(rounded size, key)`` frees it with ``_free(*handle)``."""
        size, key = round_alloc(nbytes), len(self.events)
        self.current += size
        self.peak = max(self.peak, self.current)
        self.events.append(("alloc", key, int(nbytes)))
        return size, key

    def _free(self, size: int, key: int) -> None:
        self.current -= size
        self.events.append(("free", key, 0))

    def reset_peak(self) -> None:
        """Start measuring a new step: peak from the live bytes now, no kernels yet."""
        self.peak = self.current
        self.sizes = []
        self.ops = []

    @property
    def kernels(self) -> int:
        return len(self.ops)

    @property
    def flops(self) -> float:
        return float(sum(op.flops for op in self.ops))

    @property
    def matmul_flops(self) -> float:
        """FLOPs of matmuls and convolutions (the tensor-core classes)."""
        return float(sum(op.flops for op in self.ops if op.op_class in TENSOR_CORE_CLASSES))

    @property
    def bytes_moved(self) -> float:
        return float(sum(op.bytes_moved for op in self.ops))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        workspace = conv_workspace_bytes(func, args)
        scratch = self._alloc(workspace) if workspace else None
        out = conv_output_format(func, args, call_on_meta(func, args, kwargs))
        outs = tensors_of(out)
        for t in outs:
            self.track(t)
        if scratch is not None:
            self._free(*scratch)
        if getattr(func, "is_view", False):
            return out
        kind = normalise_op(str(func.name()))
        if kind in _META_KINDS and func._overloadpacket not in (torch.ops.aten.clone, torch.ops.aten.copy_):
            return out
        if func._overloadpacket is torch.ops.aten.convolution_backward:
            f = conv_backward_flops(args)
        else:
            f = op_flops(func, kind, args, kwargs, out)
        conv = kind == "conv" or func._overloadpacket is torch.ops.aten.convolution_backward
        inputs = tensors_of((args, kwargs))
        if self.phase == OPTIMIZER:
            cls = OP_CLASSES.index("optimizer")
        else:
            cls = op_class("conv" if conv else kind, grouped=conv and _conv_groups(func, args) > 1)
        low = int(any(t.dtype in (torch.bfloat16, torch.float16) for t in inputs))
        moved = sum(t.numel() * t.element_size() for t in inputs) + sum(t.numel() * t.element_size() for t in outs)
        self.ops.append(ReplayOp(self.phase, cls, low, f, float(moved)))
        return out
