"""Reading an ONNX file into a ModelGraph (onnx package + shape inference)."""

from __future__ import annotations

import logging
from pathlib import Path

from dprobe.graph.ops import dtype_size, normalise_op
from dprobe.graph.schema import GraphError, GraphNode, ModelGraph

log = logging.getLogger(__name__)
_SAVES_INPUT = {"conv", "conv_transpose", "linear", "matmul", "batchnorm", "layernorm", "norm", "attention"}
_SAVES_OUTPUT = {"relu", "activation", "softmax", "maxpool", "loss"}


def _dims(type_proto: object, batch: int) -> tuple[list[int], str]:
    import onnx

    tt = type_proto.tensor_type  # type: ignore[attr-defined]
    shape = [d.dim_value if d.HasField("dim_value") else batch for d in tt.shape.dim] if tt.HasField("shape") else []
    try:
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except (KeyError, ValueError, TypeError):
        dtype = "float32"
    return shape, dtype


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _flops(kind: str, node: object, in_shapes: list[list[int]], out_shapes: list[list[int]],
           weight_shapes: dict[str, list[int]]) -> float:
    out = _numel(out_shapes[0]) if out_shapes and out_shapes[0] else 0
    if kind in ("conv", "conv_transpose") and len(in_shapes) > 1 and len(in_shapes[1]) >= 3:
        w = in_shapes[1]  # (C_out, C_in / groups, k...) : groups are already in the weight shape
        return 2.0 * out * _numel(w[1:])
    if kind in ("linear", "matmul") and len(in_shapes) > 1 and in_shapes[0]:
        k = in_shapes[0][-1]
        if getattr(node, "op_type", "") == "Gemm":
            trans_a = any(a.name == "transA" and a.i for a in node.attribute)  # type: ignore[attr-defined]
            k = in_shapes[0][0] if trans_a else in_shapes[0][-1]
        return 2.0 * out * k
    return float(out)


def read_onnx(path: str | Path, batch: int = 1) -> ModelGraph:
    """Read ``path``; symbolic dims become ``batch``. Unknown ops become generic ``other`` nodes."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise GraphError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise GraphError(f"{path}: corrupt ONNX file ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node:
        raise GraphError(f"{path}: corrupt or empty ONNX file (no graph nodes)")
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # noqa: BLE001 - inference errors on unknown ops: keep going without shapes
        log.warning("%s: ONNX shape inference failed (%s); shapes of some nodes are unknown", path, exc)
    g = model.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    init_dtype = {t.name: t.data_type for t in g.initializer}
    value_info: dict[str, tuple[list[int], str]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        value_info[vi.name] = _dims(vi.type, batch)
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
                node.params += _numel(inits[x])
                node.param_bytes += _numel(inits[x]) * dtype_size(_onnx_dtype(init_dtype[x]))
            elif x in producer:
                edges.append((producer[x], node.id))
        node.flops = _flops(kind, n, in_shapes, node.shapes, inits)
        if kind in _SAVES_INPUT:
            node.saved_bytes = sum(_numel(s) * 4 for x, s in zip(n.input, in_shapes, strict=False) if x not in inits)
        elif kind in _SAVES_OUTPUT:
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
                      meta={"unknown_ops": unknown[:50], "opset": [o.version for o in model.opset_import]})


def _onnx_dtype(code: int) -> str:
    import onnx

    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, ValueError, TypeError):
        return "float32"
