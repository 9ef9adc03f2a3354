"""Model graphs: turn a model (nn.Module, ONNX file or zoo name) into a portable ModelGraph.

Names are imported on first use, so that ``dprobe --help`` does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_model_graph": "dprobe.graph.build",
    "SCHEMA_VERSION": "dprobe.graph.schema", "GraphError": "dprobe.graph.schema",
    "GraphNode": "dprobe.graph.schema", "ModelGraph": "dprobe.graph.schema",
    "load_model_graph": "dprobe.graph.schema",
    "trace_module": "dprobe.graph.trace",
    "ModelSpec": "dprobe.graph.zoo", "parse_spec": "dprobe.graph.zoo",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dprobe.graph' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
