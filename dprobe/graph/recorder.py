"""Dispatch-level op recording: aten ops with shapes, dtypes, FLOPs, parameters and saved bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from dprobe.graph.meta_calls import RememberingMode, call_on_meta
from dprobe.graph.ops import normalise_op

_NO_FLOP_KINDS = {"reshape", "constant", "cast", "input", "output", "dropout", "split", "concat"}


@dataclass
class OpEvent:
    """One recorded aten op (view ops are folded into their producer and not recorded)."""

    op: str
    kind: str
    scope: str
    inputs: list[int]
    shapes: list[list[int]]
    dtypes: list[str]
    params: int = 0
    param_bytes: int = 0
    flops: float = 0.0
    saved_bytes: int = 0
    group: Any = None
    extra: dict = field(default_factory=dict)


_LEAVES = (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``, in order: nested tuples, lists and dicts walked here (an op's arguments
    and outputs, many times a step), anything else by torch's pytree (e.g. a model's output class)."""
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):  # torch.return_types are tuples
        for v in value:
            _collect(v, found)
    elif type(value) is dict:
        for v in value.values():
            _collect(v, found)
    elif not (value is None or isinstance(value, _LEAVES)):
        found.extend(t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))


def op_flops(func: Any, kind: str, args: tuple, kwargs: dict, out: Any) -> float:
    """FLOPs of one aten op: torch's flop formulas for matmul/conv/attention, else one per output element."""
    fn = flop_registry.get(func._overloadpacket)
    if fn is not None:
        try:
            return float(fn(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - formula mismatch on exotic overloads: fall through
            pass
    if kind in _NO_FLOP_KINDS:
        return 0.0
    return float(sum(t.numel() for t in tensors_of(out)))


class OpRecorder(RememberingMode):
    """Records the aten ops run under it; data flow follows tensor identity.

    ``sources`` maps a tensor to the event index that produced it (``-1 - k`` for the k-th
    registered input). Parameters are attributed to the first op that reads them. Tensors saved
    for backward (through ``saved_tensors_hooks``) are attributed to the op that ran last.
    """

    def __init__(self, params: dict[str, torch.Tensor] | None = None, scope_fn: Any = None) -> None:
        super().__init__()
        self.events: list[OpEvent] = []
        self.sources: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.param_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.used_params: set[str] = set()
        self.saved_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.param_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.group: Any = None
        self.scope_fn = scope_fn
        for name, p in (params or {}).items():
            self.param_of[p] = name
            self.param_storages[p.untyped_storage()] = True

    def register_input(self, tensor: torch.Tensor, index: int) -> None:
        self.sources[tensor] = -1 - index

    def _source(self, t: torch.Tensor) -> int | None:
        return self.sources.get(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = call_on_meta(func, args, kwargs)
        if func._overloadpacket in (torch.ops.prim.device,):
            return out
        ins = tensors_of((args, kwargs))
        outs = tensors_of(out)
        srcs: list[int] = []
        param_names: list[str] = []
        for t in ins:
            name = self.param_of.get(t)
            if name is not None:
                param_names.append(name)
                continue
            s = self._source(t)
            if s is not None and s not in srcs:
                srcs.append(s)
        if getattr(func, "is_view", False) or func._overloadpacket in (torch.ops.aten.detach, torch.ops.aten.alias):
            for o in outs:  # fold views into their producer
                if param_names:
                    self.param_of[o] = param_names[0]
                elif srcs:
                    self.sources[o] = srcs[0]
            return out
        name = str(func.name()).replace("::", ".")
        kind = normalise_op(name)
        event = OpEvent(op=name, kind=kind, scope=self.scope_fn() if self.scope_fn else "", inputs=srcs,
                        shapes=[list(o.shape) for o in outs], dtypes=[str(o.dtype).replace("torch.", "") for o in outs],
                        group=self.group)
        for pname in param_names:
            if pname not in self.used_params:
                self.used_params.add(pname)
                p = next(t for t in ins if self.param_of.get(t) == pname)
                event.params += p.numel()
                event.param_bytes += p.numel() * p.element_size()
        event.flops = op_flops(func, kind, args, kwargs, out)
        idx = len(self.events)
        self.events.append(event)
        for o in outs:
            self.sources[o] = idx
        return out

    def pack_hook(self, t: torch.Tensor) -> torch.Tensor:
        """For ``saved_tensors_hooks``: count each saved activation storage once."""
        if not self.events or not isinstance(t, torch.Tensor):
            return t
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return t
        if storage in self.param_storages or storage in self.saved_storages:
            return t
        self.saved_storages[storage] = True
        self.events[-1].saved_bytes += storage.nbytes()
        return t
