"""Graph embeddings from the pretrained encoder, whatever comes in: a graph too large for the encoder is cut
to its first ``max_nodes`` ops, an op kind the encoder never saw enters as ``other``, a model that cannot be
traced gets no embedding (zeros, ``known`` False); each is counted, nothing raises.

:class:`WorkloadEmbedder` is what the forecaster's workload token reads (:mod:`dprobe.data.workloads`): one
graph's embedding, cached by :func:`graph_hash`, in one of :data:`EMBED_MODES` (the encoder as trained, or
an ablation: no message passing, or the edges randomly rewired)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch, Data

from dprobe.graph.cache import cached_model_graph
from dprobe.graph.encoder import GraphEncoder, graph_to_data, rewire_edges
from dprobe.graph.identity import (
    DEFAULT_ENCODER,
    default_encoder_path,
    file_digest,
    graph_hash,
    resolve_encoder_path,
)
from dprobe.graph.ops import KIND_INDEX
from dprobe.graph.schema import GraphError, ModelGraph

MAX_NODES = 20_000  # ops of one graph the encoder reads (a 1000-layer transformer's forward is ~15k)
CHECKPOINT_VERSION = "graph-encoder-v1"
# how a graph is embedded: message passing over its edges (the encoder as trained); its nodes' features pooled
# without message passing; message passing over randomly rewired edges (as many, seeded by the graph's hash)
EMBED_MODES = ("graph", "no_message_passing", "shuffled_edges")
__all__ = ["CHECKPOINT_VERSION", "DEFAULT_ENCODER", "EMBED_MODES", "MAX_NODES", "Embeddings", "PreparedGraph",
           "PretrainedGraphEncoder", "WorkloadEmbedder", "default_encoder_path", "graph_hash", "prepare_graph"]


@dataclass
class PreparedGraph:
    """A graph as the encoder takes it, with what was left out of it."""

    data: Data
    skipped_nodes: int = 0  # ops beyond max_nodes, not read
    unknown_ops: int = 0  # ops of a kind the encoder has no embedding for (read as "other")


def prepare_graph(graph: ModelGraph, max_nodes: int = MAX_NODES) -> PreparedGraph:
    """:func:`graph_to_data` of the graph's first ``max_nodes`` ops (and the edges between them)."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")
    unknown = sum(1 for n in graph.nodes if n.kind not in KIND_INDEX)
    skipped = max(len(graph.nodes) - max_nodes, 0)
    if skipped:
        kept = graph.nodes[:max_nodes]
        edges = [(a, b) for a, b in graph.edges if a < max_nodes and b < max_nodes]  # edges index nodes
        graph = ModelGraph(name=graph.name, source=graph.source, nodes=kept, edges=edges,
                           inputs=dict(graph.inputs), meta=dict(graph.meta))
        unknown = sum(1 for n in kept if n.kind not in KIND_INDEX)
    return PreparedGraph(graph_to_data(graph), skipped_nodes=skipped, unknown_ops=unknown)


@dataclass
class Embeddings:
    """Embeddings of a list of graphs or models, row by row, and what could not be read."""

    z: np.ndarray  # [n, dim]; zeros where not known
    known: np.ndarray  # [n] bool: the model was traced
    skipped_nodes: np.ndarray  # [n] ops beyond the encoder's max_nodes
    unknown_ops: np.ndarray  # [n] ops of a kind the encoder never saw
    errors: dict[int, str] = field(default_factory=dict)  # row -> why the model could not be traced


class PretrainedGraphEncoder:
    """A GraphEncoder restored from a checkpoint :func:`dprobe.pretrain.encoder.pretrain_encoder` wrote."""

    def __init__(self, path: str | Path | None = None, max_nodes: int = MAX_NODES) -> None:
        path = Path(path) if path is not None else default_encoder_path()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no pretrained graph encoder here (train one: "
                                    "python train.py +exp=pretrain_gnn)")
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"{path}: not a {CHECKPOINT_VERSION} checkpoint (version "
                             f"{ckpt.get('version') if isinstance(ckpt, dict) else None!r})")
        self.hparams: dict[str, Any] = dict(ckpt["hparams"])
        self.encoder = GraphEncoder(**self.hparams)
        self.encoder.load_state_dict(ckpt["encoder"])
        self.encoder.eval()
        self.meta: dict[str, Any] = dict(ckpt.get("meta", {}))
        self.max_nodes = max_nodes
        self.path = path

    @property
    def dim(self) -> int:
        return int(self.hparams["out_dim"])

    @torch.no_grad()
    def embed_data(self, datas: list[Data], chunk: int = 32, message_passing: bool = True) -> np.ndarray:
        """Embeddings ``[n, dim]`` of graphs already in PyG form."""
        out = [self.encoder(Batch.from_data_list(datas[i:i + chunk]), message_passing=message_passing)
               for i in range(0, len(datas), chunk)]
        return torch.cat(out).numpy() if out else np.zeros((0, self.dim), dtype=np.float32)

    def embed_graphs(self, graphs: list[ModelGraph | None], errors: dict[int, str] | None = None) -> Embeddings:
        """Embeddings of ModelGraphs (None: a model that could not be traced; ``errors`` says why)."""
        n = len(graphs)
        z = np.zeros((n, self.dim), dtype=np.float32)
        known = np.array([g is not None for g in graphs], dtype=bool)
        skipped, unknown = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        prepared = {i: prepare_graph(g, self.max_nodes) for i, g in enumerate(graphs) if g is not None}
        rows = sorted(prepared)
        if rows:
            z[rows] = self.embed_data([prepared[i].data for i in rows])
        for i, p in prepared.items():
            skipped[i], unknown[i] = p.skipped_nodes, p.unknown_ops
        errs = dict(errors or {})
        for row in np.flatnonzero(~known):
            errs.setdefault(int(row), "no graph")
        return Embeddings(z=z, known=known, skipped_nodes=skipped, unknown_ops=unknown, errors=errs)

    def embed_specs(self, specs: list[dict[str, Any]], cache_dir: str | Path | None = None) -> Embeddings:
        """Embeddings of model specs (``model``, ``batch``, ``image``, ``seq``, ``config_kwargs``), traced
        (and cached) by :func:`dprobe.graph.cache.cached_model_graph`; a model that cannot be traced is
        a row of zeros with its reason in ``errors``."""
        graphs: list[ModelGraph | None] = []
        errors: dict[int, str] = {}
        for i, spec in enumerate(specs):
            try:
                graphs.append(cached_model_graph(spec, cache_dir))
            except (GraphError, Exception) as exc:  # noqa: BLE001 - any model that cannot be traced is listed
                graphs.append(None)
                errors[i] = f"{spec.get('model')}: {type(exc).__name__}: {str(exc).strip()[:300]}"
        return self.embed_graphs(graphs, errors)


class WorkloadEmbedder:
    """Model graphs' embeddings by a pretrained encoder in ``mode`` (:data:`EMBED_MODES`), cached by
    :func:`graph_hash` in memory (at most ``max_cached`` graphs) and, with ``cache_dir``, on disk (one small
    ``.npy`` per graph, encoder and mode): the GNN part of the forecaster's workload token, frozen."""

    def __init__(self, path: str | Path | None = None, mode: str = "graph", max_cached: int = 4096,
                 cache_dir: str | Path | None = None) -> None:
        if mode not in EMBED_MODES:
            raise ValueError(f"embedding mode must be one of {', '.join(EMBED_MODES)}, got {mode!r}")
        self.encoder = PretrainedGraphEncoder(resolve_encoder_path(str(path) if path else None))
        self.mode, self.max_cached = mode, max_cached
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._digest = file_digest(self.encoder.path)[:16]
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def _file(self, key: str) -> Path | None:
        return self.cache_dir / f"embedding-{self.mode}-{self._digest}-{key}.npy" if self.cache_dir else None

    def _cached(self, key: str) -> np.ndarray | None:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        file = self._file(key)
        if file is not None and file.is_file():
            try:
                z = np.load(file)
            except (OSError, ValueError):
                return None
            if z.shape == (self.dim,):
                self._keep(key, z)
                return z
        return None

    def _keep(self, key: str, z: np.ndarray) -> None:
        self._cache[key] = z.astype(np.float32)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)

    def embed(self, graph: ModelGraph, key: str | None = None) -> np.ndarray:
        """``[dim]`` float32: the embedding of ``graph`` (``key``: its :func:`graph_hash`, computed if not given)."""
        return self.embed_many([graph], [key or graph_hash(graph)])[0]

    def embed_many(self, graphs: list[ModelGraph], keys: list[str] | None = None, chunk: int = 16) -> np.ndarray:
        """``[n, dim]``: the embeddings of ``graphs``, those not cached computed together, in batches (more of
        them than ``max_cached`` too: the rows are kept here, whatever the cache lets go of)."""
        keys = keys or [graph_hash(g) for g in graphs]
        found: dict[str, np.ndarray] = {}
        todo: dict[str, ModelGraph] = {}
        for key, graph in zip(keys, graphs, strict=True):
            if key not in found and key not in todo:
                cached = self._cached(key)
                if cached is None:
                    todo[key] = graph
                else:
                    found[key] = cached
        if todo:
            datas = []
            for key, graph in todo.items():
                data = prepare_graph(graph, self.encoder.max_nodes).data
                datas.append(rewire_edges(data, int(key[:15], 16)) if self.mode == "shuffled_edges" else data)
            z = self.encoder.embed_data(datas, chunk=chunk, message_passing=self.mode != "no_message_passing")
            for key, row in zip(todo, z, strict=True):
                found[key] = row.astype(np.float32)
                self._keep(key, row)
                file = self._file(key)
                if file is not None:
                    file.parent.mkdir(parents=True, exist_ok=True)
                    np.save(file, row.astype(np.float32))
        return np.stack([found[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)
