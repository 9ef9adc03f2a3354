"""Which model graph a target runs: a config entry, a pod annotation or one graph file; else none.

``dprobe.graph`` is imported lazily: without it (or when a graph cannot be
loaded) the target is forecast from its metrics alone. The annotation may name only what an
:class:`~dprobe.services.sidecar.annotations.AnnotationPolicy` allows (zoo models, files under ``graph_dir``);
the configuration (``graphs``, ``graph_file``) is the operator's and may name any model spec.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
from pathlib import Path
from typing import Any

from dprobe.services.sidecar.annotations import MODEL_GRAPH, ZOO, AnnotationPolicy, AnnotationsFile, Refused

log = logging.getLogger(__name__)
ANNOTATION = MODEL_GRAPH


class GraphResolver:
    """Maps targets to model graphs (cached; a failure is logged once per reference).

    The pod annotation, where there is one, overrides ``graph_file``; :meth:`refresh` follows it when
    it changes. An annotation ``policy`` refuses (logged, counted) leaves those targets without a graph."""

    def __init__(self, graphs: dict[str, str] | None = None, graph_file: str = "", annotations_file: str = "",
                 policy: AnnotationPolicy | None = None):
        self.patterns = dict(graphs or {})
        self.graph_file = graph_file
        self.policy = policy or AnnotationPolicy()
        self.annotations = AnnotationsFile(annotations_file, ANNOTATION) if annotations_file else None
        self.default = self._annotated()
        self._cache: dict[str, Any] = {}
        self._by_target: dict[str, Any] = {}

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

    def reference(self, target: str) -> str:
        for pattern, ref in self.patterns.items():
            if fnmatch.fnmatchcase(target, pattern):
                return ref
        return self.default

    def graph(self, target: str) -> Any:
        if target not in self._by_target:
            ref = self.reference(target)
            self._by_target[target] = self._load(ref) if ref else None
        return self._by_target[target]

    def forget(self, target: str) -> None:
        self._by_target.pop(target, None)

    def _load(self, ref: str) -> Any:
        if ref in self._cache:
            return self._cache[ref]
        graph = None
        try:
            mod = importlib.import_module("dprobe.graph")
            if Path(ref).suffix == ".json" or Path(ref).is_file():
                graph = mod.load_model_graph(ref)
            else:  # a model spec such as "torchvision:resnet50 batch=32"
                build = getattr(mod, "build_model_graph", None)
                if build is None:
                    raise ImportError("dprobe.graph cannot build a graph from a model spec")
                spec, *opts = ref.split()
                kwargs = {k: int(v) for k, _, v in (o.partition("=") for o in opts) if k in ("batch", "image", "seq")}
                graph = build(spec, **kwargs)
        except ImportError as exc:
            log.warning("model graph %s not used: %s; forecasting from metrics alone", ref, exc)
        except Exception as exc:  # a bad graph file must not stop the sidecar
            log.warning("model graph %s cannot be loaded (%s: %s); forecasting from metrics alone",
                        ref, type(exc).__name__, exc)
        self._cache[ref] = graph
        return graph
