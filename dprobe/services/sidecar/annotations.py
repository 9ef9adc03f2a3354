"""The pod's annotations, from a Kubernetes downward-API volume, read again when the kubelet rewrites it.

``kubectl annotate pod`` on a running pod reaches the file within the kubelet's sync period; the
sidecar then picks up a new ``dprobe.io/model-graph`` or ``dprobe.io/training-job`` without a restart.

Annotations are data: whoever may annotate a pod is not trusted to run code in the sidecar, so an
:class:`AnnotationPolicy` lets them name zoo models and graph files under ``graph_dir`` only.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics_core import CounterMetricFamily

log = logging.getLogger(__name__)
MODEL_GRAPH = "dprobe.io/model-graph"
TRAINING_JOB = "dprobe.io/training-job"
ZOO = ("torchvision", "timm", "transformers")  # model sources that build a named model, and run nothing named
_ZOO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # torchvision and timm names (timm's tags: name.tag)
_CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a transformers class, never a private attribute


def read_annotations(path: str | Path) -> dict[str, str]:
    """A Kubernetes downward-API annotations file (``key="value"`` per line); {} when it cannot be read."""
    out: dict[str, str] = {}
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


class AnnotationsFile:
    """One annotation of a downward-API file, re-read only when the file changed (a ``stat`` per check)."""

    def __init__(self, path: str | Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self._stamp: tuple[int, int, int] | None = None
        self.value = ""
        self.changed()

    def changed(self) -> bool:
        """Read the file again if it was rewritten; True when the annotation's value is not what it was."""
        try:
            st = os.stat(self.path)  # follows the volume's ..data symlink, which the kubelet swaps
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        value = read_annotations(self.path).get(self.key, "")
        if value == self.value:
            return False
        self.value = value
        return True


class Refused(Exception):
    """An annotation names what annotations may not (code, or a file outside ``graph_dir``)."""


class AnnotationPolicy:
    """What pod annotations may name, and how many were refused (exported as a client_python collector).

    Accepted: zoo models (``torchvision:NAME``, ``timm:NAME``, ``transformers:CONFIG/ARCH``, with no
    ``config_kwargs``) and files under ``graph_dir`` (after resolving ``..`` and symlinks). Refused:
    ``module:pkg.mod:factory`` specs and ``config_kwargs`` (code run in the sidecar), unless
    ``allow_code``, and every other file. The operator's own configuration is not checked here.
    """

    def __init__(self, graph_dir: str = "", allow_code: bool = False) -> None:
        if graph_dir and not Path(graph_dir).is_dir():
            raise ValueError(f"graph_dir {graph_dir!r} is not a directory")
        self.graph_dir = Path(graph_dir).resolve() if graph_dir else None
        self.allow_code = allow_code
        self.refused_total = {MODEL_GRAPH: 0, TRAINING_JOB: 0}
        self._lock = threading.Lock()

    def model(self, text: str) -> str:
        """A model named by an annotation as the sidecar may use it: a zoo name as it is, a file as its real
        path under ``graph_dir``; raises :class:`Refused` saying why not."""
        lib, sep, rest = text.partition(":")
        if sep and lib == "module":
            if self.allow_code:
                return text
            raise Refused(f"{text!r} is a module: spec, code the sidecar would run; annotations name "
                          f"{', '.join(z + ':' for z in ZOO)} models or a graph file under graph_dir "
                          "(allow_code_annotations lets them name code)")
        if sep and lib in ZOO:
            names = rest.split("/") if lib == "transformers" else [rest]
            pattern = _CLASS_NAME if lib == "transformers" else _ZOO_NAME
            if not self.allow_code and not (len(names) == (2 if lib == "transformers" else 1)
                                            and all(pattern.fullmatch(n) for n in names)):
                raise Refused(f"{text!r} is not a {lib} model name")
            return text
        return self.graph_file(text)

    def graph_file(self, text: str) -> str:
        """The real path of a file named by an annotation, which must lie under ``graph_dir``."""
        if self.graph_dir is None:
            raise Refused(f"{text!r}: annotations name files under graph_dir only, and graph_dir is not set")
        try:
            path = (self.graph_dir / text).resolve()  # .. and symlinks resolved: where the file really is
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
            raise Refused(f"{text!r}: {exc}") from exc
        if not path.is_relative_to(self.graph_dir):
            raise Refused(f"{text!r} is outside graph_dir {self.graph_dir}")
        return str(path)

    def config_kwargs(self, text: str) -> None:
        """Refuse ``config_kwargs`` (arguments of a model's constructor) unless code is allowed."""
        if text and not self.allow_code:
            raise Refused("config_kwargs are arguments to code the sidecar would run (allow_code_annotations "
                          "lets annotations give them)")

    def refuse(self, annotation: str, value: str, exc: Refused, then: str) -> None:
        """Log and count a refused annotation; ``then``: what the sidecar does without it."""
        with self._lock:
            self.refused_total[annotation] = self.refused_total.get(annotation, 0) + 1
        log.warning("annotation %s=%r refused: %s; %s", annotation, value, exc, then)

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily("dprobe_annotations_refused", "Pod annotations refused because they named code "
                                  "(module: specs, config_kwargs) or a file outside graph_dir.",
                                  labels=["annotation"])
        with self._lock:
            for annotation, count in sorted(self.refused_total.items()):
                fam.add_metric([annotation], count)
        yield fam
