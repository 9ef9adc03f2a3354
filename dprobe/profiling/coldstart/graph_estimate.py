"""Analytical estimate of a training step from a model graph alone, for models given as ONNX files.

An ONNX file is a graph, not a module that can be replayed (:mod:`dprobe.profiling.coldstart.replay`), so the
step is built from the graph's nodes instead:

- the optimizer step is replayed for real, on meta tensors of the graph's parameter sizes (state
  bytes and kernels exactly as for a module);
- forward: one kernel per computing node (FLOPs, bytes in and out; a batch norm also counts its
  batches); backward: two kernels for a matrix product (input and weight gradients), one for
  anything else, with the forward's FLOPs each; reshapes and constants launch nothing;
- memory: an alloc / free trace replayed through the caching-allocator model: parameters and
  optimizer state; each node's output, kept while backward needs it (what autograd keeps, op by op,
  each tensor once), freed after its consumers otherwise; in backward, gradients from a node's first
  consumer to the node, and the parameters' gradients. An exported attention (MatMul, Softmax,
  MatMul) is counted as PyTorch's fused kernel runs it. Under bf16 / fp16 autocast, tensors are half
  width except where autocast runs in fp32 (layer norm, softmax, the loss), and a half-width copy of
  each matrix product's weight is kept from its forward to its backward.

What it cannot know: an ONNX export for inference folds batch norms into convolutions and has no
dropout (export for training instead); ops an exporter splits into several nodes count as it wrote
them.
"""

from __future__ import annotations

import torch
from torch import nn

from dprobe.core.names import PRECISIONS
from dprobe.graph.onnx_reader import SAVES_INPUT, SAVES_INPUT_OPS, SAVES_OUTPUT
from dprobe.graph.ops import dtype_size
from dprobe.graph.schema import GraphNode, ModelGraph
from dprobe.profiling.coldstart.allocator import replay_reserved
from dprobe.profiling.coldstart.memtrack import (
    BACKWARD,
    FORWARD,
    OP_CLASSES,
    OPTIMIZER,
    TENSOR_CORE_CLASSES,
    MemoryTracker,
    ReplayOp,
    op_class,
)
from dprobe.profiling.coldstart.replay import (
    CUDA_CONTEXT_BYTES,
    SMALL_LIMIT,
    WEIGHT_DTYPES,
    ReplayEstimate,
    make_optimizer,
)

NO_KERNEL = {"input", "output", "reshape", "constant", "split"}
VIEW_KINDS = {"reshape", "split"}  # their outputs alias their input
SCALAR_BYTES = 64  # a factor this small (a scale) is not kept for the other factor's gradient
TENSOR_CORE_KINDS = {"conv", "conv_transpose", "linear", "matmul", "attention"}
# under bf16 / fp16 autocast these run in fp32 (autocast's fp32 list); what follows a matrix product in half
# precision stays in half precision
FP32_UNDER_AUTOCAST = {"layernorm", "softmax", "loss"}


def is_shape_arithmetic(node: GraphNode) -> bool:
    """A node computing with a few integers (an exporter's Shape / Gather / Concat of sizes): Python ints in
    PyTorch, no kernel on the GPU."""
    ints = [d for d in node.dtypes if d.startswith(("int", "uint", "bool"))]
    return bool(node.dtypes) and len(ints) == len(node.dtypes) and node.output_bytes <= 64 * 8


def fused_attention(graph: ModelGraph, producers: dict[int, list[int]], consumers: dict[int, list[int]]
                    ) -> dict[int, str]:
    """Exported attention, ``MatMul(q, k) -> [scale, mask] -> Softmax -> [dropout] -> MatMul(., v)``, which
    PyTorch runs fused, never holding the scores or probabilities: ``"scores"`` for the first product
    (it keeps q and k), ``"inside"`` for the nodes up to the probabilities (no kernel, no memory),
    ``"output"`` for the last product (it keeps v and its output)."""
    by_id = {n.id: n for n in graph.nodes}
    roles: dict[int, str] = {}
    for softmax in (n for n in graph.nodes if n.op == "Softmax"):
        inside, cur = [softmax.id], softmax.id
        for _ in range(4):  # up to the scores' product, through scaling and masking
            ups = sorted(producers.get(cur, []), key=lambda p: -by_id[p].output_bytes)
            if not ups or by_id[ups[0]].op == "MatMul":
                break
            if by_id[ups[0]].op not in ("Div", "Mul", "Add", "Sub", "Where", "Cast"):
                ups = []
                break
            cur = ups[0]
            inside.append(cur)
        if not ups or by_id[ups[0]].op != "MatMul":
            continue
        inside.append(ups[0])  # the scores' product keeps q and k, as the fused kernel does
        cur = softmax.id
        for _ in range(3):  # down to the product with v, through dropout
            downs = consumers.get(cur, [])
            if len(downs) != 1 or by_id[downs[0]].op not in ("Dropout", "Cast"):
                break
            cur = downs[0]
            inside.append(cur)
        downs = consumers.get(cur, [])
        if len(downs) == 1 and by_id[downs[0]].op == "MatMul":
            roles.update({i: "inside" for i in inside if by_id[i].op != "MatMul"})
            roles[ups[0]] = "scores"
            roles[downs[0]] = "output"
    return roles


def graph_batch(graph: ModelGraph) -> int:
    """The batch the graph's shapes are for: its first input's leading dimension (1 if unknown)."""
    for node in graph.nodes:
        if node.kind == "input" and node.shapes and node.shapes[0]:
            return max(int(node.shapes[0][0]), 1)
    return 1


def parameter_sizes(node: GraphNode, tensors: list[int] | None = None) -> list[int]:
    """The node's trainable parameters as tensors: ``tensors`` (its initializers, as the ONNX reader lists
    them) where known, else guessed from the total: a convolution's or a linear layer's weight and bias,
    a norm's scale and shift. A batch norm's running statistics are not trained."""
    if tensors:
        return tensors[:2] if node.kind == "batchnorm" else tensors
    shape = node.shapes[0] if node.shapes and node.shapes[0] else []
    channels = (shape[-1] if node.kind == "linear" else shape[1]) if len(shape) >= 2 else 0
    if node.kind in ("batchnorm", "layernorm", "norm") and channels and node.params in (2 * channels, 4 * channels):
        return [channels, channels]
    if node.kind in ("conv", "conv_transpose", "linear") and 0 < channels < node.params:
        return [node.params - channels, channels]
    return [node.params]


def _optimizer_step(graph: ModelGraph, optimizer: str) -> tuple[float, list[ReplayOp]]:
    """Optimizer state bytes and kernels of a steady step, replayed on meta tensors (:func:`parameter_sizes`)."""
    listed = graph.meta.get("param_tensors", {})
    params = nn.ParameterList([nn.Parameter(torch.empty(size, device="meta")) for n in graph.nodes if n.params > 0
                               for size in parameter_sizes(n, listed.get(str(n.id)))])
    opt = make_optimizer(params, optimizer)
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
    state = float(before) - 2 * sum(p.numel() * 4 for p in params)  # less the parameters and their gradients
    return max(state, 0.0), [ReplayOp(*(float(v) for v in op)) for op in tracker.ops]


def estimate_from_graph(graph: ModelGraph, batch: int, precision: str = "fp32",
                        optimizer: str = "adamw") -> ReplayEstimate:
    """A :class:`ReplayEstimate` of one training step of ``graph`` at ``batch`` (see the module's text)."""
    if precision in WEIGHT_DTYPES:
        raise ValueError(f"--precision {precision} needs the model as a module (it is replayed with the weights "
                         "cast); for an ONNX file, predict with bf16 (autocast, fp32 weights)")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} ({', '.join(PRECISIONS)})")
    low = precision != "fp32"
    scale = batch / graph_batch(graph)
    by_id = {n.id: n for n in graph.nodes}
    producers: dict[int, list[int]] = {}
    consumers: dict[int, list[int]] = {}
    for a, b in graph.edges:
        producers.setdefault(b, []).append(a)
        consumers.setdefault(a, []).append(b)
    order = sorted(graph.nodes, key=lambda n: n.id)
    position = {n.id: i for i, n in enumerate(order)}
    attention = fused_attention(graph, producers, consumers)

    def out_bytes(n: GraphNode) -> float:
        if attention.get(n.id) == "scores":  # never materialised by the fused kernel
            return 0.0
        half = low and n.kind not in FP32_UNDER_AUTOCAST
        return n.output_bytes * scale / (2 if half else 1)

    def index_bytes(n: GraphNode) -> float:  # max pooling keeps where each maximum was: int64, one per output
        return n.output_bytes * scale / dtype_size(n.dtypes[0] if n.dtypes else "float32") * 8

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

    def base(nid: int) -> int:  # the tensor a view (reshape, split) aliases
        while by_id[nid].kind in VIEW_KINDS and producers.get(nid):
            nid = producers[nid][0]
        return nid

    # x * sigmoid(x), an exporter's SiLU / swish: one fused op in PyTorch, which keeps x only
    silu = {n.id: c for n in graph.nodes if n.op == "Sigmoid" and len(consumers.get(n.id, [])) == 1
            and by_id[(c := consumers[n.id][0])].op == "Mul"
            and set(producers.get(c, [])) == {n.id, *producers.get(n.id, [])}}


    def conv_input(n: GraphNode) -> GraphNode | None:
        """The data input of a dense convolution with a spatial kernel, which takes a cuDNN workspace
        (``memtrack.conv_workspace_bytes``'s rule); None for other nodes. A node has no weight shape, so
        its FLOPs per output element tell: 2 x C_in / groups x kernel area, above 3 C_in when dense with a
        kernel above 1x1."""
        data = [by_id[base(p)] for p in producers.get(n.id, []) if by_id[p].kind != "constant"]
        if n.kind != "conv" or not data or not data[0].shapes or len(data[0].shapes[0]) < 3:
            return None
        outputs = n.output_bytes / dtype_size(n.dtypes[0] if n.dtypes else "float32")
        per_output = n.flops / max(2.0 * outputs, 1.0)
        return data[0] if per_output > 1.5 * data[0].shapes[0][1] else None

    def saves(n: GraphNode) -> set[int]:  # the tensors autograd keeps for n's backward (each counted once)
        if n.id in silu or attention.get(n.id) == "inside":
            return set()
        if n.id in silu.values():
            return {base(p) for p in producers.get(n.id, []) if p not in silu}
        if attention.get(n.id) == "output":  # fused attention keeps v and its output, not the probabilities
            return {n.id} | {base(p) for p in producers.get(n.id, []) if attention.get(p) != "inside"}
        data = [p for p in producers.get(n.id, []) if by_id[p].kind != "constant" and not is_shape_arithmetic(by_id[p])
                and by_id[p].output_bytes > SCALAR_BYTES]
        if n.op == "Mul":  # a factor is kept for the other's gradient: a tensor or a weight, not a constant
            return {base(p) for p in data} if len(data) > 1 or n.params else set()
        if n.op == "Div":  # x / constant keeps nothing sizeable
            return {base(p) for p in data} if len(data) > 1 else set()
        if n.kind in SAVES_INPUT or n.op in SAVES_INPUT_OPS or n.kind == "maxpool":  # + indices, below
            return {base(p) for p in data}
        return {n.id} if n.kind in SAVES_OUTPUT else set()

    compute = [n for n in order if n.kind not in NO_KERNEL and not is_shape_arithmetic(n)
               and attention.get(n.id) != "inside"]
    last_use: dict[int, int] = {}
    for a, b in graph.edges:
        last_use[base(a)] = max(last_use.get(base(a), 0), position[b])
    first_saver: dict[int, int] = {}
    for n in compute:
        for t in saves(n):
            first_saver.setdefault(t, position[n.id])

    for n in order:  # parameters, inputs and, after the first step, the optimizer's state
        if n.params:
            alloc(n.param_bytes)
    if state_bytes:
        alloc(state_bytes)
    steady = param_bytes + state_bytes
    ops: list[ReplayOp] = []
    live: dict[int, int] = {n.id: alloc(out_bytes(n)) for n in order if n.kind == "input"}
    indices: dict[int, int] = {}
    # autocast keeps a half-width copy of each weight of a matrix product from its forward to its backward
    copied = [n for n in compute if low and n.kind in TENSOR_CORE_KINDS and n.params]
    weight_copies = {n.id: alloc(n.param_bytes / 2) for n in copied}
    workspace_of = {n.id: x for n in compute if (x := conv_input(n)) is not None}  # convolution -> its input
    for n in compute:
        i = position[n.id]
        tc = n.kind in TENSOR_CORE_KINDS
        moved = out_bytes(n) + n.param_bytes + sum(out_bytes(by_id[base(p)]) for p in producers.get(n.id, []))
        ops.append(ReplayOp(FORWARD, op_class(n.kind), float(low and tc), n.flops * scale, moved))
        if n.id in weight_copies:  # autocast's cast of the weight to half width
            ops.append(ReplayOp(FORWARD, OP_CLASSES.index("elementwise"), 1.0, 0.0, 1.5 * n.param_bytes))
        if n.kind == "batchnorm":  # a training batch norm also counts its batches (num_batches_tracked += 1)
            ops.append(ReplayOp(FORWARD, OP_CLASSES.index("elementwise"), 0.0, 0.0, 16.0))
        x = workspace_of.get(n.id)
        workspace = alloc(out_bytes(x)) if x is not None else None
        live[n.id] = alloc(out_bytes(n))
        if workspace is not None:
            free(workspace)
        if n.kind == "maxpool":
            indices[n.id] = alloc(index_bytes(n))
        for t in [t for t in live if last_use.get(t, i) <= i and t not in first_saver and t != n.id
                  and by_id[t].kind != "input"]:
            free(live.pop(t))
    activation = float(sum(out_bytes(by_id[t]) for t in live if by_id[t].kind != "input"))
    activation += sum(index_bytes(by_id[t]) for t in indices) + sum(n.param_bytes / 2 for n in copied)
    for t in [t for t in live if t not in first_saver and by_id[t].kind != "input"]:  # the loss is taken
        free(live.pop(t))
    peak_forward = steady + activation
    is_compute = {n.id for n in compute}
    grads: dict[int, int] = {}  # gradient of a node's output: made by its first consumer's backward
    for n in reversed(compute):
        tc = n.kind in TENSOR_CORE_KINDS
        grad_out = grads.pop(n.id, None)
        if grad_out is None:  # the loss's input
            grad_out = alloc(out_bytes(n))
        for p in {base(p) for p in producers.get(n.id, [])} & is_compute - grads.keys():
            grads[p] = alloc(out_bytes(by_id[p]))  # the gradient flowing on to p, alive until p's backward
        moved = 2 * out_bytes(n) + n.param_bytes
        conv = n.kind in ("conv", "conv_transpose")
        kernels = 2 if tc and not conv else 1
        ops.extend([ReplayOp(BACKWARD, op_class(n.kind), float(low and tc), n.flops * scale * (2 if conv else 1),
                              moved)] * kernels)
        if n.params:
            alloc(n.param_bytes)  # the parameter's gradient, kept until the optimizer step
        if (x := workspace_of.get(n.id)) is not None:  # the backward's workspace: output gradient + input
            free(alloc(out_bytes(n) + out_bytes(x)))
        if n.id in indices:
            free(indices.pop(n.id))
        if n.id in weight_copies:
            free(weight_copies.pop(n.id))
        for t in saves(n):
            if first_saver.get(t) == position[n.id] and t in live and by_id[t].kind != "input":
                free(live.pop(t))
        free(grad_out)
    ops.extend(optimizer_ops)
    peak, reserved = replay_reserved(events)
    flops = float(sum(op.flops for op in ops))
    return ReplayEstimate(
        peak_bytes=float(max(peak, peak_forward)), reserved_bytes=float(reserved),
        device_bytes=float(reserved) + CUDA_CONTEXT_BYTES, param_bytes=param_bytes, state_bytes=state_bytes,
        steady_bytes=steady, activation_bytes=activation, flops=flops,
        matmul_flops=float(sum(op.flops for op in ops if op.op_class in TENSOR_CORE_CLASSES)),
        bytes_moved=float(sum(op.bytes_moved for op in ops)), kernels=float(len(ops)),
        large_allocs=float(sum(1 for e in events if e[0] == "alloc" and e[2] > SMALL_LIMIT)),
        attention_flops=0.0, ops=ops)
