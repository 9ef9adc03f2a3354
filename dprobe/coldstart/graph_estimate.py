"""Analytical estimate of a training step from a model graph alone, for models given as ONNX files.

An ONNX file is a graph, not a module that can be replayed (:mod:`dprobe.coldstart.replay`), so the
step is built from the graph's nodes instead:

- the optimizer step is replayed for real, on meta tensors of the graph's parameter sizes (state
  bytes and kernels exactly as for a module);
- forward: one kernel per computing node (FLOPs, bytes in and out); backward: two kernels for a
  matrix product (input and weight gradients), one for anything else, with the forward's FLOPs
  each; reshapes and constants launch nothing;
- memory: an alloc / free trace (parameters and optimizer state; each node's output, kept where
  backward needs it, freed after its consumers otherwise; in backward, each node's output gradient
  and its parameters' gradients, its saved tensors freed) replayed through the caching-allocator
  model. Under bf16 / fp16 autocast, tensors are half width except where autocast runs in fp32
  (layer norm, softmax, the loss).

What it cannot know: an ONNX export for inference has no dropout (its masks are not counted), and
ops fused or unfolded by the exporter count as the exporter wrote them.
"""

from __future__ import annotations

import torch
from torch import nn

from dprobe.coldstart.allocator import replay_reserved
from dprobe.coldstart.memtrack import (
    _NORM_KINDS,
    BACKWARD,
    FORWARD,
    OP_CLASSES,
    OPTIMIZER,
    TENSOR_CORE_CLASSES,
    MemoryTracker,
)
from dprobe.coldstart.replay import CUDA_CONTEXT_BYTES, PRECISIONS, SMALL_LIMIT, ReplayEstimate, _optimizer
from dprobe.graph.schema import GraphNode, ModelGraph

NO_KERNEL = {"input", "output", "reshape", "constant", "split"}
TENSOR_CORE_KINDS = {"conv", "conv_transpose", "linear", "matmul", "attention"}
# under bf16 / fp16 autocast these run in fp32 (autocast's fp32 list); what follows a matrix product in half
# precision stays in half precision
FP32_UNDER_AUTOCAST = {"layernorm", "softmax", "loss"}


def _op_class(kind: str) -> int:
    if kind in ("conv", "conv_transpose"):
        return OP_CLASSES.index("conv")
    if kind in ("linear", "matmul", "attention"):
        return OP_CLASSES.index("matmul")
    return OP_CLASSES.index("norm" if kind in _NORM_KINDS else "elementwise")


def graph_batch(graph: ModelGraph) -> int:
    """The batch the graph's shapes are for: its first input's leading dimension (1 if unknown)."""
    for node in graph.nodes:
        if node.kind == "input" and node.shapes and node.shapes[0]:
            return max(int(node.shapes[0][0]), 1)
    return 1


def _optimizer_step(graph: ModelGraph, optimizer: str) -> tuple[float, list[list[float]]]:
    """Optimizer state bytes and kernels of a steady step, replayed on meta tensors (one per node)."""
    params = nn.ParameterList([nn.Parameter(torch.empty(n.params, device="meta")) for n in graph.nodes
                               if n.params > 0])
    opt = _optimizer(params, optimizer)
    tracker = MemoryTracker()
    for p in params:
        tracker.track(p)
    with tracker:
        tracker.phase = OPTIMIZER
        for _ in range(2):
            for p in params:
                p.grad = torch.zeros_like(p)
            before = tracker.current
            tracker.reset_peak()
            opt.step()
            for p in params:
                p.grad = None
    state = float(before) - sum(p.numel() * 4 for p in params) - sum(p.numel() * 4 for p in params)
    return max(state, 0.0), [[float(v) for v in op] for op in tracker.ops]


def estimate_from_graph(graph: ModelGraph, batch: int, precision: str = "fp32",
                        optimizer: str = "adamw") -> ReplayEstimate:
    """A :class:`ReplayEstimate` of one training step of ``graph`` at ``batch`` (see the module's text)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (fp32, bf16, fp16)")
    low = precision != "fp32"
    scale = batch / graph_batch(graph)
    by_id = {n.id: n for n in graph.nodes}
    consumers: dict[int, list[int]] = {}
    producers: dict[int, list[int]] = {}
    for a, b in graph.edges:
        consumers.setdefault(a, []).append(b)
        producers.setdefault(b, []).append(a)
    order = sorted(graph.nodes, key=lambda n: n.id)
    position = {n.id: i for i, n in enumerate(order)}

    def out_bytes(n: GraphNode) -> float:
        half = low and n.kind not in FP32_UNDER_AUTOCAST
        return n.output_bytes * scale / (2 if half else 1)

    state_bytes, optimizer_ops = _optimizer_step(graph, optimizer)
    param_bytes = float(graph.param_bytes)
    events: list[tuple[str, int, int]] = []
    keys = iter(range(1 << 62))

    def alloc(nbytes: float) -> int:
        key = next(keys)
        events.append(("alloc", key, int(nbytes)))
        return key

    def free(key: int) -> None:
        events.append(("free", key, 0))

    for n in order:  # parameters and, after the first step, the optimizer's state
        if n.params:
            alloc(n.param_bytes)
    if state_bytes:
        alloc(state_bytes)
    steady = param_bytes + state_bytes
    ops: list[list[float]] = []
    saved: dict[int, int] = {}
    live_out: dict[int, int] = {}
    last_use = {n.id: max((position[c] for c in consumers.get(n.id, [])), default=position[n.id]) for n in order}
    activation = 0.0
    for i, n in enumerate(order):
        if n.kind in NO_KERNEL:
            continue
        cls = _op_class(n.kind)
        tc = n.kind in TENSOR_CORE_KINDS
        moved = out_bytes(n) + n.param_bytes + sum(out_bytes(by_id[p]) for p in producers.get(n.id, []))
        ops.append([FORWARD, cls, float(low and tc), n.flops * scale, moved])
        live_out[n.id] = alloc(out_bytes(n))
        if n.saved_bytes:
            nbytes = n.saved_bytes * scale / (2 if low and n.kind not in FP32_UNDER_AUTOCAST else 1)
            saved[n.id] = alloc(nbytes)
            activation += nbytes
        for p in [p for p in list(live_out) if last_use[p] <= i and p != n.id]:
            free(live_out.pop(p))
    for key in live_out.values():  # the loss is taken from what is left
        free(key)
    peak_forward = steady + activation
    for n in reversed(order):
        if n.kind in NO_KERNEL:
            continue
        cls = _op_class(n.kind)
        tc = n.kind in TENSOR_CORE_KINDS
        grad_out = alloc(out_bytes(n))
        moved = 2 * out_bytes(n) + n.param_bytes
        kernels = 2 if tc and n.kind != "conv" and n.kind != "conv_transpose" else 1
        flops = n.flops * scale * (2 if n.kind in ("conv", "conv_transpose") else 1)
        ops.extend([[BACKWARD, cls, float(low and tc), flops, moved]] * kernels)
        if n.params:
            alloc(n.param_bytes)  # the parameter's gradient, kept until the optimizer step
        if n.id in saved:
            free(saved.pop(n.id))
        free(grad_out)
    ops.extend(optimizer_ops)
    peak, reserved = replay_reserved(events)
    flops = float(sum(op[3] for op in ops))
    return ReplayEstimate(
        peak_bytes=float(max(peak, peak_forward)), reserved_bytes=float(reserved),
        device_bytes=float(reserved) + CUDA_CONTEXT_BYTES, param_bytes=param_bytes, state_bytes=state_bytes,
        steady_bytes=steady, activation_bytes=activation, flops=flops,
        matmul_flops=float(sum(op[3] for op in ops if op[1] in TENSOR_CORE_CLASSES)),
        bytes_moved=float(sum(op[4] for op in ops)), kernels=float(len(ops)),
        large_allocs=float(sum(1 for e in events if e[0] == "alloc" and e[2] > SMALL_LIMIT)),
        attention_flops=0.0, ops=ops)
