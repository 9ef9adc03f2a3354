"""Graph embeddings from the pretrained encoder, whatever comes in: a graph too large for the encoder is cut
to its first ``max_nodes`` ops, an op kind the encoder never saw enters as ``other``, a model that cannot be
traced gets no embedding (zeros, ``known`` False); each is counted, nothing raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch, Data

from dprobe.graph.cache import cached_model_graph
from dprobe.graph.encoder import GraphEncoder, graph_to_data
from dprobe.graph.ops import KIND_INDEX
from dprobe.graph.schema import GraphError, ModelGraph

MAX_NODES = 20_000  # ops of one graph the encoder reads (a 1000-layer transformer's forward is ~15k)
CHECKPOINT_VERSION = "graph-encoder-v1"


def default_encoder_path() -> Path:
    """The pretrained encoder shipped with the package."""
    return Path(str(resources.files("dprobe.graph") / "pretrained_encoder.pt"))


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
    def embed_data(self, datas: list[Data], chunk: int = 32) -> np.ndarray:
        """Embeddings ``[n, dim]`` of graphs already in PyG form."""
        out = [self.encoder(Batch.from_data_list(datas[i:i + chunk])) for i in range(0, len(datas), chunk)]
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
        for i in np.flatnonzero(~known):
            errs.setdefault(int(i), "no graph")
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
