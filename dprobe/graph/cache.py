"""Model graphs cached on disk by model spec (``model``, ``batch``, ``image``, ``seq``, ``config_kwargs``):
:func:`cached_model_graph` traces a spec once and reads it back after, keyed by :func:`spec_key` (which the
cold-start profiler's replay caches key by too). Torch-free until a graph has to be traced."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dprobe.graph.schema import GraphError, ModelGraph, load_model_graph

GRAPH_CACHE_VERSION = "graph-v2"


def spec_key(spec: dict[str, Any], extra: str = "") -> str:
    """A short, stable hash of ``spec`` and ``extra`` (a cache's version): the name its cached files go by."""
    text = json.dumps(spec, sort_keys=True) + extra
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cached_model_graph(spec: dict[str, Any], cache_dir: str | Path | None = None) -> ModelGraph:
    """Graph of a spec (``model``, ``batch``, ``image``, ``seq``, ``config_kwargs``), cached as JSON."""
    from dprobe.graph.build import build_model_graph

    path = graph_cache_path(spec, cache_dir)
    if path is not None and path.is_file():
        try:
            return load_model_graph(path)
        except GraphError:
            path.unlink(missing_ok=True)
    graph = build_model_graph(spec["model"], batch=spec["batch"], image=spec["image"], seq=spec["seq"],
                              config_kwargs=spec["config_kwargs"])
    if path is not None:
        graph.save(path)
    return graph


def graph_cache_path(spec: dict[str, Any], cache_dir: str | Path | None = None) -> Path | None:
    """Where :func:`cached_model_graph` caches a spec's graph (None without a ``cache_dir``)."""
    # the tracer's version is in the key: a graph cached by an older op vocabulary is traced again
    return Path(cache_dir) / f"graph-{spec_key(spec, extra=GRAPH_CACHE_VERSION)}.json" if cache_dir else None
