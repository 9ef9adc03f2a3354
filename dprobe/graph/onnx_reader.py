"""Reading an ONNX file into a ModelGraph (onnx package + shape inference)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from dprobe.graph.ops import dtype_size, normalise_op
from dprobe.graph.schema import GraphError, GraphNode, ModelGraph

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)
SAVES_INPUT = {"conv", "conv_transpose", "linear", "matmul", "batchnorm", "layernorm", "norm", "attention"}
SAVES_OUTPUT = {"relu", "activation", "softmax", "maxpool", "loss"}
# ops whose gradient needs their input rather than their output: a product's factors, and these
# activations (ReLU6 / hardtanh are Clip)
SAVES_INPUT_OPS = {"Mul", "Div", "Clip", "Gelu", "Erf", "Softplus", "LeakyRelu", "PRelu", "HardSwish",
                    "HardSigmoid"}
DEFAULT_SEQ = 128  # an input's symbolic dims after the batch (sequence length), as for zoo models


def _dims(type_proto: object, batch: int) -> tuple[list[int], str]:
    import onnx

    tt = type_proto.tensor_type  # type: ignore[attr-defined]
    shape = [d.dim_value if d.HasField("dim_value") else batch for d in tt.shape.dim] if tt.HasField("shape") else []
    try:
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except (KeyError, ValueError, TypeError):
        dtype = "float32"
    return shape, dtype


def _has_unknown_dims(graph: object) -> bool:
    """Whether shape inference left a node output without a concrete shape."""
    shaped = {vi.name: vi for vi in [*graph.value_info, *graph.output]}  # type: ignore[attr-defined]
    for node in graph.node:  # type: ignore[attr-defined]
        for name in node.output:
            vi = shaped.get(name)
            tt = vi.type.tensor_type if vi is not None else None
            if tt is None or not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
                return True
    return False


def _runtime_shapes(model: onnx.ModelProto, batch: int, seq: int, path: Path) -> dict[str, list[int]]:
    """Every node output's shape at ``batch``, from running the model (onnxruntime, CPU) at batch 1 and 2:
    a dim that grows with the batch grows linearly ({} with a warning where the model does not run)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    listed = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=x) for n in m.graph.node for x in n.output
                          if x and x not in listed)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node's output
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        runs = []
        for b in (1, 2):
            feeds = {}
            for i in session.get_inputs():
                free = [k for k, d in enumerate(i.shape) if not (isinstance(d, int) and d > 0)]
                shape = [d if k not in free else (b if k == free[0] else seq) for k, d in enumerate(i.shape)]
                feeds[i.name] = (np.random.rand(*shape).astype(np.float32) if "float" in i.type
                                 else np.zeros(shape, dtype=np.int64 if "int64" in i.type else np.int32))
            runs.append([list(np.shape(r)) for r in session.run(names, feeds)])
    except Exception as exc:  # noqa: BLE001 - any failure to run: keep the inferred shapes
        log.warning("%s: could not run the model to learn its shapes (%s); unknown dims are taken as the batch",
                    path, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return {}
    return {name: [d1 + (d2 - d1) * (batch - 1) for d1, d2 in zip(s1, s2, strict=True)] if len(s1) == len(s2) else s1
            for name, s1, s2 in zip(names, runs[0], runs[1], strict=True)}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _flops(kind: str, node: onnx.NodeProto, in_shapes: list[list[int]], out_shapes: list[list[int]],
           weight_shapes: dict[str, list[int]]) -> float:
    out = _numel(out_shapes[0]) if out_shapes and out_shapes[0] else 0
    if kind in ("conv", "conv_transpose") and len(in_shapes) > 1 and len(in_shapes[1]) >= 3:
        w = in_shapes[1]  # (C_out, C_in / groups, k...) : groups are already in the weight shape
        return 2.0 * out * _numel(w[1:])
    if kind in ("linear", "matmul") and len(in_shapes) > 1 and in_shapes[0]:
        k = in_shapes[0][-1]
        if node.op_type == "Gemm":
            trans_a = any(a.name == "transA" and a.i for a in node.attribute)
            k = in_shapes[0][0] if trans_a else in_shapes[0][-1]
        return 2.0 * out * k
    return float(out)


def read_onnx(path: str | Path, batch: int = 1, seq: int | None = None) -> ModelGraph:
    """Read ``path``; an input's first symbolic dim becomes ``batch``, any other ``seq`` (default 128), before
    shapes are inferred (a dim still unknown after that is learnt by running the model, else taken as
    ``batch``). Unknown ops become generic ``other`` nodes."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise GraphError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path))
    except onnx.checker.ValidationError as exc:  # weights saved as external data that is not there
        raise GraphError(f"{path}: its weights are stored in external data that cannot be read ({exc}); keep "
                         "the data file(s) beside the .onnx file, as it was saved") from exc
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise GraphError(f"{path}: corrupt ONNX file ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node:
        raise GraphError(f"{path}: corrupt or empty ONNX file (no graph nodes)")
    as_saved = onnx.ModelProto()
    as_saved.CopyFrom(model)  # symbolic dims kept: run at batch 1 and 2 if shapes stay unknown
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:  # an input's first symbolic dim is the batch, any other the sequence length
        if vi.name not in init_names and vi.type.tensor_type.HasField("shape"):
            symbolic = [d for d in vi.type.tensor_type.shape.dim if not d.HasField("dim_value")]
            for k, d in enumerate(symbolic):
                d.dim_value = batch if k == 0 else (seq or DEFAULT_SEQ)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - inference errors on unknown ops: keep going without shapes
        log.warning("%s: ONNX shape inference failed (%s); shapes of some nodes are unknown", path, exc)
    g = model.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    init_dtype = {t.name: t.data_type for t in g.initializer}
    value_info: dict[str, tuple[list[int], str]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        value_info[vi.name] = _dims(vi.type, batch)
    if _has_unknown_dims(g):  # e.g. a reshape to sizes computed from another tensor's shape
        for name, shape in _runtime_shapes(as_saved, batch, seq or DEFAULT_SEQ, path).items():
            value_info[name] = (shape, value_info.get(name, ([], "float32"))[1])
    nodes: list[GraphNode] = []
    edges: list[tuple[int, int]] = []
    producer: dict[str, int] = {}
    for vi in g.input:
        if vi.name in inits:
            continue
        shape, dtype = value_info[vi.name]
        producer[vi.name] = len(nodes)
        nodes.append(GraphNode(id=len(nodes), name=vi.name, kind="input", op="input", shapes=[shape], dtypes=[dtype]))
    used: set[str] = set()
    unknown: list[str] = []
    param_tensors: dict[str, list[int]] = {}  # node id -> sizes of its initializers, in input order
    for i, n in enumerate(g.node):
        op = n.op_type if n.domain in ("", "ai.onnx", "ai.onnx.ml") else f"{n.domain}.{n.op_type}"
        kind = normalise_op(n.op_type) if n.domain in ("", "ai.onnx", "ai.onnx.ml") else "other"
        name = n.name or f"{n.op_type}_{i}"
        if kind == "other":
            unknown.append(f"{name} ({op})")
        in_shapes = [inits.get(x) or value_info.get(x, ([], ""))[0] for x in n.input]
        outs = [value_info.get(x, ([], "float32")) for x in n.output]
        node = GraphNode(id=len(nodes), name=name, kind=kind, op=op, shapes=[s for s, _ in outs],
                         dtypes=[d for _, d in outs])
        for x in n.input:
            if x in inits and x not in used:
                used.add(x)
                param_tensors.setdefault(str(node.id), []).append(_numel(inits[x]))
                node.params += _numel(inits[x])
                node.param_bytes += _numel(inits[x]) * dtype_size(_onnx_dtype(init_dtype[x]))
            elif x in producer:
                edges.append((producer[x], node.id))
        node.flops = _flops(kind, n, in_shapes, node.shapes, inits)
        if kind in SAVES_INPUT or n.op_type in SAVES_INPUT_OPS:
            node.saved_bytes = sum(_numel(s) * 4 for x, s in zip(n.input, in_shapes, strict=False) if x not in inits)
        elif kind in SAVES_OUTPUT:
            node.saved_bytes = node.output_bytes
        for x in n.output:
            producer[x] = node.id
        nodes.append(node)
    out_node = GraphNode(id=len(nodes), name="output", kind="output", op="output")
    for vi in g.output:
        shape, dtype = value_info.get(vi.name, ([], "float32"))
        out_node.shapes.append(shape)
        out_node.dtypes.append(dtype)
        if vi.name in producer:
            edges.append((producer[vi.name], out_node.id))
    nodes.append(out_node)
    if unknown:
        log.warning("%s: %d node(s) with unknown ops became generic nodes: %s", path, len(unknown),
                    ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else ""))
    return ModelGraph(name=path.stem, source="onnx", nodes=nodes, edges=edges,
                      meta={"unknown_ops": unknown[:50], "opset": [o.version for o in model.opset_import],
                            "param_tensors": param_tensors})


def _onnx_dtype(code: int) -> str:
    import onnx

    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, ValueError, TypeError):
        return "float32"
