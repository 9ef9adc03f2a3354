"""How much of backward is left to hide a model's gradient all-reduce: the *backward window*.

DistributedDataParallel starts reducing gradient buckets while backward still runs, in the order backward
produces them (the last layers first). A gradient ready early in backward has the rest of backward to be
reduced behind; one ready at the very end (the first layers', e.g. embeddings) has none. The backward
window summarises that per model:

    window = sum over parameter-bearing ops of  (their share of the gradient bytes)
                                               x (share of backward compute still to run once they are ready)

computed on the model's traced graph (ops in forward order, with parameters and FLOPs), taking backward
as the ops in reverse order, each costing twice its forward FLOPs when it has parameters (input and weight
gradients) and once otherwise. ResNets, whose last stages hold most parameters, are near 0.8; a stack of
equal layers is near 0.5; a model whose parameters sit in its first layer (embeddings) near 0. Without a
graph (``--params`` only) dprobe assumes the gradient bytes spread evenly over backward:
:data:`UNIFORM_WINDOW`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

UNIFORM_WINDOW = 0.5  # gradient bytes spread evenly over backward compute


class _Op(Protocol):
    params: int
    flops: float


class _Graph(Protocol):  # what is read of a dprobe.graph ModelGraph (not imported: this unit needs core only)
    nodes: Sequence[_Op]


def backward_window(graph: _Graph) -> float | None:
    """The backward window in [0, 1] of a traced ``ModelGraph`` (its ``nodes`` in forward order, each with
    ``params`` and ``flops``); None when it has no parameters or no FLOPs to order them by."""
    nodes = list(reversed(graph.nodes))
    params = np.array([max(int(n.params), 0) for n in nodes], dtype=np.float64)
    cost = np.array([max(float(n.flops), 0.0) * (2.0 if n.params else 1.0) for n in nodes], dtype=np.float64)
    if params.sum() <= 0 or cost.sum() <= 0:
        return None
    done = np.cumsum(cost) / cost.sum()  # share of backward finished once each op's gradients are ready
    return float(np.clip(np.sum(params / params.sum() * (1.0 - done)), 0.0, 1.0))


def check_window(value: float, where: str) -> float:
    """``value`` as a float in [0, 1], or a ValueError naming ``where``."""
    try:
        window = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: backward window must be a number in [0, 1], not {value!r}") from None
    if not 0.0 <= window <= 1.0:
        raise ValueError(f"{where}: backward window must be in [0, 1], not {value!r}")
    return window
