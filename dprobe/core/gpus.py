"""The GPUs dprobe has figures for, as features: memory, peak FLOP/s per precision, bandwidth, SMs, L2,
clocks; how NVML names them; and a spec file (``--gpu-spec``) for any other GPU, optionally with a
``measured:`` block (``dprobe gpu calibrate`` writes one: what the GPU reached in microbenchmarks).

Plain data without torch, so that a sidecar installed without it (`pip install dprobe`, the services)
still checks the ``gpu=`` of a job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as the roofline and the learned model see it (dense peaks, no sparsity).

    ``peak_flops_fp16`` / ``peak_flops_bf16``: tensor-core matrix FLOP/s with fp32 accumulation (what
    autocast's matmuls and convolutions get; a GPU without bf16 tensor cores has its fp32 figure there);
    ``peak_flops_tf32``: fp32 matmuls with TF32 allowed (the fp32 figure where there is no TF32);
    ``peak_flops_fp32``: vector fp32, everything else.
    """

    memory_bytes: float
    peak_flops_bf16: float
    peak_flops_tf32: float
    peak_flops_fp32: float
    bandwidth: float  # bytes/s of device memory
    peak_flops_fp16: float = 0.0  # 0: as bf16
    sm_count: int = 0  # 0: not given
    l2_bytes: float = 0.0
    boost_clock_mhz: float = 0.0
    name: str = ""
    calibration: GPUCalibration | None = None  # measured throughput (``dprobe gpu calibrate``); None: spec sheet only

    def peak_half(self, precision: str) -> float:
        """Tensor-core peak of an autocast precision: fp16's own where given, else bf16's."""
        return self.peak_flops_fp16 if precision == "fp16" and self.peak_flops_fp16 > 0 else self.peak_flops_bf16


@dataclass(frozen=True)
class GPUCalibration:
    """What a GPU reached in ``dprobe gpu calibrate``'s microbenchmarks (SI units; 0: not measured).

    ``flops_*``: dense GEMM FLOP/s per precision (``fp32`` with TF32 off, ``tf32`` with it on, ``fp16`` and
    ``bf16`` with fp32 accumulation, as autocast runs them; ``fp16_acc16`` with reduced-precision reductions
    allowed); ``bandwidth``: a large device-to-device copy (bytes read plus written per second);
    ``launch_overhead_s``: one empty kernel launch, host side; ``conv`` / ``attention``: FLOP/s of a few
    convolution and ``scaled_dot_product_attention`` shapes (name, FLOP/s); ``software``: torch and CUDA
    versions, device name, date, seconds the run took (name, text)."""

    flops_fp32: float = 0.0
    flops_tf32: float = 0.0
    flops_fp16: float = 0.0
    flops_bf16: float = 0.0
    flops_fp16_acc16: float = 0.0
    bandwidth: float = 0.0
    launch_overhead_s: float = 0.0
    conv: tuple[tuple[str, float], ...] = ()
    attention: tuple[tuple[str, float], ...] = ()
    software: tuple[tuple[str, str], ...] = ()


# Vendor data sheets (dense tensor FLOP/s, boost clock). Memory as NVML reports it where known (the measured
# figure replaces it for a collection's runs). H100/H200: "NVIDIA H100 Tensor Core GPU" and H200 data sheets
# (SXM); A100: "NVIDIA A100 Tensor Core GPU" data sheet (80GB SXM); L40S, A10, L4, T4: their product data
# sheets; RTX 3090: "NVIDIA Ampere GA102 GPU Architecture" whitepaper, appendix A (GeForce: fp16/bf16 tensor
# with fp32 accumulate at half the fp16-accumulate rate).
GPUS = {
    "h200": GPUSpec(150109880320, 989e12, 494e12, 67e12, 4.8e12, sm_count=132, l2_bytes=50 * 2**20,
                    boost_clock_mhz=1980, name="H200 SXM 141GB"),
    "h100": GPUSpec(85520809984, 989e12, 494e12, 67e12, 3.35e12, sm_count=132, l2_bytes=50 * 2**20,
                    boost_clock_mhz=1980, name="H100 SXM 80GB"),
    "a100": GPUSpec(85899345920, 312e12, 156e12, 19.5e12, 2.0e12, sm_count=108, l2_bytes=40 * 2**20,
                    boost_clock_mhz=1410, name="A100 SXM 80GB"),
    "l40s": GPUSpec(48305799168, 362e12, 183e12, 91.6e12, 864e9, sm_count=142, l2_bytes=96 * 2**20,
                    boost_clock_mhz=2520, name="L40S"),
    "a10": GPUSpec(24146608128, 125e12, 62.5e12, 31.2e12, 600e9, sm_count=72, l2_bytes=6 * 2**20,
                   boost_clock_mhz=1695, name="A10"),
    "l4": GPUSpec(24152899584, 121e12, 60e12, 30.3e12, 300e9, sm_count=58, l2_bytes=48 * 2**20,
                  boost_clock_mhz=2040, name="L4"),
    "rtx3090": GPUSpec(25769803776, 71e12, 35.6e12, 35.6e12, 936e9, peak_flops_fp16=71e12, sm_count=82,
                       l2_bytes=6 * 2**20, boost_clock_mhz=1695, name="GeForce RTX 3090"),
    # "NVIDIA Ada GPU Architecture" whitepaper, appendix A (fp16/bf16 tensor with fp32 accumulate, dense)
    "rtx4090": GPUSpec(25757220864, 165.2e12, 82.6e12, 82.6e12, 1008e9, peak_flops_fp16=165.2e12, sm_count=128,
                       l2_bytes=72 * 2**20, boost_clock_mhz=2520, name="GeForce RTX 4090"),
    # "NVIDIA RTX Blackwell GPU Architecture" whitepaper, appendix A (as the 4090's)
    "rtx5090": GPUSpec(34190917632, 209.5e12, 104.8e12, 104.8e12, 1792e9, peak_flops_fp16=209.5e12, sm_count=170,
                       l2_bytes=96 * 2**20, boost_clock_mhz=2407, name="GeForce RTX 5090"),
    # Turing: no TF32, no bf16 tensor cores (their fp32 figure stands in)
    "t4": GPUSpec(16106127360, 8.1e12, 8.1e12, 8.1e12, 320e9, peak_flops_fp16=65e12, sm_count=40,
                  l2_bytes=4 * 2**20, boost_clock_mhz=1590, name="T4"),
}
# NVML / CUDA device names that do not carry the key as a word ("NVIDIA GeForce RTX 3090" -> rtx3090)
ALIASES = {("rtx", "3090"): "rtx3090", ("rtx", "4090"): "rtx4090", ("rtx", "5090"): "rtx5090"}

# --gpu-spec FILE: field -> (unit factor to GPUSpec's, plausible range in the file's unit, required)
SPEC_FIELDS: dict[str, tuple[str, float, tuple[float, float], bool]] = {
    "memory_gib": ("memory_bytes", GIB, (1, 2048), True),
    "fp32_tflops": ("peak_flops_fp32", 1e12, (0.5, 1000), True),
    "tf32_tflops": ("peak_flops_tf32", 1e12, (0.5, 5000), False),
    "bf16_tflops": ("peak_flops_bf16", 1e12, (0.5, 20000), False),
    "fp16_tflops": ("peak_flops_fp16", 1e12, (0.5, 20000), True),
    "bandwidth_gbps": ("bandwidth", 1e9, (50, 100000), True),
    "sm_count": ("sm_count", 1, (1, 2000), True),
    "l2_mib": ("l2_bytes", 2**20, (0.25, 4096), True),
    "boost_clock_mhz": ("boost_clock_mhz", 1, (300, 5000), True),
}


# the measured: block: field -> (GPUCalibration's attribute, unit factor, plausible range, required); a measured
# figure may be far below a spec sheet's (a throttled card, a CPU in tests), so the lower bounds only refuse 0
MEASURED_FIELDS: dict[str, tuple[str, float, tuple[float, float], bool]] = {
    "fp32_tflops": ("flops_fp32", 1e12, (1e-6, 1000), True),
    "tf32_tflops": ("flops_tf32", 1e12, (1e-6, 5000), False),
    "fp16_tflops": ("flops_fp16", 1e12, (1e-6, 20000), True),
    "bf16_tflops": ("flops_bf16", 1e12, (1e-6, 20000), False),
    "fp16_acc16_tflops": ("flops_fp16_acc16", 1e12, (1e-6, 40000), False),
    "bandwidth_gbps": ("bandwidth", 1e9, (1e-3, 100000), True),
    "launch_overhead_us": ("launch_overhead_s", 1e-6, (0.1, 10000), False),
}
MEASURED_TABLES = ("conv", "attention")  # name -> TFLOP/s each
MEASURED_TEXT = ("device", "torch", "cuda", "date", "seconds")  # recorded as given (text)
MEASURED_INFO = ("fraction_of_peak",)  # derived (measured / spec sheet): written for people, not read


class GPUSpecError(ValueError):
    """A GPU spec file that is missing a field, has an unknown one, or one out of the plausible range."""


def load_gpu_spec(path: str | Path) -> GPUSpec:
    """A GPU spec from a YAML or JSON file: ``name``, ``memory_gib``, ``fp32_tflops``, ``fp16_tflops``
    (tensor, dense, fp32 accumulate), ``bandwidth_gbps`` (GB/s), ``sm_count``, ``l2_mib``,
    ``boost_clock_mhz``; optional ``tf32_tflops`` (default fp32's: no TF32), ``bf16_tflops`` (default
    fp32's: no bf16 tensor cores) and ``aliases`` (other names of the GPU, e.g. as NVML gives it). A
    :class:`GPUSpecError` names a missing, unknown or implausible field."""
    return gpu_spec_from_dict(read_gpu_spec_data(path), str(path))


def read_gpu_spec_data(path: str | Path) -> Any:
    """A spec file as parsed (YAML, or JSON by its suffix), not yet checked; a :class:`GPUSpecError` naming the
    file when it cannot be read or parsed."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GPUSpecError(f"{path}: cannot read the GPU spec ({exc.strerror or exc})") from exc
    try:
        return json.loads(text) if path.suffix.lower() == ".json" else _yaml(text)
    except ValueError as exc:
        raise GPUSpecError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} ({exc})") from exc


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).splitlines()[0]) from exc


def gpu_spec_from_dict(data: Any, where: str = "GPU spec") -> GPUSpec:
    """:func:`load_gpu_spec` of parsed data (``where`` names it in errors)."""
    if not isinstance(data, dict):
        raise GPUSpecError(f"{where}: a GPU spec is a mapping of fields ({', '.join(SPEC_FIELDS)}), "
                           f"not {type(data).__name__}")
    unknown = sorted(set(data) - set(SPEC_FIELDS) - {"name", "aliases", "measured"})
    if unknown:
        raise GPUSpecError(f"{where}: unknown field {unknown[0]!r} (fields: name, aliases, {', '.join(SPEC_FIELDS)}, "
                           "measured)")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise GPUSpecError(f"{where}: field 'name' missing or empty (the GPU's name, e.g. 'RTX 4090')")
    spec_aliases(data, where)
    values: dict[str, Any] = {}
    for key, (attr, unit, (low, high), required) in SPEC_FIELDS.items():
        if key not in data:
            if required:
                raise GPUSpecError(f"{where}: field {key!r} missing")
            continue
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise GPUSpecError(f"{where}: field {key!r} must be a number, not {v!r}")
        if not low <= v <= high:
            raise GPUSpecError(f"{where}: field {key!r} = {v:g} is implausible (expected {low:g} to {high:g})")
        values[attr] = v * unit
    values.setdefault("peak_flops_tf32", values["peak_flops_fp32"])
    values.setdefault("peak_flops_bf16", values["peak_flops_fp32"])
    if values["peak_flops_fp16"] < values["peak_flops_fp32"]:
        raise GPUSpecError(f"{where}: field 'fp16_tflops' ({data['fp16_tflops']:g}) is below 'fp32_tflops' "
                           f"({data['fp32_tflops']:g}): give the tensor-core figure")
    values["sm_count"] = int(values["sm_count"])
    calibration = calibration_from_dict(data["measured"], where) if "measured" in data else None
    return GPUSpec(**values, name=name.strip(), calibration=calibration)


def spec_aliases(data: Mapping[str, Any], where: str = "GPU spec") -> tuple[str, ...]:
    """The ``aliases`` of a spec file's data (other names of its GPU: how NVML or dcgm-exporter name it);
    a :class:`GPUSpecError` unless a list of non-empty names."""
    aliases = data.get("aliases", [])
    if isinstance(aliases, str) or not isinstance(aliases, list) or not all(
            isinstance(a, str) and a.strip() for a in aliases):
        raise GPUSpecError(f"{where}: field 'aliases' must be a list of names (e.g. ['NVIDIA A40']), "
                           f"not {aliases!r}")
    return tuple(a.strip() for a in aliases)


def _number(v: Any, field: str, low: float, high: float, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise GPUSpecError(f"{where}: field {field!r} must be a number, not {v!r}")
    if not low <= v <= high:
        raise GPUSpecError(f"{where}: field {field!r} = {v:g} is implausible (expected {low:g} to {high:g})")
    return float(v)


def calibration_from_dict(data: Any, where: str = "GPU spec") -> GPUCalibration:
    """The ``measured:`` block of a spec file (``dprobe gpu calibrate``'s output) as a :class:`GPUCalibration`;
    a :class:`GPUSpecError` names a missing, unknown or implausible field (``measured.FIELD``)."""
    if not isinstance(data, dict):
        raise GPUSpecError(f"{where}: field 'measured' is a mapping of measured figures "
                           f"({', '.join(MEASURED_FIELDS)}), not {type(data).__name__}")
    known = set(MEASURED_FIELDS) | set(MEASURED_TABLES) | set(MEASURED_TEXT) | set(MEASURED_INFO)
    unknown = sorted(set(data) - known)
    if unknown:
        raise GPUSpecError(f"{where}: unknown field 'measured.{unknown[0]}' (fields: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for key, (attr, unit, (low, high), required) in MEASURED_FIELDS.items():
        if key not in data:
            if required:
                raise GPUSpecError(f"{where}: field 'measured.{key}' missing")
            continue
        values[attr] = _number(data[key], f"measured.{key}", low, high, where) * unit
    for key in MEASURED_TABLES:
        table = data.get(key) or {}
        if not isinstance(table, dict):
            raise GPUSpecError(f"{where}: field 'measured.{key}' is a mapping of shape -> TFLOP/s")
        values[key] = tuple((str(k), _number(v, f"measured.{key}.{k}", 0.0, 40000, where) * 1e12)
                            for k, v in table.items())
    for key in MEASURED_INFO:
        if key in data and not isinstance(data[key], dict):
            raise GPUSpecError(f"{where}: field 'measured.{key}' is a mapping of figure -> share")
    values["software"] = tuple((k, str(data[k])) for k in MEASURED_TEXT if data.get(k) is not None)
    return GPUCalibration(**values)


def calibration_as_dict(cal: GPUCalibration) -> dict[str, Any]:
    """A calibration as the ``measured:`` block writes it (the file's units; what
    :func:`calibration_from_dict` reads back)."""
    out: dict[str, Any] = {}
    for key, (attr, unit, _, _) in MEASURED_FIELDS.items():
        v = getattr(cal, attr)
        if v > 0:
            out[key] = float(f"{v / unit:.5g}")
    for key in MEASURED_TABLES:
        if getattr(cal, key):
            out[key] = {k: float(f"{v / 1e12:.5g}") for k, v in getattr(cal, key)}
    out.update(dict(cal.software))
    return out


def measured_spec(spec: GPUSpec) -> GPUSpec:
    """``spec`` with its peaks replaced by what its calibration measured (the roofline of a calibrated GPU):
    GEMM FLOP/s per precision and the copy's bandwidth; a figure not measured keeps the spec sheet's. The
    spec itself where there is no calibration."""
    cal = spec.calibration
    if cal is None:
        return spec
    half = cal.flops_fp16 or spec.peak_half("fp16")
    return replace(spec, peak_flops_fp32=cal.flops_fp32 or spec.peak_flops_fp32,
                   peak_flops_tf32=cal.flops_tf32 or spec.peak_flops_tf32,
                   peak_flops_bf16=cal.flops_bf16 or spec.peak_flops_bf16, peak_flops_fp16=half,
                   bandwidth=cal.bandwidth or spec.bandwidth)


def fractions_of_peak(spec: GPUSpec, cal: GPUCalibration) -> dict[str, float]:
    """Measured over the spec sheet's figure, per figure measured (what ``measured.fraction_of_peak`` says)."""
    pairs = {"fp32": (cal.flops_fp32, spec.peak_flops_fp32), "tf32": (cal.flops_tf32, spec.peak_flops_tf32),
             "fp16": (cal.flops_fp16, spec.peak_half("fp16")), "bf16": (cal.flops_bf16, spec.peak_flops_bf16),
             "bandwidth": (cal.bandwidth, spec.bandwidth)}
    return {k: round(m / s, 4) for k, (m, s) in pairs.items() if m > 0 and s > 0}


def spec_as_dict(spec: GPUSpec) -> dict[str, Any]:
    """A spec as the prediction's JSON shows it (``--gpu-spec``'s fields and units)."""
    out: dict[str, Any] = {"name": spec.name}
    for key, (attr, unit, _, _) in SPEC_FIELDS.items():
        v = getattr(spec, attr) if attr != "peak_flops_fp16" else spec.peak_half("fp16")
        out[key] = round(v / unit, 3)
    if spec.calibration is not None:
        out["measured"] = calibration_as_dict(spec.calibration)
    return out


def gpu_key(device_name: str) -> str:
    """The ``GPUS`` key of a device as CUDA / NVML names it ("NVIDIA H100 80GB HBM3" -> "h100")."""
    name = device_name.lower()
    words = name.replace("-", " ").split()
    for key in GPUS:
        if key in words:
            return key
    for alias, key in ALIASES.items():
        if all(w in words for w in alias):
            return key
    raise ValueError(f"dprobe has no peak FLOP/s and bandwidth for the GPU {device_name!r} (it knows "
                     f"{', '.join(k.upper() for k in GPUS)}); add a GPUSpec for it to "
                     "dprobe.core.gpus.GPUS, or predict with --gpu-spec FILE")


def gpu_spec(device_name: str, memory_bytes: float | None = None) -> GPUSpec:
    """The spec of a device by name; ``memory_bytes`` (as measured) replaces the model's nominal memory."""
    spec = GPUS[gpu_key(device_name)]
    if memory_bytes is not None and math.isfinite(memory_bytes) and memory_bytes > 0:
        spec = replace(spec, memory_bytes=float(memory_bytes))
    return spec


# NVIDIA architectures, oldest first, and the words of a GPU's name that mark each one (a name is matched
# word by word, lower case; "rtx 3090" -> ampere). Used where a model knows which architectures it was fitted on.
GENERATIONS: dict[str, tuple[str, ...]] = {
    "kepler": ("k80", "k40", "k20", "gk210", "gk110"),
    "maxwell": ("m40", "m60", "m4", "m10"),
    "pascal": ("p100", "p40", "p4", "p6", "1080", "1070", "1060", "1080ti", "titan xp"),
    "volta": ("v100", "v100s", "titan v"),
    "turing": ("t4", "2080", "2070", "2060", "2080ti", "titan rtx", "quadro rtx"),
    "ampere": ("a100", "a40", "a30", "a10", "a16", "a2", "3090", "3080", "3070", "3060", "3090ti", "a6000",
               "a5000", "a4000"),
    "ada": ("l40s", "l40", "l4", "4090", "4080", "4070", "4060", "6000 ada"),
    "hopper": ("h100", "h200", "h800", "gh200"),
    "blackwell": ("b100", "b200", "gb200", "b300", "5090", "5080", "5070", "rtx pro 6000"),
}


def generation(name: str) -> str:
    """The architecture of a GPU by its name ("Tesla V100 SXM2 16GB" -> "volta", "RTX 3090" -> "ampere");
    "unknown" where no word of the name marks one."""
    text = " " + " ".join(name.lower().replace("-", " ").replace("_", " ").split()) + " "
    for arch, marks in reversed(GENERATIONS.items()):  # newest first: "rtx pro 6000" before "a6000"
        if any(f" {m} " in text for m in marks):
            return arch
    return "unknown"


__all__ = ["GENERATIONS", "GPUS", "MEASURED_FIELDS", "GPUCalibration", "GPUSpec", "GPUSpecError",
           "calibration_as_dict", "calibration_from_dict", "fractions_of_peak", "generation", "gpu_key",
           "gpu_spec", "gpu_spec_from_dict", "load_gpu_spec", "measured_spec", "read_gpu_spec_data", "spec_aliases",
           "spec_as_dict"]
