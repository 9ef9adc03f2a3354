"""Aten ops on meta tensors, their outputs remembered by the inputs' metadata.

On the meta device torch works out most ops' outputs in Python (its reference implementations), a
few tenths of a millisecond an op. A replay or trace runs the same op on the same shapes many times:
two training steps, a model's repeated blocks, one model at several batch sizes, precisions and
optimizers. :func:`call_on_meta` runs an op once per distinct call and makes the outputs of later
calls from what it saw (``torch.empty_strided``, microseconds), which are the same tensors to
anyone who looks at their metadata: shapes, strides, dtypes and storage sizes.

Only calls that cannot tell the difference are remembered: functional ops (no view, no mutation;
and the optimizers' in-place ``_foreach_`` ops, which return nothing) on meta tensors alone, whose outputs are fresh tensors of their own, each on a storage of exactly
its extent, and whose other arguments are plain values (numbers, dtypes, devices, ...).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

MAX_ENTRIES = 200_000  # distinct calls kept (a few hundred bytes each); forgotten all at once beyond it
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_seen: dict[tuple, tuple[list, Any] | None] = {}  # call key -> (output leaves, spec); None: not to be remembered
_stats = {"hits": 0, "misses": 0}
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
    """What is needed to make ``out`` again, or None when its outputs are not all fresh meta tensors."""
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
            made.append((x.dtype, tuple(x.shape), x.stride()))
        elif x is None or type(x) in (bool, int, float):
            made.append(("value", x))
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
    key = _key(func, args, kwargs) if _rememberable(func) else None
    if key is None:
        return func(*args, **kwargs)
    known = _seen.get(key, False)
    if known is None:
        return func(*args, **kwargs)
    if known is not False:
        _stats["hits"] += 1
        made, spec = known
        return tree_unflatten([_EMPTY(m[1], m[2], dtype=m[0], device="meta") if m[0] != "value"
                               else m[1] for m in made], spec)
    _stats["misses"] += 1
    out = func(*args, **kwargs)
    if len(_seen) >= MAX_ENTRIES:
        _seen.clear()
    _seen[key] = _template(out, tree_flatten((args, kwargs))[0])
    return out


def stats() -> dict[str, int]:
    """Calls answered from memory (``hits``) and run (``misses``) in this process so far."""
    return dict(_stats)


def forget() -> None:
    """Drop every remembered call and zero the counts of :func:`stats`."""
    _seen.clear()
    _stats.update(hits=0, misses=0)
