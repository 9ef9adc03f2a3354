"""Which model graph a target runs: a config entry, a pod annotation or one graph file; else none.

``dprobe.graph`` is imported lazily: without it (or when a graph cannot be
loaded) the target is forecast from its metrics alone.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
ANNOTATION = "dprobe.io/model-graph"


def read_annotations(path: str | Path) -> dict[str, str]:
    """A Kubernetes downward-API annotations file (``key="value"`` per line)."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].encode().decode("unicode_escape")
            out[key.strip()] = value
    return out


class GraphResolver:
    """Maps targets to model graphs (cached; a failure is logged once per reference)."""

    def __init__(self, graphs: dict[str, str] | None = None, graph_file: str = "", annotations_file: str = ""):
        self.patterns = dict(graphs or {})
        default = graph_file
        if annotations_file:
            default = read_annotations(annotations_file).get(ANNOTATION, "") or default
        self.default = default
        self._cache: dict[str, Any] = {}
        self._by_target: dict[str, Any] = {}

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
