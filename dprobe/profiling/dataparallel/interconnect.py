"""The links a data-parallel job's gradient all-reduce crosses: one inside a node (``intra``), one between
nodes (``inter``), each a named preset with its nominal bandwidth (``dprobe predict --interconnect``).

A ring all-reduce moves its bytes over one link per GPU, so a preset's bandwidth is that of one such link in
one direction: a GPU's PCIe slot or its NVLink ports inside a node, a node's network port between nodes.
Measured clusters reach only part of it (NCCL over TCP sockets, copies through the host, contention with
backward): :mod:`.fit` learns what each measured cluster reaches, and a cluster never measured gets its
nominal bandwidth times the efficiency the measured ones reach on that side (:func:`.predict.cluster_params`).
"""

from __future__ import annotations

from dataclasses import dataclass

GBIT = 1e9 / 8  # bytes per second of one Gb/s


@dataclass(frozen=True)
class Link:
    """A named link and its nominal bandwidth (bytes per second, one direction)."""

    name: str
    bandwidth: float
    what: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "nominal_bytes_per_second": self.bandwidth, "what": self.what}


INTRA_LINKS: dict[str, Link] = {link.name: link for link in (
    Link("pcie3", 15.75e9, "PCIe 3.0 x16 (through the host)"),
    Link("pcie4", 31.5e9, "PCIe 4.0 x16"),
    Link("pcie5", 63.0e9, "PCIe 5.0 x16"),
    Link("nvlink2", 150e9, "NVLink 2 (V100 SXM2: 6 links of 25 GB/s)"),
    Link("nvlink3", 300e9, "NVLink 3 (A100 SXM: 12 links of 25 GB/s)"),
    Link("nvlink4", 450e9, "NVLink 4 (H100 / H200 SXM: 18 links of 25 GB/s)"),
)}
INTER_LINKS: dict[str, Link] = {link.name: link for link in (
    *(Link(f"ethernet-{g}g", g * GBIT, f"{g} Gb/s Ethernet") for g in (10, 25, 50, 100, 200, 400)),
    Link("infiniband-edr", 100 * GBIT, "InfiniBand EDR, 100 Gb/s"),
    Link("infiniband-hdr", 200 * GBIT, "InfiniBand HDR, 200 Gb/s"),
    Link("infiniband-ndr", 400 * GBIT, "InfiniBand NDR, 400 Gb/s"),
)}
ALIASES = {"pcie": "pcie4", "nvlink": "nvlink4", "infiniband": "infiniband-ndr", "ib": "infiniband-ndr",
           "ethernet": "ethernet-100g"}

# the links of each --gpu's usual server: SXM parts on NVLink with InfiniBand, PCIe cards with Ethernet; the
# T4's are the Pollux testbed's (AWS g4dn.12xlarge: PCIe 3.0, 50 Gb/s), the cluster the shipped fit measured
DEFAULT_LINKS: dict[str, tuple[str, str]] = {
    "h200": ("nvlink4", "infiniband-ndr"), "h100": ("nvlink4", "infiniband-ndr"),
    "a100": ("nvlink3", "infiniband-hdr"), "l40s": ("pcie4", "ethernet-100g"), "a10": ("pcie4", "ethernet-25g"),
    "l4": ("pcie4", "ethernet-25g"), "rtx3090": ("pcie4", "ethernet-10g"),
    "rtx4090": ("pcie4", "ethernet-10g"), "rtx5090": ("pcie5", "ethernet-10g"), "t4": ("pcie3", "ethernet-50g"),
}
FALLBACK_LINKS = ("pcie4", "ethernet-25g")  # a --gpu-spec GPU without a default of its own

# the measured clusters (the fit's data): their GPU and links. pollux-placements: AWS g4dn.12xlarge, 4 T4 on
# PCIe 3.0, 50 Gb/s Ethernet. gavel-colocation: servers of 8 K80, P100 or V100 (Gavel's paper: K80 and P100
# on PCIe, V100 SXM2 on NVLink); its spread-out ("unconsolidated") runs put one GPU on each server, over a
# network the paper does not give: taken as 10 Gb/s Ethernet (its all-reduces reach 0.8-1.1 GB/s, which a
# 10 Gb/s link allows)
MEASURED: dict[str, tuple[str, str, str]] = {
    "pollux-t4": ("t4", "pcie3", "ethernet-50g"),
    "gavel-k80": ("k80", "pcie3", "ethernet-10g"),
    "gavel-p100": ("p100", "pcie3", "ethernet-10g"),
    "gavel-v100": ("v100", "nvlink2", "ethernet-10g"),
}


@dataclass(frozen=True)
class Interconnect:
    """The two links of a job's all-reduce, where they came from, and the measured cluster they are, if any."""

    intra: Link
    inter: Link
    source: str  # "--interconnect" or "default for GPU"
    measured: str | None = None  # a key of MEASURED whose fitted links apply

    def as_dict(self) -> dict[str, object]:
        return {"intra": self.intra.as_dict(), "inter": self.inter.as_dict(), "from": self.source,
                "calibrated_on": self.measured}


def _link(name: str, table: dict[str, Link], side: str) -> Link:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in table:
        return table[key]
    try:
        gbps = float(key)
    except ValueError:
        raise ValueError(f"--interconnect: unknown {side} link {name!r}: one of {', '.join(table)} "
                         f"(or {', '.join(a for a, k in ALIASES.items() if k in table)}), a number of Gb/s, or a "
                         f"measured cluster alone ({', '.join(MEASURED)})") from None
    if not 0 < gbps < float("inf"):
        raise ValueError(f"--interconnect: a {side} link of {name!r} Gb/s is not a positive bandwidth")
    return Link(f"{gbps:g}gbps", gbps * GBIT, f"{gbps:g} Gb/s ({side}, given as a number)")


def resolve_interconnect(spec: str | None, gpu: object = None, clusters: tuple[str, ...] = ()) -> Interconnect:
    """The links from ``--interconnect INTRA[,INTER]`` (presets or numbers of Gb/s; an INTER left out keeps
    the GPU's default), else the defaults of ``gpu`` (a ``--gpu`` key; any other GPU: :data:`FALLBACK_LINKS`).
    A T4 on its default links is the measured Pollux cluster (``measured``); so is any measured cluster named
    outright (``--interconnect gavel-v100``: its links and fitted parameters, whatever the GPU), or any other
    fitted cluster of ``clusters`` (one refitted from ``--data``)."""
    key = gpu if isinstance(gpu, str) else None
    if spec is not None and spec.strip() in (*MEASURED, *clusters):
        name = spec.strip()
        intra, inter = measured_links(name) if name in MEASURED else (fitted_link(name), fitted_link(name))
        return Interconnect(intra, inter, "--interconnect", name)
    intra_name, inter_name = DEFAULT_LINKS.get(key or "", FALLBACK_LINKS)
    source = f"default for {key}" if key in DEFAULT_LINKS else "default (GPU without defaults)"
    if spec is not None:
        parts = [p for p in str(spec).split(",")]
        if not 1 <= len(parts) <= 2 or not all(p.strip() for p in parts):
            raise ValueError(f"--interconnect wants INTRA or INTRA,INTER (e.g. nvlink4,infiniband-ndr), not {spec!r}")
        intra_name = parts[0]
        inter_name = parts[1] if len(parts) == 2 else inter_name
        source = "--interconnect"
    intra, inter = _link(intra_name, INTRA_LINKS, "intra-node"), _link(inter_name, INTER_LINKS, "inter-node")
    measured = next((name for name, (g, i, o) in MEASURED.items()
                     if g == key and (i, o) == (intra.name, inter.name)), None)
    return Interconnect(intra, inter, source, measured)


def fitted_link(cluster: str) -> Link:
    """A placeholder for the links of a cluster fitted from measured steps, whose nominal bandwidth is unknown."""
    return Link(cluster, 0.0, "a cluster fitted from its measured steps (nominal bandwidth not known)")


def measured_links(cluster: str) -> tuple[Link, Link]:
    """The (intra, inter) links of a measured cluster (a key of :data:`MEASURED`)."""
    _, intra, inter = MEASURED[cluster]
    return INTRA_LINKS[intra], INTER_LINKS[inter]
