"""Aten ops on meta tensors, their outputs remembered by the inputs' metadata.

On the meta device torch works out most ops' outputs in Python (its reference implementations), a
few tenths of a millisecond an op. A replay or trace runs the same op on the same shapes many times:
two training steps, a model's repeated blocks, one model at several batch sizes, precisions and
optimizers. :func:`call_on_meta` runs an op once per distinct call and makes the outputs of later
calls from what it saw (``torch.empty_strided``, microseconds), which are the same tensors to
anyone who looks at their metadata: shapes, strides, dtypes and storage sizes.

Only calls that cannot tell the difference are remembered: functional ops (no view, no mutation;
and the optimizers' in-place ``_foreach_`` ops, which return nothing) on meta tensors alone, whose
outputs are fresh tensors of their own, each on a storage of exactly its extent, and whose other
arguments are plain values (numbers, dtypes, devices, ...), made with no other dispatch mode below
the caller's (it would not see a call answered from memory). Calls are remembered only while a
:class:`RememberingMode` (the replay's and the tracer's dispatch modes) or :func:`remembering` is entered, and forgotten when the outermost one ends: a process that profiles a
job now and then (the sidecar) keeps nothing between jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

MAX_ENTRIES = 20_000  # distinct calls kept (about 3 kB each); forgotten all at once beyond it
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_seen: dict[tuple, tuple[list, Any] | None] = {}  # call key -> _template of its output; None: not to be remembered
_stats = {"hits": 0, "misses": 0}
_depth = 0  # scopes entered (remembering): calls are remembered while it is above 0
_kinds: dict[Any, bool] = {}  # op -> whether its calls may be remembered (_rememberable)
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # no subclass that could act on the call itself
_EMPTY = torch.ops.aten.empty_strided.default  # an aten call: no torch-function mode sees it


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The call's identity as far as a meta kernel can see it; None when it cannot be remembered."""
    parts: list[Any] = [func]
    return tuple(parts) if _describe(args, parts) and _describe(kwargs, parts) else None


def _describe(value: Any, parts: list[Any]) -> bool:
    """Append what a meta kernel can see of ``value`` to ``parts``; False if it is not plainly data."""
    kind = type(value)
    if kind in _TENSORS:
        if value.device.type != "meta" or value.layout != torch.strided:
            return False
        parts.append((value.dtype, tuple(value.shape), value.stride(), value.storage_offset()))
        return True
    if kind in (tuple, list):
        parts.append((kind, len(value)))
        return all(_describe(v, parts) for v in value)
    if kind is dict:
        parts.append((dict, tuple(value)))
        return all(_describe(v, parts) for v in value.values())
    if isinstance(value, _PLAIN):
        parts.append((kind, value))
        return True
    return False  # tensor subclasses, symbolic sizes, generators, ...


def _extent(t: torch.Tensor) -> int:
    """Bytes ``torch.empty_strided`` gives a tensor of ``t``'s size and strides."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()


def _template(out: Any, inputs: list[Any]) -> tuple[list, Any] | None:
    """What is needed to make ``out`` again: its leaves, each ``(True, (dtype, shape, stride))`` for a tensor
    or ``(False, value)``, and its structure; None when its outputs are not all fresh meta tensors."""
    leaves, spec = tree_flatten(out)
    storages: set[int] = {id(t.untyped_storage()) for t in inputs if type(t) in _TENSORS}
    made: list[Any] = []
    for x in leaves:
        if type(x) is torch.Tensor:
            storage = x.untyped_storage()
            if (x.device.type != "meta" or x.layout != torch.strided or x.storage_offset() != 0
                    or id(storage) in storages or storage.nbytes() != _extent(x) or x.is_conj() or x.is_neg()):
                return None
            storages.add(id(storage))
            made.append((True, (x.dtype, tuple(x.shape), x.stride())))
        elif x is None or type(x) in (bool, int, float):
            made.append((False, x))
        else:
            return None
    return made, spec


def _rememberable(func: Any) -> bool:
    """Whether calls of ``func`` may be answered from memory: no views, no mutation, except the in-place
    ``_foreach_`` ops that return nothing (an optimizer's step; on meta tensors they only check their
    arguments)."""
    known = _kinds.get(func)
    if known is None:
        schema = func._schema
        known = _kinds[func] = not func.is_view and (
            not schema.is_mutable or (not schema.returns and func._overloadpacket.__name__.startswith("_foreach_")))
    return known


def call_on_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``, from memory when the same call was seen before (see the module's docstring)."""
    # a dispatch mode below the caller's would not see a call answered from memory
    key = (_key(func, args, kwargs) if _depth and _rememberable(func) and not torch._C._len_torch_dispatch_stack()
           else None)
    if key is None:
        return func(*args, **kwargs)
    known = _seen.get(key, False)
    if known is None:
        return func(*args, **kwargs)
    if isinstance(known, tuple):  # seen before (False: not yet)
        _stats["hits"] += 1
        made, spec = known
        return tree_unflatten([_EMPTY(v[1], v[2], dtype=v[0], device="meta") if tensor else v
                               for tensor, v in made], spec)
    _stats["misses"] += 1
    out = func(*args, **kwargs)
    if len(_seen) >= MAX_ENTRIES:
        _seen.clear()
    _seen[key] = _template(out, tree_flatten((args, kwargs))[0])
    return out


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Remember calls inside; forget them when the outermost scope ends."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth:
            _seen.clear()


class RememberingMode(TorchDispatchMode):
    """A dispatch mode that remembers meta calls (:func:`call_on_meta`) while it is entered."""

    def __enter__(self) -> RememberingMode:
        self._scope = remembering()
        self._scope.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._scope.__exit__(None, None, None)


def stats() -> dict[str, int]:
    """Calls answered from memory (``hits``) and run (``misses``) in this process so far."""
    return dict(_stats)


def forget() -> None:
    """Drop every remembered call and zero the counts of :func:`stats`."""
    _seen.clear()
    _stats.update(hits=0, misses=0)
