"""Where a data-parallel job's GPUs are: how many on each node, from ``--gpus`` with ``--nodes`` or
``--placement`` (one digit per node, e.g. ``1122`` = 6 GPUs on 4 nodes)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Placement:
    """GPUs used on each node (every node at least one)."""

    per_node: tuple[int, ...]

    @property
    def gpus(self) -> int:
        return sum(self.per_node)

    @property
    def nodes(self) -> int:
        return len(self.per_node)

    @property
    def busiest(self) -> int:
        """GPUs on the node that has the most."""
        return max(self.per_node)

    def __str__(self) -> str:
        return "".join(map(str, self.per_node)) if self.busiest <= 9 else "+".join(map(str, self.per_node))


def parse_placement(text: str) -> Placement:
    """``"1122"`` (one digit 1-9 per node) or ``"8+8+4"`` (a count per node, ``+`` between them)."""
    raw = str(text).strip()
    parts = raw.split("+") if "+" in raw else list(raw)
    if not raw or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--placement must be one digit per node (e.g. 1122) or counts joined by + (8+8+4), "
                         f"not {text!r}")
    counts = tuple(int(p) for p in parts)
    if min(counts) < 1:
        raise ValueError(f"--placement {text!r} has a node with 0 GPUs: list only the nodes the job uses")
    return Placement(counts)


def spread(gpus: int, nodes: int) -> Placement:
    """``gpus`` dealt as evenly as can be over ``nodes`` (the first nodes take the remainder)."""
    base, extra = divmod(gpus, nodes)
    return Placement(tuple(base + (i < extra) for i in range(nodes)))


def packed(gpus: int, gpus_per_node: int) -> Placement:
    """``gpus`` on as few nodes of ``gpus_per_node`` as hold them, dealt evenly over those nodes."""
    return spread(gpus, -(-gpus // gpus_per_node))


def resolve_placement(gpus: int, nodes: int | None = None, placement: str | None = None,
                      gpus_per_node: int | None = None) -> Placement:
    """The job's placement from what the user gave; a ValueError naming the option for one that cannot be:
    ``--gpus`` below 1, ``--nodes`` below 1 or more than the GPUs, more GPUs than the nodes hold
    (``--gpus-per-node``), a placement whose GPUs do not add up to ``--gpus`` or with a node over
    ``--gpus-per-node``, ``--nodes`` that disagrees with the placement. Without ``--nodes`` or
    ``--placement`` the GPUs are packed onto as few nodes as hold them."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus must be >= 1, not {gpus}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node must be >= 1, not {gpus_per_node}")
    per_node = gpus_per_node or DEFAULT_GPUS_PER_NODE
    if placement is not None:
        where = parse_placement(placement)
        if where.gpus != gpus:
            raise ValueError(f"--placement {placement} puts {where.gpus} GPUs on {where.nodes} nodes, but --gpus "
                             f"is {gpus}: its digits must add up to --gpus")
        if nodes is not None and nodes != where.nodes:
            raise ValueError(f"--nodes {nodes} disagrees with --placement {placement} ({where.nodes} nodes)")
        if gpus_per_node is not None and where.busiest > gpus_per_node:
            raise ValueError(f"--placement {placement} puts {where.busiest} GPUs on one node, more than "
                             f"--gpus-per-node {gpus_per_node}")
        return where
    if nodes is None:
        return packed(gpus, per_node)
    if nodes < 1:
        raise ValueError(f"--nodes must be >= 1, not {nodes}")
    if nodes > gpus:
        raise ValueError(f"--nodes {nodes} is more than --gpus {gpus}: every node needs at least one GPU")
    if gpus > nodes * per_node:
        raise ValueError(f"--gpus {gpus} do not fit on --nodes {nodes} of {per_node} GPUs each "
                         f"(--gpus-per-node); give more --nodes or a --placement")
    return spread(gpus, nodes)
