"""Tracing an nn.Module into a ModelGraph: torch.fx with shape propagation, or dispatch-level recording."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.module_tracker import ModuleTracker

from dprobe.core.patch import replaced
from dprobe.graph.ops import normalise_op
from dprobe.graph.recorder import OpEvent, OpRecorder, tensors_of
from dprobe.graph.schema import GraphError, GraphNode, ModelGraph
from dprobe.graph.zoo import remedy

log = logging.getLogger(__name__)
SINGLE_VALUE_BATCHNORM = "more than 1 value per channel"  # PyTorch's words for batch norm over one value


def _shapes(value: Any) -> tuple[list[list[int]], list[str]]:
    ts = tensors_of(value)
    return [list(t.shape) for t in ts], [str(t.dtype).replace("torch.", "") for t in ts]


def _input_tensors(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    named = [(f"arg{i}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return named + [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]


def _fx_kind(node: torch.fx.Node, gm: torch.fx.GraphModule) -> tuple[str, str]:
    if node.op == "call_module":
        op = type(gm.get_submodule(str(node.target))).__name__
    elif node.op == "call_function":
        op = getattr(node.target, "__name__", str(node.target))
    elif node.op == "call_method":
        op = str(node.target)
    elif node.op == "get_attr":
        return "constant", "get_attr"
    else:
        op = node.op
    return normalise_op(op), op


def trace_fx(model: nn.Module, args: tuple, name: str = "") -> ModelGraph:
    """torch.fx symbolic trace, then shape propagation on the (meta) inputs with per-node costs."""
    gm = torch.fx.symbolic_trace(model)
    rec = OpRecorder(dict(model.named_parameters()))
    values: dict[torch.fx.Node, int] = {}
    nodes: list[GraphNode] = []
    edges: list[tuple[int, int]] = []

    class _Prop(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            start = len(rec.events)
            result = super().run_node(n)
            if n.op == "output":
                kind, op = "output", "output"
            elif n.op == "placeholder":
                kind, op = "input", "input"
            else:
                kind, op = _fx_kind(n, gm)
            evs: list[OpEvent] = rec.events[start:]
            shapes, dtypes = _shapes(result)
            node = GraphNode(id=len(nodes), name=n.name, kind=kind, op=op, shapes=shapes, dtypes=dtypes,
                             params=sum(e.params for e in evs), param_bytes=sum(e.param_bytes for e in evs),
                             flops=sum(e.flops for e in evs))
            for e in evs:
                e.group = node.id
            values[n] = node.id
            for src in n.all_input_nodes:
                if src in values:
                    edges.append((values[src], node.id))
            nodes.append(node)
            return result

    with rec, torch.autograd.graph.saved_tensors_hooks(rec.pack_hook, lambda t: t):
        _Prop(gm).run(*args)
    for e in rec.events:  # saved bytes were attributed to events; roll them up into fx nodes
        if e.group is not None:
            nodes[e.group].saved_bytes += e.saved_bytes
    return ModelGraph(name=name, source="fx", nodes=nodes, edges=edges)


def trace_dispatch(model: nn.Module, args: tuple, kwargs: dict, name: str = "") -> ModelGraph:
    """Record every aten op of one forward (views folded away); data flow follows tensor identity."""
    tracker = ModuleTracker()

    def scope() -> str:
        parents = [p for p in tracker.parents if p != "Global"]
        return max(parents, key=len) if parents else ""

    rec = OpRecorder(dict(model.named_parameters()), scope_fn=scope)
    inputs = _input_tensors(args, kwargs)
    for i, (_, t) in enumerate(inputs):
        rec.register_input(t, i)
    with tracker, rec, torch.autograd.graph.saved_tensors_hooks(rec.pack_hook, lambda t: t):
        out = model(*args, **kwargs)
    nodes = [GraphNode(id=i, name=n, kind="input", op="input", shapes=[list(t.shape)],
                       dtypes=[str(t.dtype).replace("torch.", "")]) for i, (n, t) in enumerate(inputs)]
    offset = len(nodes)
    edges: list[tuple[int, int]] = []

    def ref(src: int) -> int:
        return -1 - src if src < 0 else src + offset

    for i, e in enumerate(rec.events):
        label = f"{e.scope}:{e.op}" if e.scope else e.op
        nodes.append(GraphNode(id=i + offset, name=label, kind=e.kind, op=e.op, shapes=e.shapes, dtypes=e.dtypes,
                               params=e.params, param_bytes=e.param_bytes, flops=e.flops, saved_bytes=e.saved_bytes))
        edges.extend((ref(s), i + offset) for s in e.inputs)
    out_id = len(nodes)
    outs = tensors_of(out if not hasattr(out, "to_tuple") else out.to_tuple())
    shapes, dtypes = _shapes(outs)
    nodes.append(GraphNode(id=out_id, name="output", kind="output", op="output", shapes=shapes, dtypes=dtypes))
    for t in outs:
        s = rec.sources.get(t)
        if s is not None:
            edges.append((ref(s), out_id))
    return ModelGraph(name=name, source="dispatch", nodes=nodes, edges=sorted(set(edges)))


def trace_module(model: nn.Module, args: tuple = (), kwargs: dict | None = None, name: str = "",
                 tracer: str = "auto") -> ModelGraph:
    """Trace ``model`` on example inputs (meta tensors recommended): ``fx``, ``dispatch`` or ``auto``.

    ``auto`` tries torch.fx first (module-level nodes) and falls back to dispatch-level recording.
    """
    kwargs, name = kwargs or {}, name or type(model).__name__
    try:
        return _trace(model, args, kwargs, name, tracer)
    except GraphError as exc:
        if SINGLE_VALUE_BATCHNORM not in str(exc):
            raise
    with _single_sample_batchnorm(model):  # e.g. batch 1 with batch norm after global pooling
        graph = _trace(model, args, kwargs, name, tracer)
    graph.meta["note"] = "batch norm saw one value per channel: training at this batch size fails in PyTorch"
    return graph


@contextlib.contextmanager
def _single_sample_batchnorm(model: nn.Module) -> Iterator[None]:
    """Let batch norm in training mode see one value per channel (a batch of 1 after global pooling).

    PyTorch refuses that (and a real training step would fail); a graph only needs shapes, so the
    check is lifted and the running statistics, whose unbiased update divides by zero, set aside.
    """
    import torch.nn.functional as F  # noqa: N812

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    kept = [(m.running_mean, m.running_var) for m in norms]
    for m in norms:
        m.running_mean = m.running_var = None
    try:
        with replaced(F, "_verify_batch_size", lambda size: None):  # a private function: not in F's types
            yield
    finally:
        for m, (mean, var) in zip(norms, kept, strict=True):
            m.running_mean, m.running_var = mean, var


def _trace(model: nn.Module, args: tuple, kwargs: dict, name: str, tracer: str) -> ModelGraph:
    errors: list[str] = []
    if tracer in ("auto", "fx") and not kwargs:
        try:
            return trace_fx(model, args, name)
        except Exception as exc:  # noqa: BLE001 - fx fails in many ways; report and fall back
            errors.append(f"torch.fx: {type(exc).__name__}: {_first_line(exc)}")
            log.info("fx tracing of %s failed (%s); using dispatch-level tracing", name, errors[-1])
    if tracer in ("auto", "dispatch"):
        try:
            return trace_dispatch(model, args, kwargs, name)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"dispatch tracing: {type(exc).__name__}: {_first_line(exc)}{remedy(exc)}")
    if not errors:
        raise GraphError(f"unknown tracer {tracer!r} (auto, fx, dispatch)")
    raise GraphError(f"cannot trace model {name!r}: " + "; ".join(errors))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
