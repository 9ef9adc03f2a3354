"""The GPU the scaler's sharing plans for, from a GPU spec file (``sharing_gpu_spec_file``): the file
``dprobe gpu calibrate`` writes, or a spec sheet as ``dprobe predict --gpu-spec`` reads it. Its name and
memory make the :class:`~dprobe.sharing.mig.GpuModel`; where its GPU is one of the MIG-capable models
(by its name, aliases or the device it was calibrated on, and its memory), that model's MIG profiles too.
"""

from __future__ import annotations

from dprobe.core.gpu_registry import read_spec_file
from dprobe.core.gpus import gpu_key
from dprobe.sharing.mig import GPU_MODELS, GpuModel

MIG_MEMORY_SPREAD = 0.1  # a spec's memory (as NVML reports it) within 10 % of a MIG model's nominal memory


def _mig_model(names: list[str], memory_bytes: float) -> GpuModel | None:
    """The MIG-capable model of a GPU: one of the same kind (``gpu_key`` of one of its names) whose nominal
    memory is nearest ``memory_bytes``, within :data:`MIG_MEMORY_SPREAD`; None where there is none."""
    kinds = set()
    for name in names:
        try:
            kinds.add(gpu_key(name))
        except ValueError:
            continue
    near = [m for key, m in GPU_MODELS.items() if key.split("-")[0].lower() in kinds
            and abs(m.memory_bytes - memory_bytes) <= MIG_MEMORY_SPREAD * m.memory_bytes]
    return min(near, key=lambda m: abs(m.memory_bytes - memory_bytes)) if near else None


def gpu_from_spec_file(path: str, gpu_model: str = "", memory_bytes: float = 0.0) -> GpuModel:
    """The GPU of the spec file ``path``; a :class:`ValueError` naming the option for a bad file (the file and
    the field: :func:`~dprobe.core.gpu_registry.read_spec_file`), a ``sharing_gpu_model`` given too, or a
    ``sharing_gpu_memory_bytes`` more than 1 % off the file's memory."""
    if gpu_model:
        raise ValueError(f"sharing_gpu_spec_file {path} and sharing_gpu_model {gpu_model!r} both name the GPU: "
                         "give one of them")
    try:
        found = read_spec_file(path)
    except ValueError as exc:
        raise ValueError(f"sharing_gpu_spec_file: {exc}") from None
    spec = found.spec
    if memory_bytes and abs(memory_bytes - spec.memory_bytes) > 0.01 * spec.memory_bytes:
        raise ValueError(f"sharing_gpu_memory_bytes {memory_bytes:g} contradicts sharing_gpu_spec_file {path} "
                         f"({spec.name}: {spec.memory_bytes:g} bytes): give one of them")
    mig = _mig_model(["-".join(words) for words in found.names], spec.memory_bytes)
    return GpuModel(spec.name, float(spec.memory_bytes), mig.mig_profiles if mig else ())


__all__ = ["gpu_from_spec_file"]
