"""Memory on a GPU or software stack never measured: the p50 and p90 from the spread between sources.

The learned memory corrections come from one source measured byte by byte (h200-profiles: NVML and the
allocator on an H200) and are carried to other GPUs' software stacks by a factor where fit labels say how
much more that stack takes (the CUDA context, cuDNN / cuBLAS workspaces, the allocator's habits): timm's
RTX 3090 benchmark (PyTorch 1.12) and Gavel's pairs on K80 / P100 / V100 (a 2019 stack) each give one. A
stack none of them measured is as likely to sit anywhere among them, so its prediction is

- p50: the replay's memory times the geometric mean of the sources' factors;
- p90: the model's own p90 times that, times the largest error the mean of the *other* sources made on a
  source left out (each source in turn): the spread between sources, not within one.

``memory_sources.json`` holds the sources, the two factors and the leave-one-source-out table;
``benchmarks/memory_sources.py --write`` remakes it from the bundled data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

SOURCES_PATH = Path(__file__).with_name("memory_sources.json")
FORMAT = "dprobe-memory-sources/1"


@dataclass(frozen=True)
class MemorySource:
    """One source of memory measurements: its name, the GPUs and stack it covers, and the factor on the
    replay's (learned) memory that its measurements need (1 for the source the model learnt from)."""

    name: str
    gpus: tuple[str, ...]
    stack: str
    factor: float
    evidence: str  # "measured" (NVML, allocator) or "fit labels" (ran / ran out of memory)
    rows: int


@dataclass(frozen=True)
class UnseenMemory:
    """The factors for a GPU or stack none of the sources measured, and how they were found."""

    p50_factor: float
    p90_factor: float  # on top of the p50 factor, on the model's own p90
    sources: tuple[MemorySource, ...]
    left_out: tuple[dict[str, Any], ...]  # per source left out: the others' factor, the error, covered or not

    def note(self) -> str:
        """One sentence for the prediction's notes."""
        names = ", ".join(f"{s.name} x{s.factor:.3f}" for s in self.sources)
        return (f"memory on a GPU / software stack no source measured: p50 x{self.p50_factor:.3f} (the geometric "
                f"mean of the measured stacks' factors: {names}), p90 x{self.p50_factor * self.p90_factor:.3f} "
                "(the largest error of that mean with a source left out)")


def fit_label_factor(need: np.ndarray, capacity: np.ndarray, ran: np.ndarray, fixed: np.ndarray | float = 0.0,
                     grid: np.ndarray | None = None) -> tuple[float, float]:
    """The factor on predicted memory ``need`` that gets most fit labels right (``ran``: the job or pair ran;
    it fits where ``factor * need + fixed <= capacity``): the middle of the best factors on ``grid`` (0.7 to
    1.6), and the share of labels it gets right."""
    grid = np.arange(0.7, 1.6001, 0.005) if grid is None else grid
    need, capacity, ran = np.asarray(need, float), np.asarray(capacity, float), np.asarray(ran, bool)
    right = np.array([((f * need + fixed <= capacity) == ran).mean() for f in grid])
    best = np.flatnonzero(right == right.max())
    return float(np.median(grid[best])), float(right.max())


def _factors(logs: np.ndarray) -> tuple[float, float]:
    """The p50 factor (geometric mean) and the p90's widening (the largest error of the others' mean on a
    source left out, at least none) of sources' log factors."""
    errors = [float(logs[i] - np.delete(logs, i).mean()) for i in range(len(logs))] if len(logs) > 1 else []
    return float(np.exp(logs.mean())), math.exp(max([0.0, *errors]))


def unseen_memory(sources: list[MemorySource]) -> UnseenMemory:
    """The factors of the module docstring from the sources (at least one), and each source left out in
    turn: the factors the others give, its error, and whether the others' p90 covered it."""
    if not sources:
        raise ValueError("no memory sources")
    logs = np.log([s.factor for s in sources])
    p50, widen = _factors(logs)
    rows = []
    for i, s in enumerate(sources):
        if len(sources) < 2:
            break
        others_p50, others_widen = _factors(np.delete(logs, i))
        p90 = others_p50 * others_widen
        rows.append({"source": s.name, "factor": s.factor, "others_factor": round(others_p50, 4),
                     "log_error": round(float(logs[i] - math.log(others_p50)), 4),
                     "others_p90_factor": round(p90, 4), "covered": bool(s.factor <= p90)})
    return UnseenMemory(p50, widen, tuple(sources), tuple(rows))


def write_sources(sources: list[MemorySource], path: str | Path = SOURCES_PATH) -> dict[str, Any]:
    """Write the sources and their factors (``memory_sources.json``)."""
    u = unseen_memory(sources)
    doc = {"format": FORMAT, "sources": [s.__dict__ | {"gpus": list(s.gpus)} for s in sources],
           "unseen": {"p50_factor": round(u.p50_factor, 4), "p90_factor": round(u.p90_factor, 4)},
           "left_out": list(u.left_out)}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


@lru_cache(maxsize=2)
def load_sources(path: str | None = None) -> UnseenMemory:
    """The shipped sources (``memory_sources.json``) or those at ``path``."""
    data = json.loads(Path(path or SOURCES_PATH).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path or SOURCES_PATH}: not dprobe's memory sources (format {data.get('format')!r})")
    sources = [MemorySource(s["name"], tuple(s["gpus"]), s["stack"], float(s["factor"]), s["evidence"], int(s["rows"]))
               for s in data["sources"]]
    return unseen_memory(sources)
