"""Meta-device op calls answered from memory: the same tensors as running the op, only where it is safe."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dprobe.graph import meta_calls, recorder
from dprobe.graph.meta_calls import RememberingMode, call_on_meta
from dprobe.profiling.coldstart import memtrack


def _layout(value):
    """What anyone can see of an op's outputs: shapes, strides, dtypes, storage sizes and offsets."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device.type,
                value.untyped_storage().nbytes(), value.storage_offset())
    if isinstance(value, (tuple, list)):
        return type(value).__name__, [_layout(v) for v in value]
    return value


@pytest.fixture(autouse=True)
def _fresh_memory():
    meta_calls.forget()
    yield
    meta_calls.forget()


def _meta(*shape, **kwargs) -> torch.Tensor:
    return torch.empty(*shape, device="meta", **kwargs)


CALLS = [
    ("broadcast add", torch.ops.aten.add.Tensor, lambda: (_meta(8, 1, 5), _meta(4, 5)), {}),
    ("channels-last input", torch.ops.aten.mul.Tensor,
     lambda: (_meta(2, 3, 4, 4).to(memory_format=torch.channels_last), 2.0), {}),
    ("transposed input", torch.ops.aten.relu.default, lambda: (_meta(6, 4).t(),), {}),
    ("dtype promotion", torch.ops.aten.add.Tensor, lambda: (_meta(3, dtype=torch.bfloat16), _meta(3)), {}),
    ("several outputs, a parameter", torch.ops.aten.native_batch_norm.default,
     lambda: (_meta(2, 3, 4, 4), nn.Parameter(_meta(3)), nn.Parameter(_meta(3)), _meta(3), _meta(3),
              True, 0.1, 1e-5), {}),
    ("convolution", torch.ops.aten.convolution.default,
     lambda: (_meta(2, 3, 8, 8), _meta(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}),
    ("keyword arguments", torch.ops.aten.sum.dim_IntList, lambda: (_meta(3, 4, 5), [1]), {"keepdim": True}),
]


@pytest.mark.parametrize(("name", "op", "make", "kwargs"), CALLS, ids=[c[0] for c in CALLS])
def test_a_remembered_call_gives_what_the_op_gives(name, op, make, kwargs) -> None:
    expected = _layout(op(*make(), **kwargs))
    with meta_calls.remembering():
        first = call_on_meta(op, make(), kwargs)
        again = call_on_meta(op, make(), kwargs)
    assert meta_calls.stats() == {"hits": 1, "misses": 1}  # the second call came from memory
    assert _layout(first) == _layout(again) == expected
    outs = again if isinstance(again, tuple) else (again,)
    assert len({id(t.untyped_storage()) for t in outs}) == len(outs)  # each output a storage of its own


@meta_calls.remembering()
def test_a_different_layout_or_value_is_a_different_call() -> None:
    add = torch.ops.aten.add.Tensor
    call_on_meta(add, (_meta(4, 6), _meta(4, 6)), {})
    transposed = call_on_meta(add, (_meta(6, 4).t(), _meta(6, 4).t()), {})
    assert transposed.stride() == add(_meta(6, 4).t(), _meta(6, 4).t()).stride() == (1, 4)
    total = torch.ops.aten.sum.dim_IntList
    assert call_on_meta(total, (_meta(3, 4), [1]), {"keepdim": True}).shape == (3, 1)
    assert call_on_meta(total, (_meta(3, 4), [1]), {"keepdim": False}).shape == (3,)
    assert meta_calls.stats() == {"hits": 0, "misses": 4}


@meta_calls.remembering()
def test_views_in_place_ops_and_real_tensors_are_always_run() -> None:
    x = _meta(4, 4)
    for _ in range(2):
        assert call_on_meta(torch.ops.aten.add_.Tensor, (x, x), {}) is x  # in place: the input itself
        view = call_on_meta(torch.ops.aten.t.default, (x,), {})
        assert view.untyped_storage()._cdata == x.untyped_storage()._cdata
    cpu = torch.arange(3.0)
    assert call_on_meta(torch.ops.aten.mul.Tensor, (cpu, cpu), {}).tolist() == [0.0, 1.0, 4.0]
    assert call_on_meta(torch.ops.aten.mul.Tensor, (cpu + 1, cpu), {}).tolist() == [0.0, 2.0, 6.0]
    assert meta_calls.stats()["hits"] == 0


def test_an_output_that_is_not_a_fresh_storage_is_not_remembered() -> None:
    x = _meta(4, 4)
    assert meta_calls._template(x, [x]) is None  # an input handed back
    assert meta_calls._template(_meta(8)[2:], []) is None  # a view into a larger storage
    assert meta_calls._template((_meta(2), 3, None), []) is not None


def test_calls_are_remembered_only_inside_a_scope_and_forgotten_after_it() -> None:
    relu = torch.ops.aten.relu.default
    for _ in range(2):
        call_on_meta(relu, (_meta(5),), {})
    assert not meta_calls._seen and meta_calls.stats() == {"hits": 0, "misses": 0}
    with meta_calls.remembering():
        call_on_meta(relu, (_meta(5),), {})
        with meta_calls.remembering():  # nested: the outer scope keeps the memory
            call_on_meta(relu, (_meta(5),), {})
        call_on_meta(relu, (_meta(5),), {})
        assert meta_calls._seen
    assert not meta_calls._seen and meta_calls.stats() == {"hits": 2, "misses": 1}


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class _Remembering(RememberingMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return call_on_meta(func, args, kwargs or {})


def test_a_mode_below_sees_every_call_and_the_memory_ends_with_the_mode() -> None:
    x = _meta(4, 4)
    with _Remembering():
        for _ in range(3):
            torch.exp(x)
        assert meta_calls.stats()["hits"] == 2
    assert not meta_calls._seen  # forgotten with the mode
    below = _Counting()
    with below, _Remembering():
        for _ in range(3):
            torch.exp(x)
    assert below.calls == 3 and meta_calls.stats()["hits"] == 2


@pytest.mark.slow
def test_the_replay_is_the_same_with_and_without_memory(monkeypatch) -> None:
    """Every figure of a replay (bytes, kernels, flops, the allocator's trace) is unchanged, and most of
    its meta calls come from memory: the two training steps repeat each other."""
    from dprobe.graph.zoo import parse_spec
    from dprobe.profiling.coldstart.replay import replay_training_step

    spec = parse_spec("torchvision:resnet18")
    remembered = replay_training_step(spec, 2, "bf16", "adamw", image=32).to_dict()
    stats = meta_calls.stats()
    assert stats["hits"] > stats["misses"] > 0
    monkeypatch.setattr(memtrack, "call_on_meta", lambda func, args, kwargs: func(*args, **kwargs))
    assert replay_training_step(spec, 2, "bf16", "adamw", image=32).to_dict() == remembered


def test_the_traced_graph_is_the_same_with_and_without_memory(monkeypatch) -> None:
    from dprobe.graph.build import build_model_graph

    meta_calls.forget()
    remembered = build_model_graph("torchvision:resnet18", batch=2, image=32).to_dict()
    assert meta_calls.stats()["hits"] > 0
    monkeypatch.setattr(recorder, "call_on_meta", lambda func, args, kwargs: func(*args, **kwargs))
    assert build_model_graph("torchvision:resnet18", batch=2, image=32).to_dict() == remembered
