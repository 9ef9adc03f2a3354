"""Model graphs: turn a model (nn.Module, ONNX file or zoo name) into a portable ModelGraph."""

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "build_model_graph": "dprobe.graph.build",
    "SCHEMA_VERSION": "dprobe.graph.schema", "GraphError": "dprobe.graph.schema",
    "GraphNode": "dprobe.graph.schema", "ModelGraph": "dprobe.graph.schema",
    "load_model_graph": "dprobe.graph.schema",
    "trace_module": "dprobe.graph.trace",
    "ModelSpec": "dprobe.graph.zoo", "parse_spec": "dprobe.graph.zoo",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
