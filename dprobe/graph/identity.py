"""Which graph, which encoder, without torch: a graph's hash (:func:`graph_hash`: embeddings are cached by it)
and the graph encoder a checkpoint records (:func:`resolve_encoder_path`, checked by :func:`file_digest`).
The sidecar reads these in its own process, which never imports torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_ENCODER = "dprobe/graph/pretrained_encoder.pt"  # how a checkpoint records the shipped encoder


def default_encoder_path() -> Path:
    """The pretrained encoder shipped with the package."""
    return Path(str(resources.files("dprobe.graph") / "pretrained_encoder.pt"))


def resolve_encoder_path(recorded: str | None) -> Path:
    """The file of a recorded encoder path: None or :data:`DEFAULT_ENCODER` is the shipped encoder."""
    return default_encoder_path() if recorded in (None, "", DEFAULT_ENCODER) else Path(recorded)


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file (a checkpoint records its graph encoder's, to refuse another at inference)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def graph_hash(graph: Any) -> str:
    """A stable hash of what the encoder reads of a ``ModelGraph`` (its nodes, edges and inputs; not its name):
    two requests for the same graph share an embedding."""
    text = json.dumps({"nodes": [asdict(n) for n in graph.nodes], "edges": [list(e) for e in graph.edges],
                       "inputs": graph.inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
