"""Which model graph a target runs: a config entry, a pod annotation or one graph file; else none.

Every graph is built (a zoo model traced, an ONNX file read) or read (a graph JSON) in a child process
within the job limits (:mod:`dprobe.services.sidecar.child`), by a background thread: the sidecar itself
never imports PyTorch for a graph, and a forecast cycle never waits for one (its targets are forecast from
their metrics alone until it is there). What comes back is a :class:`GraphSummary`, what the forecaster reads
of a graph, cached by what was asked (the file, or the model with its batch, image and sequence sizes), so a
model is built once whichever targets or annotations name it. A graph JSON larger than ``max_mib`` is not
read. A failure is logged once and counted by reason (``dprobe_graph_errors_total``).

A forecaster whose workload token reads a graph encoder's embedding (its ``graph_encoder``) gets it from the
same child: the pretrained GNN run over the graph there, never in the sidecar, and the embedding cached by the
graph's hash (:func:`dprobe.graph.identity.graph_hash`), so a graph that two requests give is embedded once
(the child is told which hashes are cached, and skips them). Until the embedding is there, or when it cannot
be made, the target is forecast with the unknown-workload token.

The annotation may name only what an :class:`~dprobe.services.sidecar.annotations.AnnotationPolicy`
allows (zoo models, files under ``graph_dir``); the configuration (``graphs``, ``graph_file``) is the
operator's and may name any model spec.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily

from dprobe.core.lazy import installed
from dprobe.core.options import positive
from dprobe.services.sidecar.annotations import MODEL_GRAPH, ZOO, AnnotationPolicy, AnnotationsFile, Refused
from dprobe.services.sidecar.child import FAILURES, ChildFailed, ChildQueue, ChildRunner, TaskRefused

log = logging.getLogger(__name__)
ANNOTATION = MODEL_GRAPH
DEFAULT_MAX_MIB = 16.0  # graph JSON files of dprobe graph: 0.01 MiB (ResNet-18) to 0.13 MiB (GPT-2)
MAX_CACHED = 64  # graphs kept (a summary is well under a kilobyte)
SIZES = ("batch", "image", "seq")  # the options of a model spec
# why a target has no graph: too_large (a graph JSON over max_mib), else as a job's child (error, timeout, ...)
GRAPH_FAILURES = ("error", "too_large", *FAILURES[1:])


class _Nodes:
    """A graph's nodes where only their number and their outputs' total bytes are kept: its length is the
    number of nodes, and it iterates over one entry holding the total (what ``graph_vector`` sums)."""

    def __init__(self, count: int, output_bytes: int) -> None:
        self.count, self.output_bytes = count, output_bytes

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[_Nodes]:
        yield self


@dataclass(frozen=True)
class GraphSummary:
    """What the forecaster reads of a model graph (:func:`dprobe.data.workloads.graph_vector`: sizes, costs,
    operation counts by kind), in place of the graph itself, whose nodes may take hundreds of megabytes."""

    name: str
    source: str
    num_nodes: int
    num_params: int
    param_bytes: int
    flops: float
    saved_bytes: int
    output_bytes: int
    unknown_nodes: int
    kinds: Mapping[str, int] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    graph_hash: str = ""  # dprobe.graph.identity.graph_hash: what the embedding cache is keyed by
    embedding: tuple[float, ...] | None = None  # the graph encoder's, where the forecaster reads one

    @property
    def nodes(self) -> _Nodes:
        return _Nodes(self.num_nodes, self.output_bytes)

    def kind_counts(self) -> dict[str, int]:
        return dict(self.kinds)

    @staticmethod
    def of(graph: Any, embedding: Any = None) -> GraphSummary:
        """The summary of a ``dprobe.graph.ModelGraph`` (with its ``embedding``, if given)."""
        from dprobe.graph.identity import graph_hash

        return GraphSummary(
            name=graph.name, source=graph.source, num_nodes=len(graph.nodes), num_params=int(graph.num_params),
            param_bytes=int(graph.param_bytes), flops=float(graph.flops), saved_bytes=int(graph.saved_bytes),
            output_bytes=int(sum(n.output_bytes for n in graph.nodes)), unknown_nodes=int(graph.unknown_nodes),
            kinds=graph.kind_counts(), inputs=dict(graph.inputs), graph_hash=graph_hash(graph),
            embedding=None if embedding is None else tuple(float(v) for v in embedding))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "kinds": dict(self.kinds), "inputs": dict(self.inputs),
                "embedding": None if self.embedding is None else list(self.embedding)}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> GraphSummary:
        data = dict(data)
        if data.get("embedding") is not None:
            data["embedding"] = tuple(float(v) for v in data["embedding"])
        return GraphSummary(**data)


@dataclass(frozen=True)
class GraphRequest:
    """A graph to build and the cache's key: a graph JSON file (``path``), or a model spec (``model``: a zoo
    name, ``module:`` factory or ``.onnx`` file) at ``batch``, ``image`` and ``seq``."""

    path: str = ""
    model: str = ""
    batch: int = 1
    image: int | None = None
    seq: int | None = None

    @staticmethod
    def of(ref: str) -> GraphRequest:
        """The request of a reference: ``FILE.json`` (or any file but an ``.onnx`` one), or ``MODEL [batch=N]
        [image=N] [seq=N]``; a ValueError when a size is not a positive whole number."""
        spec, *opts = ref.split() or [""]
        if Path(ref).suffix == ".json" or (not spec.lower().endswith(".onnx") and Path(ref).is_file()):
            return GraphRequest(path=ref)
        sizes: dict[str, int] = {}
        for opt in opts:
            key, _, value = opt.partition("=")
            if key in SIZES:
                try:
                    sizes[key] = int(value)
                except ValueError:
                    raise ValueError(f"{ref!r}: {key} must be a whole number, got {value!r}") from None
                if sizes[key] < 1:
                    raise ValueError(f"{ref!r}: {key} must be at least 1, got {value!r}")
        return GraphRequest(model=spec, batch=sizes.get("batch", 1), image=sizes.get("image"), seq=sizes.get("seq"))

    def __str__(self) -> str:
        if self.path:
            return self.path
        sizes = [f"{k}={getattr(self, k)}" for k in SIZES if getattr(self, k) is not None]
        return " ".join([self.model, *sizes])


def summarise(request: Mapping[str, Any], max_bytes: int, encoder: Mapping[str, Any] | None = None,
              cached: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Build or read the graph of ``request`` (a :class:`GraphRequest` as a dict) and return its summary as a
    dict: what a child process (:mod:`dprobe.services.sidecar.child`) runs. A graph JSON over ``max_bytes`` is
    refused (:class:`TaskRefused`, reason ``too_large``) before it is parsed. With ``encoder`` (a checkpoint's
    ``graph_encoder``: path and embedding mode), the summary carries the graph's embedding, unless its hash is
    among the ``cached`` ones; ``embedding_error`` says why an embedding could not be made."""
    req = GraphRequest(**request)
    if req.path:
        from dprobe.graph.schema import GraphError, ModelGraph

        with open(req.path, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise TaskRefused("too_large", f"{req.path} is larger than graph_max_mib ({max_bytes / 2**20:g} MiB): "
                                           "not read")
        try:
            graph = ModelGraph.from_dict(json.loads(data))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GraphError(f"{req.path}: not JSON ({exc})") from exc
        except GraphError as exc:
            raise GraphError(f"{req.path}: {exc}") from exc
    else:
        from dprobe.graph.build import build_model_graph

        graph = build_model_graph(req.model, batch=req.batch, image=req.image, seq=req.seq)
    summary = GraphSummary.of(graph).to_dict()
    if encoder is not None and summary["graph_hash"] not in set(cached):
        try:
            from dprobe.graph.embed import WorkloadEmbedder

            embedder = WorkloadEmbedder(encoder.get("path"), str(encoder.get("mode", "graph")))
            summary["embedding"] = [float(v) for v in embedder.embed(graph, summary["graph_hash"])]
        except (ImportError, OSError, ValueError, RuntimeError) as exc:  # no torch here, or an encoder it refuses
            summary["embedding_error"] = f"{type(exc).__name__}: {exc}"
    return summary


class GraphResolver(ChildQueue[GraphRequest]):
    """Maps targets to model graphs (each built once, in a child process; a failure is logged once per graph).

    The pod annotation, where there is one, overrides ``graph_file``; :meth:`refresh` follows it when
    it changes. An annotation ``policy`` refuses (logged, counted) leaves those targets without a graph.
    :meth:`graph` never waits: a graph not built yet is queued for the background thread (:meth:`start`;
    :meth:`run_pending` in tests) and the target has none meanwhile. ``build``: what builds a
    :class:`GraphRequest` (default: :func:`summarise` in a child of ``runner``). ``encoder``: the forecaster's
    graph encoder (its checkpoint's ``graph_encoder``), whose embedding each summary then carries, cached by
    graph hash (at most :data:`MAX_CACHED`)."""

    thread_name = "model-graphs"

    def __init__(self, graphs: dict[str, str] | None = None, graph_file: str = "", annotations_file: str = "",
                 policy: AnnotationPolicy | None = None, max_mib: float = DEFAULT_MAX_MIB,
                 runner: ChildRunner | None = None, build: Callable[[GraphRequest], GraphSummary] | None = None,
                 encoder: Mapping[str, Any] | None = None):
        positive("graph_max_mib", max_mib)
        self.patterns = dict(graphs or {})
        self.graph_file = graph_file
        self.policy = policy or AnnotationPolicy()
        self.annotations = AnnotationsFile(annotations_file, ANNOTATION) if annotations_file else None
        self.default = self._annotated()
        self.max_mib = max_mib
        self.runner = runner or ChildRunner()
        self._build = build or self._build_in_child
        self.encoder = dict(encoder) if encoder is not None else None
        self._graphs: OrderedDict[GraphRequest, GraphSummary | None] = OrderedDict()  # built (None: failed)
        self._embeddings: OrderedDict[str, tuple[float, ...]] = OrderedDict()  # graph hash -> embedding
        self.embeddings_total = 0  # graphs embedded (the cache spares the rest)
        self._embedding_errors: dict[GraphRequest, str] = {}  # why a child made no embedding, until logged
        self._queued: set[GraphRequest] = set()
        super().__init__()
        self._lock = threading.Lock()
        self._by_target: dict[str, GraphRequest | None] = {}
        self._bad: set[str] = set()  # references that do not parse (logged and counted once)
        self.builds_total = 0  # graphs built or read (the cache spares the rest)
        self.failures_total = dict.fromkeys(GRAPH_FAILURES, 0)

    def _annotated(self) -> str:
        """The default reference: the annotation's as the policy allows it ("" when refused), else ``graph_file``."""
        value = self.annotations.value.strip() if self.annotations is not None else ""
        if not value:
            return self.graph_file
        spec, *opts = value.split()
        try:
            if spec.partition(":")[0] in ("module", *ZOO) or spec.lower().endswith(".onnx"):
                return " ".join([self.policy.model(spec), *opts])  # a model, with batch=, image=, seq=
            return self.policy.graph_file(value)  # a graph JSON
        except Refused as exc:
            self.policy.refuse(ANNOTATION, value, exc, "targets without a graph of their own are forecast from "
                               "their metrics alone")
            return ""

    def refresh(self) -> bool:
        """Follow a changed ``dprobe.io/model-graph`` annotation; True when the default graph changed."""
        if self.annotations is None or not self.annotations.changed():
            return False
        default = self._annotated()
        if default == self.default:
            return False
        log.info("annotation %s changed: targets without a graph of their own now use %s", ANNOTATION,
                 default or "none")
        self.default = default
        self._by_target.clear()
        return True

    @property
    def active(self) -> bool:
        return bool(self.patterns or self.default)

    @property
    def errors_total(self) -> int:
        """Graphs not built, whatever the reason."""
        return sum(self.failures_total.values())

    def reference(self, target: str) -> str:
        for pattern, ref in self.patterns.items():
            if fnmatch.fnmatchcase(target, pattern):
                return ref
        return self.default

    def graph(self, target: str) -> GraphSummary | None:
        """The graph of ``target``'s model, if built; None without one, or while it is being built (queued
        here, never built in this thread)."""
        if target not in self._by_target:
            self._by_target[target] = self._request(self.reference(target))
        req = self._by_target[target]
        if req is None:
            return None
        with self._lock:
            if req in self._graphs:
                self._graphs.move_to_end(req)
                return self._graphs[req]
            if req in self._queued:
                return None
            self._queued.add(req)
        self._queue.put(req)
        return None

    def _request(self, ref: str) -> GraphRequest | None:
        if not ref or ref in self._bad:
            return None
        try:
            return GraphRequest.of(ref)
        except ValueError as exc:
            self._bad.add(ref)
            self._failed(ref, "error", str(exc))
            return None

    def forget(self, target: str) -> None:
        self._by_target.pop(target, None)

    def _compute(self, req: GraphRequest) -> None:
        summary: GraphSummary | None = None
        try:
            summary = self._build(req)
        except Exception as exc:  # a bad graph or model must not stop the sidecar
            if self.runner.stopping:
                with self._lock:
                    self._queued.discard(req)
                return
            reason = exc.reason if isinstance(exc, ChildFailed) and exc.reason in GRAPH_FAILURES else "error"
            self._failed(str(req), reason, str(exc) if isinstance(exc, ChildFailed) else f"{type(exc).__name__}: {exc}")
        else:
            peak = self.runner.peak_rss_bytes
            summary = self._with_embedding(req, summary)
            log.info("model graph %s: %d nodes, %.3g GFLOP, %.3g M parameters%s%s", req, summary.num_nodes,
                     summary.flops / 1e9, summary.num_params / 1e6,
                     ", embedded" if summary.embedding is not None else "",
                     f" (its child peaked at {peak / 2**20:.0f} MiB resident)" if peak else "")
        with self._lock:
            self.builds_total += 1
            self._graphs[req] = summary
            self._queued.discard(req)
            while len(self._graphs) > MAX_CACHED:
                self._graphs.popitem(last=False)

    def _with_embedding(self, req: GraphRequest, summary: GraphSummary) -> GraphSummary:
        """``summary`` with its embedding: the one it brought (cached by its graph's hash), else the cache's;
        as it came where the forecaster reads none, or none could be made (logged)."""
        if self.encoder is None:
            return summary
        with self._lock:
            if summary.embedding is not None and summary.graph_hash:
                self.embeddings_total += 1
                self._embeddings[summary.graph_hash] = summary.embedding
                while len(self._embeddings) > MAX_CACHED:
                    self._embeddings.popitem(last=False)
                return summary
            cached = self._embeddings.get(summary.graph_hash)
            if cached is not None:
                self._embeddings.move_to_end(summary.graph_hash)
                return dataclasses.replace(summary, embedding=cached)
        log.warning("model graph %s: no embedding%s; its targets are forecast as unknown workloads", req,
                    f" ({self._embedding_errors.pop(req)})" if req in self._embedding_errors else "")
        return summary

    def _failed(self, ref: str, reason: str, message: str) -> None:
        with self._lock:
            self.failures_total[reason] += 1
        log.warning("model graph %s not used: %s; its targets are forecast from their metrics alone", ref, message)

    def _build_in_child(self, req: GraphRequest) -> GraphSummary:
        """:func:`summarise` in a child process; a graph JSON over ``max_mib`` is refused here already."""
        max_bytes = int(self.max_mib * 2**20)
        if req.path:
            try:
                size = os.stat(req.path).st_size
            except OSError as exc:
                raise ChildFailed("error", f"cannot be read ({exc.strerror or exc})") from exc
            if size > max_bytes:
                raise ChildFailed("too_large", f"{size / 2**20:.1f} MiB, larger than graph_max_mib "
                                               f"({self.max_mib:g} MiB): not read")
        elif not installed("torch"):
            raise ChildFailed("error", "building a model's graph needs torch, which is not installed here; give a "
                                       "graph JSON instead (dprobe graph MODEL --out FILE)")
        args: dict[str, Any] = {"request": dataclasses.asdict(req), "max_bytes": max_bytes}
        if self.encoder is not None:
            with self._lock:
                args.update(encoder=self.encoder, cached=list(self._embeddings))
        answer = dict(self.runner.run("graph", args))
        error = answer.pop("embedding_error", None)
        if error:
            self._embedding_errors[req] = error
        return GraphSummary.from_dict(answer)

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily("dprobe_graph_errors", "Model graphs not built, by reason: too_large (a graph "
                                  "JSON over graph_max_mib), error (it cannot be read or built), timeout, cpu, "
                                  "memory (past a limit of its child process: address space or resident memory), "
                                  "killed.", labels=["reason"])
        with self._lock:
            for reason, count in self.failures_total.items():
                fam.add_metric([reason], count)
        yield fam
