"""Model graphs: turn a model (nn.Module, ONNX file or zoo name) into a portable ModelGraph."""

from dprobe.graph.build import build_model_graph
from dprobe.graph.schema import SCHEMA_VERSION, GraphError, GraphNode, ModelGraph, load_model_graph
from dprobe.graph.trace import trace_module
from dprobe.graph.zoo import ModelSpec, parse_spec

__all__ = [
    "SCHEMA_VERSION", "GraphError", "GraphNode", "ModelGraph", "ModelSpec", "build_model_graph",
    "load_model_graph", "parse_spec", "trace_module",
]
