"""GPU models and their MIG (Multi-Instance GPU) profiles: names, memory, slices and placements.

A MIG-capable GPU has 7 compute slices and 8 memory slices. A GPU instance of a profile takes a run of
memory slices starting at one of the profile's allowed positions (NVIDIA's placement table, as
``nvidia-smi mig -lgipp`` lists it) and its compute slices; two instances never share a memory slice,
and the compute slices of all instances add up to at most 7. The tables below are NVIDIA's published
profiles for the A100 40 GB / 80 GB, H100 80 GB and H200 141 GB (the ``+me`` media-extension profiles
are left out: they differ from their base profile only by owning the decoders).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

GIB = 1024**3
GB = 1e9


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: ``name`` as ``nvidia-smi`` prints it (``3g.40gb``)."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_bytes: float
    placements: tuple[int, ...]  # allowed first memory slice
    max_instances: int

    @property
    def compute_fraction(self) -> float:
        """The share of the GPU's SMs (7 compute slices)."""
        return self.compute_slices / 7


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: its memory and, where it has MIG, its profiles."""

    name: str
    memory_bytes: float
    mig_profiles: tuple[MigProfile, ...] = ()

    def profile(self, name: str) -> MigProfile:
        """The MIG profile ``name``; a :class:`ValueError` naming the profiles this GPU has."""
        for p in self.mig_profiles:
            if p.name == name:
                return p
        have = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG)"
        raise ValueError(f"GPU {self.name} has no MIG profile {name!r}; its profiles: {have}")


def _profiles(gb1: int, gb1_double: int, gb2: int, gb3: int, gb4: int, gb7: int,
              small_1g_max: int = 7, double_1g_max: int = 4) -> tuple[MigProfile, ...]:
    """The 6 profiles every MIG GPU has, with this model's memory sizes (GB as in the names)."""
    return (
        MigProfile(f"1g.{gb1}gb", 1, 1, gb1 * GB, (0, 1, 2, 3, 4, 5, 6), small_1g_max),
        MigProfile(f"1g.{gb1_double}gb", 1, 2, gb1_double * GB, (0, 2, 4, 6), double_1g_max),
        MigProfile(f"2g.{gb2}gb", 2, 2, gb2 * GB, (0, 2, 4), 3),
        MigProfile(f"3g.{gb3}gb", 3, 4, gb3 * GB, (0, 4), 2),
        MigProfile(f"4g.{gb4}gb", 4, 4, gb4 * GB, (0,), 1),
        MigProfile(f"7g.{gb7}gb", 7, 8, gb7 * GB, (0,), 1),
    )


GPU_MODELS: dict[str, GpuModel] = {
    "A100-40GB": GpuModel("A100-40GB", 40 * GB, _profiles(5, 10, 10, 20, 20, 40)),
    "A100-80GB": GpuModel("A100-80GB", 80 * GB, _profiles(10, 20, 20, 40, 40, 80)),
    "H100-80GB": GpuModel("H100-80GB", 80 * GB, _profiles(10, 20, 20, 40, 40, 80)),
    "H200-141GB": GpuModel("H200-141GB", 141 * GB, _profiles(18, 35, 35, 71, 71, 141)),
}
ALIASES = {"a100-40": "A100-40GB", "a100": "A100-80GB", "a100-80": "A100-80GB", "h100": "H100-80GB",
           "h100-80": "H100-80GB", "h200": "H200-141GB", "h200-141": "H200-141GB"}


def gpu_model(name: str) -> GpuModel:
    """A GPU model by name (``H100-80GB``, or a short alias such as ``h100``)."""
    key = name if name in GPU_MODELS else ALIASES.get(name.lower().replace("gb", "").strip())
    if key is None:
        raise ValueError(f"unknown GPU model {name!r}; known: {', '.join(GPU_MODELS)} "
                         f"(aliases {', '.join(ALIASES)})")
    return GPU_MODELS[key]


class MigLayout:
    """The instances placed on one MIG GPU so far; :meth:`add` places one more where NVIDIA allows it."""

    def __init__(self, model: GpuModel) -> None:
        if not model.mig_profiles:
            raise ValueError(f"GPU {model.name} has no MIG profiles")
        self.model = model
        self.used = [False] * 8  # memory slices
        self.compute = 0
        self.instances: list[tuple[MigProfile, int]] = []

    def state(self) -> tuple:
        """What :meth:`position_for` depends on: the slices in use, the compute taken and the instances of
        each profile. GPUs in the same state take the same profiles at the same positions."""
        counts = tuple(sorted(Counter(p.name for p, _ in self.instances).items()))
        return tuple(self.used), self.compute, counts

    def position_for(self, profile: MigProfile) -> int | None:
        """The first allowed position where ``profile`` fits now, or None."""
        if self.compute + profile.compute_slices > 7:
            return None
        if sum(p.name == profile.name for p, _ in self.instances) >= profile.max_instances:
            return None
        for start in profile.placements:
            span = range(start, start + profile.memory_slices)
            if span.stop <= 8 and not any(self.used[i] for i in span):
                return start
        return None

    def add(self, profile: MigProfile) -> int | None:
        """Place ``profile``; its first memory slice, or None (nothing changed) where it does not fit."""
        start = self.position_for(profile)
        if start is None:
            return None
        for i in range(start, start + profile.memory_slices):
            self.used[i] = True
        self.compute += profile.compute_slices
        self.instances.append((profile, start))
        return start


def smallest_profile(model: GpuModel, memory_bytes: float, compute_fraction: float = 0.0) -> MigProfile | None:
    """The smallest profile of ``model`` with at least ``memory_bytes`` and ``compute_fraction`` of the
    SMs (fewest memory slices, then compute slices), or None if even the whole GPU is too small."""
    fits = [p for p in model.mig_profiles
            if p.memory_bytes >= memory_bytes and p.compute_fraction >= compute_fraction - 1e-9]
    return min(fits, key=lambda p: (p.memory_slices, p.compute_slices), default=None)
