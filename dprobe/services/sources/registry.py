"""The sources by name: the sidecar's ``--source`` choices, and how each source is made from its settings.

A source module registers its factory when it is imported: ``register("name", factory)``, where
``factory(options)`` makes the source from the sidecar's settings (a
:class:`~dprobe.services.sidecar.config.SidecarConfig`, or anything with the same attributes: the source reads
its own options from it). The built-in modules (:data:`BUILT_IN`) are imported on the first look-up; a new
source module is added there (and its options to the sidecar's settings).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from dprobe.services.sources.base import Source

log = logging.getLogger(__name__)
AUTO = "auto"  # not a source: nvml when NVML sees a GPU, else replay
BUILT_IN = ("nvml", "dcgm", "prometheus", "replay", "synthetic")  # modules of dprobe.services.sources

_FACTORIES: dict[str, Callable[[Any], Source]] = {}
_AVAILABLE: dict[str, Callable[[], bool]] = {}  # whether a source can read here (``auto`` asks nvml's)


def register(name: str, factory: Callable[[Any], Source], available: Callable[[], bool] | None = None) -> None:
    """Make the source ``name`` from the sidecar's settings with ``factory(options)``; ``available()``, where
    given, says whether it can read on this machine (``auto`` takes nvml when its ``available()`` is true)."""
    if name == AUTO or (name in _FACTORIES and _FACTORIES[name] is not factory):
        raise ValueError(f"a source named {name!r} is registered already")
    _FACTORIES[name] = factory
    if available is not None:
        _AVAILABLE[name] = available


def _built_in() -> dict[str, Callable[[Any], Source]]:
    for module in BUILT_IN:
        importlib.import_module(f"dprobe.services.sources.{module}")
    return _FACTORIES


def source_names() -> tuple[str, ...]:
    """Every name ``--source`` takes: ``auto``, the built-in sources, then any other registered."""
    factories = _built_in()
    return (AUTO, *sorted(factories, key=lambda n: BUILT_IN.index(n) if n in BUILT_IN else len(BUILT_IN)))


def build_source(name: str, options: Any) -> Source:
    """The source ``name`` made from ``options``; ``auto`` is nvml when NVML sees a GPU, else replay of the
    bundled trace ``options.replay_dataset``."""
    factories = _built_in()
    if name == AUTO:
        name = "nvml" if _AVAILABLE.get("nvml", lambda: False)() else "replay"
        log.info("source auto: %s", "GPU found, reading NVML" if name == "nvml"
                 else f"no GPU found, replaying the bundled {options.replay_dataset} trace")
    if name not in factories:
        raise ValueError(f"unknown source {name!r}")
    return factories[name](options)
