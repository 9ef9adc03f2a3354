"""The portable model graph: dataclasses and a versioned JSON schema."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "dprobe.model-graph"
SCHEMA_VERSION = 1


class GraphError(ValueError):
    """A model could not be turned into a graph (names the model, op or node involved)."""


@dataclass
class GraphNode:
    """One operation: normalised ``kind``, the original ``op`` name and its costs."""

    id: int
    name: str
    kind: str
    op: str
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    params: int = 0
    param_bytes: int = 0
    flops: float = 0.0
    saved_bytes: int = 0

    @property
    def output_bytes(self) -> int:
        from dprobe.graph.ops import dtype_size

        total = 0
        for shape, dtype in zip(self.shapes, self.dtypes, strict=False):
            n = 1
            for d in shape:
                n *= max(int(d), 0)
            total += n * dtype_size(dtype)
        return total


@dataclass
class ModelGraph:
    """A model as a data-flow graph of operations (edges are ``(src, dst)`` node ids)."""

    name: str
    source: str
    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        return sum(n.params for n in self.nodes)

    @property
    def param_bytes(self) -> int:
        return sum(n.param_bytes for n in self.nodes)

    @property
    def flops(self) -> float:
        return float(sum(n.flops for n in self.nodes))

    @property
    def saved_bytes(self) -> int:
        return sum(n.saved_bytes for n in self.nodes)

    @property
    def unknown_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.kind == "other")

    def kind_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.kind] = counts.get(n.kind, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "source": self.source, "nodes": len(self.nodes), "edges": len(self.edges),
            "params": self.num_params, "param_bytes": self.param_bytes, "flops": self.flops,
            "saved_bytes": self.saved_bytes, "unknown_nodes": self.unknown_nodes,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "version": SCHEMA_VERSION, "name": self.name, "source": self.source,
            "inputs": self.inputs, "meta": self.meta,
            "nodes": [asdict(n) for n in self.nodes], "edges": [list(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelGraph:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise GraphError(f"not a model graph (expected schema {SCHEMA!r})")
        version = data.get("version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise GraphError(f"unsupported model-graph schema version {version!r} (this dprobe reads <= {SCHEMA_VERSION})")
        try:
            nodes = [GraphNode(**n) for n in data["nodes"]]
            edges = [(int(a), int(b)) for a, b in data["edges"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphError(f"malformed model graph: {exc}") from exc
        return cls(name=data.get("name", ""), source=data.get("source", ""), nodes=nodes, edges=edges,
                   inputs=dict(data.get("inputs", {})), meta=dict(data.get("meta", {})))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        write_atomically(path, json.dumps(self.to_dict(), separators=(",", ":")))
        return path


def load_model_graph(path: str | Path) -> ModelGraph:
    """Read a graph written by :meth:`ModelGraph.save`."""
    path = Path(path)
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise GraphError(f"{path}: not JSON ({exc})") from exc
    try:
        return ModelGraph.from_dict(data)
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from exc


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so that a reader (another worker
    filling the same cache) never sees a half-written file."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
