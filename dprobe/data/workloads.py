"""Which workload each series runs, where a directory says so: ``workloads.csv`` beside the series.

A series forecaster is *conditioned* on the workload it forecasts: where the model graph is
known, on a vector summarising the graph (parameters, FLOPs, bytes saved for backward,
activation bytes, size, batch, the share of each op kind); where not, on a learned "unknown
workload" embedding. The vector comes from a :class:`dprobe.graph.ModelGraph` alone, without
torch, so the sidecar computes the same vector online from the graph it was given for a target.
``workloads.csv`` (optional) maps series ids to models:

    series,model,batch
    pod-a,torchvision:resnet50,64
    pod-b,transformers:BertConfig/BertForSequenceClassification,32

``model`` takes any name ``dprobe graph`` does; ``image``, ``seq`` and ``config_kwargs`` (JSON)
are optional. Series without a row are unknown. An h200-profiles directory needs none: its runs.csv
names the model of every run, whose series are its training runs
(:func:`dprobe.data.h200.run_workloads`).

The *workload token* (:data:`TOKENS`) is what the forecaster is given of a known workload: ``vector``, the
vector alone; ``graph``, the pooled output of the pretrained graph encoder (a GNN over the model graph,
:class:`dprobe.graph.embed.WorkloadEmbedder`) followed by the vector, so nothing the vector knows is lost;
``graph_no_mp`` and ``graph_shuffled``, ablations of the latter (no message passing; the graph's edges
randomly rewired).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dprobe.data.common import DatasetError
from dprobe.data.h200 import run_workloads
from dprobe.graph.cache import cached_model_graph
from dprobe.graph.ops import KINDS

FILE = "workloads.csv"
REQUIRED = ("series", "model", "batch")
MAX_SIZE = 2**31 - 1  # the largest batch, image side or sequence length a row may give (an int32)
SIZE_FEATURES = ["log_params", "log_param_bytes", "log_flops", "log_saved_bytes", "log_activation_bytes",
                 "log_nodes", "log_batch", "unknown_share"]
# workload token -> how its graph embedding is made (dprobe.graph.embed.EMBED_MODES; None: no embedding)
TOKENS: dict[str, str | None] = {"vector": None, "graph": "graph", "graph_no_mp": "no_message_passing",
                                 "graph_shuffled": "shuffled_edges"}


def workload_dim() -> int:
    """Length of a workload vector: the size features, then the share of nodes of each op kind."""
    return len(SIZE_FEATURES) + len(KINDS)


def check_token(token: str) -> str | None:
    """The embedding mode of a workload token (None for ``vector``); a ValueError naming the choices."""
    if token not in TOKENS:
        raise ValueError(f"workload_token must be one of {', '.join(TOKENS)}, got {token!r}")
    return TOKENS[token]


def encoder_dim(encoder: str | Path | None = None) -> int:
    """The embedding length of a graph encoder checkpoint (None: the shipped one), read without building it."""
    import torch

    from dprobe.graph.identity import resolve_encoder_path

    path = resolve_encoder_path(str(encoder) if encoder else None)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no graph encoder here (model.graph_encoder; null: the shipped one)")
    return int(torch.load(path, map_location="cpu", weights_only=True)["hparams"]["out_dim"])


def token_dim(token: str = "vector", encoder: str | Path | None = None) -> int:
    """Length of a workload token: the vector's, after the graph encoder's embedding where the token has one."""
    return workload_dim() + (encoder_dim(encoder) if check_token(token) else 0)


def token_vector(graph: Any, token: str = "vector", embedder: Any = None) -> np.ndarray | None:
    """The workload token of a graph: a ``ModelGraph``, or anything with its sizes and kind counts and an
    ``embedding`` (the sidecar's summaries). For a token with an embedding: the graph's ``embedding`` where it
    has one, else ``embedder``'s (a :class:`~dprobe.graph.embed.WorkloadEmbedder`) where the graph has nodes;
    None where there is neither (the workload is then forecast as unknown)."""
    vec = graph_vector(graph)
    if not check_token(token):
        return vec
    z = getattr(graph, "embedding", None)
    if z is None and embedder is not None and hasattr(graph, "edges"):
        z = embedder.embed(graph)
    if z is None:
        return None
    return np.concatenate([np.asarray(z, dtype=np.float32), vec])


def graph_vector(graph: Any) -> np.ndarray:
    """The workload vector of a model graph (``ModelGraph``), torch-free."""
    nodes = graph.nodes
    n = max(len(nodes), 1)
    batch = graph.inputs.get("batch") or 1
    sizes = [graph.num_params, graph.param_bytes, graph.flops, graph.saved_bytes,
             sum(node.output_bytes for node in nodes), len(nodes)]
    counts = graph.kind_counts()
    vec = [math.log1p(max(float(v), 0.0)) for v in sizes]
    vec += [math.log(max(float(batch), 1.0)), graph.unknown_nodes / n]
    vec += [counts.get(kind, 0) / n for kind in KINDS]
    return np.asarray(vec, dtype=np.float32)


def read_workloads(directory: str | Path) -> pd.DataFrame | None:
    """The rows of ``directory/workloads.csv``, checked; None when there is no such file."""
    path = Path(directory) / FILE
    if not path.is_file():
        if (Path(directory) / "runs.csv").is_file() and (Path(directory) / "samples.csv").is_file():
            return run_workloads(directory)  # h200-profiles: runs.csv names each run's model
        return None
    try:
        table = pd.read_csv(path, dtype={"series": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot be read as CSV ({str(exc).strip().splitlines()[0]})") from exc
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    for column in ("batch", "image", "seq"):  # batch on every row; image and seq where given
        if column not in table.columns:
            continue
        values = pd.to_numeric(table[column], errors="coerce")
        given = table[column].notna() if column != "batch" else pd.Series(True, index=table.index)
        bad = table.index[given & ~(values.between(1, MAX_SIZE) & (values == values.round()))]
        if len(bad):
            raw = table.loc[bad[0], column]
            raise DatasetError(f"{path}: row {int(bad[0]) + 2}: {column} must be a positive integer (at most "
                               f"{MAX_SIZE:,}), got {raw.item() if hasattr(raw, 'item') else raw!r}")
    if "config_kwargs" in table.columns:
        for i, text in table["config_kwargs"].items():
            if isinstance(text, str) and text.strip() and not _json_object(text):
                raise DatasetError(f"{path}: row {int(i) + 2}: config_kwargs must be a JSON object, got {text!r}")
    dup = table["series"][table["series"].duplicated()]
    if len(dup):
        raise DatasetError(f"{path}: series {dup.iloc[0]!r} is listed twice")
    return table


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def workload_graph(row: pd.Series, cache_dir: str | Path | None = None) -> Any:
    """The model graph of one ``workloads.csv`` row (built, or read from the cache)."""
    def opt(name: str) -> Any:
        v = row.get(name)
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else v

    image, seq, kwargs = opt("image"), opt("seq"), opt("config_kwargs")
    spec = {"model": str(row["model"]), "batch": int(row["batch"]), "image": int(image) if image else None,
            "seq": int(seq) if seq else None,
            "config_kwargs": (json.loads(kwargs) if isinstance(kwargs, str) else kwargs) or {}}
    return cached_model_graph(spec, cache_dir)


def workload_graphs(directory: str | Path, series_ids: list[str] | None = None,
                    cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Series id -> model graph for the series ``workloads.csv`` lists (all, or those in ``series_ids``)."""
    table = read_workloads(directory)
    if table is None:
        return {}
    wanted = None if series_ids is None else set(series_ids)
    graphs = {}
    for _, row in table.iterrows():
        sid = str(row["series"])
        if wanted is not None and sid not in wanted:
            continue
        try:
            graphs[sid] = workload_graph(row, cache_dir)
        except Exception as exc:  # an unknown model name, bad kwargs: say which row
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DatasetError(f"{Path(directory) / FILE}: series {sid!r}: {first}") from exc
    return graphs


def make_embedder(token: str, encoder: str | Path | None = None, cache_dir: str | Path | None = None) -> Any:
    """The :class:`~dprobe.graph.embed.WorkloadEmbedder` a token needs (None for ``vector``); ``cache_dir``: where
    its embeddings are kept between runs (beside the model graphs)."""
    mode = check_token(token)
    if mode is None:
        return None
    from dprobe.graph.embed import WorkloadEmbedder

    return WorkloadEmbedder(encoder, mode, cache_dir=cache_dir)


def workload_vectors(directory: str | Path, series_ids: list[str], cache_dir: str | Path | None = None,
                     token: str = "vector", encoder: str | Path | None = None, embedder: Any = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(S, D)`` workload tokens (:func:`token_vector`) and ``(S,)`` known flags for ``series_ids`` (zeros /
    False: unknown). ``encoder``: the graph encoder of a token with an embedding (None: the shipped one), or
    an ``embedder`` already made (its cache shared between calls)."""
    graphs = workload_graphs(directory, series_ids, cache_dir)
    if embedder is None:
        embedder = make_embedder(token, encoder, cache_dir)
    vectors = np.zeros((len(series_ids), workload_dim() + (embedder.dim if embedder is not None else 0)),
                       dtype=np.float32)
    known = np.zeros(len(series_ids), dtype=bool)
    if embedder is not None and graphs:  # every graph at once, in batches: the series then read the cache
        embedder.embed_many(list(graphs.values()))
    for i, sid in enumerate(series_ids):
        if sid in graphs:
            vec = token_vector(graphs[sid], token, embedder)
            if vec is not None:
                vectors[i], known[i] = vec, True
    return vectors, known
