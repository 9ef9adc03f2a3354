"""The sources by name: the sidecar's ``--source`` choices, and how each source is made from its options.

A source module declares its options beside it, as an option group (``DcgmOptions``: ``dcgm_url``, ...; see
:mod:`dprobe.core.options`), and registers its factory when it is imported: ``register("name", factory)``,
where ``factory(options, context)`` makes the source from its own group (``options``) and what the sidecar
tells every source (:class:`SourceContext`). The sidecar's settings hold each source's group under the
source's name (``sources.dcgm``). The built-in modules (:data:`BUILT_IN`) are imported on the first look-up; a
new source module is added there (and its group to the sidecar's ``SourceOptions``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dprobe.services.sources.base import Source

log = logging.getLogger(__name__)
AUTO = "auto"  # not a source: nvml when NVML sees a GPU, else replay
BUILT_IN = ("nvml", "dcgm", "prometheus", "replay", "synthetic")  # modules of dprobe.services.sources


@dataclass(frozen=True)
class SourceContext:
    """What the sidecar tells every source beside its own options: the timeout of its requests (s), and the
    forecast grid (step) and history (window) it keeps, in seconds."""

    http_timeout: float = 3.0
    step_seconds: float = 10.0
    window_seconds: float = 3600.0


Factory = Callable[[Any, SourceContext], Source]
_FACTORIES: dict[str, Factory] = {}
_AVAILABLE: dict[str, Callable[[], bool]] = {}  # whether a source can read here (``auto`` asks nvml's)


def register(name: str, factory: Factory, available: Callable[[], bool] | None = None) -> None:
    """Make the source ``name`` with ``factory(options, context)`` from its option group; ``available()``, where
    given, says whether it can read on this machine (``auto`` takes nvml when its ``available()`` is true)."""
    if name == AUTO or (name in _FACTORIES and _FACTORIES[name] is not factory):
        raise ValueError(f"a source named {name!r} is registered already")
    _FACTORIES[name] = factory
    if available is not None:
        _AVAILABLE[name] = available


def _built_in() -> dict[str, Factory]:
    for module in BUILT_IN:
        importlib.import_module(f"dprobe.services.sources.{module}")
    return _FACTORIES


def source_names() -> tuple[str, ...]:
    """Every name ``--source`` takes: ``auto``, the built-in sources, then any other registered."""
    factories = _built_in()
    return (AUTO, *sorted(factories, key=lambda n: BUILT_IN.index(n) if n in BUILT_IN else len(BUILT_IN)))


def build_source(name: str, sources: Any, context: SourceContext | None = None) -> Source:
    """The source ``name`` made from its option group, ``sources.<name>`` (``sources``: the sidecar's
    ``SourceOptions``; None for a source without options there); ``auto`` is nvml when NVML sees a GPU, else replay of the bundled trace
    ``sources.replay.dataset`` (its full copy, else the sample in the package: the replay source logs which)."""
    factories = _built_in()
    if name == AUTO:
        name = "nvml" if _AVAILABLE.get("nvml", lambda: False)() else "replay"
        log.info("source auto: %s", "GPU found, reading NVML" if name == "nvml"
                 else f"no GPU found, replaying the bundled {sources.replay.dataset} trace")
    if name not in factories:
        raise ValueError(f"unknown source {name!r}")
    return factories[name](getattr(sources, name, None), context or SourceContext())
