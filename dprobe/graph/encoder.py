"""ModelGraph -> PyG Data (:func:`graph_to_data`) and the GNN graph encoder (:class:`GraphEncoder`). Graphs cached
on disk by model spec: :mod:`dprobe.graph.cache`."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GATv2Conv, GINEConv, global_add_pool, global_max_pool, global_mean_pool

from dprobe.graph.ops import KIND_INDEX, KINDS
from dprobe.graph.schema import ModelGraph

NODE_FEATURES = 6
EDGE_FEATURES = 2


def _log(x: float) -> float:
    return math.log1p(max(float(x), 0.0))


def graph_to_data(graph: ModelGraph) -> Data:
    """Node kind index (``kind``), log-scaled numeric features (``x``), edge features (log bytes, same dtype)."""
    kinds = torch.tensor([KIND_INDEX.get(n.kind, 0) for n in graph.nodes] or [0], dtype=torch.long)
    rows = [[_log(n.output_bytes) / 20, _log(n.params) / 20, _log(n.param_bytes) / 20, _log(n.flops) / 25,
             _log(n.saved_bytes) / 20, len(n.shapes[0]) / 4 if n.shapes else 0.0] for n in graph.nodes]
    x = torch.tensor(rows or [[0.0] * NODE_FEATURES], dtype=torch.float32)
    if graph.edges:
        ei = torch.tensor(graph.edges, dtype=torch.long).t().contiguous()
        ea = torch.tensor([[_log(graph.nodes[a].output_bytes) / 20,
                            float(graph.nodes[a].dtypes[:1] == graph.nodes[b].dtypes[:1])] for a, b in graph.edges],
                          dtype=torch.float32)
    else:
        ei = torch.zeros((2, 0), dtype=torch.long)
        ea = torch.zeros((0, EDGE_FEATURES), dtype=torch.float32)
    return Data(x=x, kind=kinds, edge_index=ei, edge_attr=ea, num_nodes=x.shape[0])


CONVS = ("gine", "gatv2")  # the message-passing layers GraphEncoder offers


def _conv(conv: str, hidden: int, heads: int) -> nn.Module:
    if conv == "gine":
        return GINEConv(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)),
                        edge_dim=EDGE_FEATURES)
    if conv == "gatv2":
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}) for gatv2")
        return GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=EDGE_FEATURES)
    raise ValueError(f"conv must be one of {', '.join(CONVS)}, got {conv!r}")


class GraphEncoder(nn.Module):
    """Message passing over op nodes (GINE, or GATv2 with ``conv="gatv2"``), then mean + max + log-sum pooling
    to a graph embedding: a PyG ``Batch`` in, ``[graphs, out_dim]`` out.

    ``message_passing=False`` (an ablation) pools the embedded node features as they are, without a layer of
    message passing: what the graph's structure adds is the difference."""

    def __init__(self, hidden: int = 64, out_dim: int = 64, layers: int = 3, conv: str = "gine",
                 heads: int = 4) -> None:
        super().__init__()
        self.kind_emb = nn.Embedding(len(KINDS), hidden)
        self.inp = nn.Linear(NODE_FEATURES, hidden)
        self.convs = nn.ModuleList(_conv(conv, hidden, heads) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.out = nn.Linear(3 * hidden, out_dim)

    def forward(self, batch: Batch, message_passing: bool = True) -> torch.Tensor:
        h = self.kind_emb(batch.kind) + self.inp(batch.x)
        if message_passing:
            for conv, norm in zip(self.convs, self.norms, strict=True):
                h = h + torch.relu(norm(conv(h, batch.edge_index, batch.edge_attr)))
        return self.out(pool_nodes(h, batch))


def pool_nodes(h: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per graph of ``batch``: the mean, max and log of the summed magnitude of its node states ``h``
    ``[nodes, d]`` -> ``[graphs, 3 d]``."""
    idx = batch.batch if batch.batch is not None else torch.zeros(h.shape[0], dtype=torch.long)
    size = int(idx.max()) + 1 if idx.numel() else 1
    return torch.cat([global_mean_pool(h, idx, size), global_max_pool(h, idx, size),
                      torch.log1p(global_add_pool(h.abs(), idx, size))], dim=1)


def rewire_edges(data: Data, seed: int) -> Data:
    """A copy of ``data`` whose edges join random nodes (as many edges, each keeping its features): the
    graph's topology shuffled, its nodes as they were (an ablation of what the structure tells)."""
    gen = torch.Generator().manual_seed(int(seed) % 2**63)
    n, m = int(data.num_nodes), int(data.edge_index.shape[1])
    edge_index = torch.randint(0, max(n, 1), (2, m), generator=gen, dtype=torch.long)
    return Data(x=data.x, kind=data.kind, edge_index=edge_index, edge_attr=data.edge_attr, num_nodes=n)
