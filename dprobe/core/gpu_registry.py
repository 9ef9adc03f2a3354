"""GPUs known from spec files (``dprobe gpu calibrate``'s output or a hand-written spec sheet, the files
``dprobe predict --gpu-spec`` reads), beside the built-in table: what the services read so that a GPU
missing from :data:`~dprobe.core.gpus.GPUS`, or one calibrated on its node, is predicted with its own
figures.

A spec file's GPU is named by its ``name``, its ``aliases`` and, for a calibrated file, the device the
calibration ran on (``measured.device``, the name CUDA and NVML give it); names are compared case-blind,
with ``-``, ``_`` and spaces alike and the vendor's word ("NVIDIA") left out. Plain data without torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dprobe.core.gpus import GPUSpec, GPUSpecError, gpu_spec_from_dict, read_gpu_spec_data, spec_aliases

SUFFIXES = (".yaml", ".yml", ".json")  # the files of a directory that are read
VENDOR_WORDS = frozenset({"nvidia"})  # left out of a name: "NVIDIA L4" and "L4" are one GPU


def gpu_words(name: str) -> tuple[str, ...]:
    """The words a GPU name is compared by ("NVIDIA GeForce RTX-4090" -> ("geforce", "rtx", "4090"))."""
    words = name.lower().replace("-", " ").replace("_", " ").split()
    return tuple(w for w in words if w not in VENDOR_WORDS)


def gpu_name_key(name: str) -> str:
    """A GPU name as a job's ``gpu=`` gives it ("NVIDIA GeForce RTX 4090" -> "geforce-rtx-4090")."""
    return "-".join(gpu_words(name))


@dataclass(frozen=True)
class SpecFile:
    """One GPU spec file: ``key`` (its name as ``gpu=`` gives it), the file, its spec and the data it was read
    from (what a child process builds the spec from again, with the same function)."""

    key: str
    path: str
    spec: GPUSpec
    data: Mapping[str, Any] = field(compare=False)
    names: tuple[tuple[str, ...], ...] = ()  # the words of each name it is matched by

    @property
    def calibrated(self) -> bool:
        """Whether the file carries measured figures (``dprobe gpu calibrate``'s ``measured:`` block)."""
        return self.spec.calibration is not None


def _spec_paths(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Each path given, a directory's spec files in name order (hidden entries, such as a ConfigMap
    volume's ``..data``, left out)."""
    for given in paths:
        path = Path(given)
        if path.is_dir():
            yield from sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES
                              and not p.name.startswith(".") and p.is_file())
        else:
            yield path


def read_spec_file(path: str | Path) -> SpecFile:
    """One spec file, checked as ``dprobe predict --gpu-spec`` checks it; a :class:`GPUSpecError` naming the file
    and the field."""
    # as JSON holds it (a YAML date as its text, as the spec records it): what a child process is handed
    data = json.loads(json.dumps(read_gpu_spec_data(path), default=str))
    spec = gpu_spec_from_dict(data, str(path))
    device = dict(spec.calibration.software).get("device", "") if spec.calibration is not None else ""
    names = [spec.name, *spec_aliases(data, str(path)), *([device] if device else [])]
    words = tuple(dict.fromkeys(w for w in map(gpu_words, names) if w))
    return SpecFile(gpu_name_key(spec.name), str(path), spec, data, words)


class GPUSpecFiles:
    """The GPUs of spec files: found by a job's ``gpu=`` (:meth:`get`) or by the name a device goes by
    (:meth:`match`). Two files may not give one name."""

    def __init__(self, files: Iterable[SpecFile] = ()) -> None:
        self.files = tuple({f.path: f for f in files}.values())  # a file given twice is read once
        self._by_name: dict[str, SpecFile] = {}
        for f in self.files:
            for words in f.names:
                key = "-".join(words)
                other = self._by_name.setdefault(key, f)
                if other is not f:
                    raise GPUSpecError(f"{f.path}: the GPU name {key!r} is given by {other.path} too; "
                                       "give each GPU one spec file")

    @staticmethod
    def load(paths: Iterable[str | Path]) -> GPUSpecFiles:
        """The spec files at ``paths`` (files, or directories whose ``*.yaml``, ``*.yml`` and ``*.json`` are
        read); the first :class:`GPUSpecError` names the file and the field."""
        return GPUSpecFiles(read_spec_file(p) for p in _spec_paths(paths))

    def __bool__(self) -> bool:
        return bool(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[SpecFile]:
        return iter(self.files)

    @property
    def keys(self) -> tuple[str, ...]:
        """The ``gpu=`` name of each file's GPU."""
        return tuple(f.key for f in self.files)

    def get(self, name: str) -> SpecFile | None:
        """The file of the GPU a job's ``gpu=`` names (its name or an alias, in any case and spelling);
        None when no file gives that name."""
        return self._by_name.get(gpu_name_key(name)) if name else None

    def match(self, device_name: str) -> SpecFile | None:
        """The file of a device as NVML or dcgm-exporter names it: one giving exactly that name, else the one
        whose name's words are all among the device's (the most words first: "RTX 4080 SUPER" before
        "RTX 4080"); None when there is none."""
        words = gpu_words(device_name)
        if not words:
            return None
        exact = self._by_name.get("-".join(words))
        if exact is not None:
            return exact
        best: tuple[int, SpecFile] | None = None
        for f in self.files:
            for name in f.names:
                if set(name) <= set(words) and (best is None or len(name) > best[0]):
                    best = (len(name), f)
        return best[1] if best else None


__all__ = ["GPUSpecFiles", "SpecFile", "gpu_name_key", "gpu_words", "read_spec_file"]
