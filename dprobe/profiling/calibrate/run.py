"""The calibration suite: what is timed, within what budget, and the spec document it writes.

:func:`calibrate` runs a :class:`Suite` through a device layer (:mod:`dprobe.profiling.calibrate.device`) and
returns a :class:`Calibration`: the best GEMM FLOP/s per precision over the suite's sizes, the copy's
bandwidth, the launch overhead, and each convolution's and attention shape's FLOP/s.
:func:`spec_document` turns it into a ``--gpu-spec`` document (the spec sheet's fields, from the GPU's entry
in :data:`~dprobe.core.gpus.GPUS`, a spec-sheet file or, failing both, the measured figures themselves, plus
the ``measured:`` block), which :func:`~dprobe.core.gpus.gpu_spec_from_dict` reads back.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dprobe.core.gpus import (
    GIB,
    GPUS,
    GPUCalibration,
    GPUSpec,
    calibration_as_dict,
    fractions_of_peak,
    gpu_key,
    gpu_spec_from_dict,
    spec_as_dict,
)
from dprobe.profiling.calibrate.device import PRECISIONS, AttentionShape, ConvShape, DeviceInfo, DeviceLayer

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Suite:
    """What is timed: GEMM sides per precision (the best rate over them counts), the copy's size in bytes,
    the number of launches, the convolution and attention shapes (in fp16, as autocast runs them), and how
    long one timed batch of calls should last (its calls' count follows from one call's time)."""

    matmul_sizes: tuple[int, ...] = (2048, 4096, 8192)
    copy_bytes: int = 1 << 30
    launches: int = 2000
    convs: tuple[ConvShape, ...] = (
        ConvShape("3x3 c256 56px b64", 64, 256, 256, 56, 3),
        ConvShape("1x1 c1024 14px b128", 128, 1024, 1024, 14, 1),
        ConvShape("3x3 depthwise c512 28px b128", 128, 512, 512, 28, 3, groups=512),
    )
    attentions: tuple[AttentionShape, ...] = (
        AttentionShape("b32 h12 s1024 d64", 32, 12, 1024, 64),
        AttentionShape("b8 h16 s4096 d128 causal", 8, 16, 4096, 128, causal=True),
    )
    batch_seconds: float = 0.05
    max_repeats: int = 200

    @classmethod
    def tiny(cls) -> Suite:
        """Sizes a CPU runs in a second or two (tests)."""
        return cls(matmul_sizes=(32, 64), copy_bytes=1 << 16, launches=20,
                   convs=(ConvShape("3x3 c8 8px b2", 2, 8, 8, 8, 3),),
                   attentions=(AttentionShape("b1 h2 s16 d8", 1, 2, 16, 8),), batch_seconds=0.002, max_repeats=5)

    def steps(self, precisions: Sequence[str]) -> int:
        """How many measurements the suite takes (for the progress count)."""
        return len(precisions) * len(self.matmul_sizes) + 2 + len(self.convs) + len(self.attentions)


@dataclass
class Calibration:
    """A calibration's figures: ``gemm`` (precision -> best FLOP/s) and ``gemm_sizes`` (precision -> side ->
    FLOP/s), ``bandwidth`` (bytes/s), ``launch_s``, ``conv`` / ``attention`` (shape name -> FLOP/s), what was
    skipped for the budget (``skipped``), the device's info and the seconds it all took."""

    info: DeviceInfo
    gemm: dict[str, float] = field(default_factory=dict)
    gemm_sizes: dict[str, dict[int, float]] = field(default_factory=dict)
    bandwidth: float = 0.0
    launch_s: float = 0.0
    conv: dict[str, float] = field(default_factory=dict)
    attention: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    date: str = ""

    def as_gpu_calibration(self) -> GPUCalibration:
        """The figures as :class:`~dprobe.core.gpus.GPUCalibration` (what prediction reads)."""
        software = (("device", self.info.name), ("torch", self.info.torch), ("cuda", self.info.cuda),
                    ("date", self.date), ("seconds", f"{self.seconds:.1f}"))
        return GPUCalibration(
            flops_fp32=self.gemm.get("fp32", 0.0), flops_tf32=self.gemm.get("tf32", 0.0),
            flops_fp16=self.gemm.get("fp16", 0.0), flops_bf16=self.gemm.get("bf16", 0.0),
            flops_fp16_acc16=self.gemm.get("fp16_acc16", 0.0), bandwidth=self.bandwidth,
            launch_overhead_s=self.launch_s, conv=tuple(self.conv.items()), attention=tuple(self.attention.items()),
            software=tuple((k, v) for k, v in software if v))


def _repeats(one_call_s: float, suite: Suite) -> int:
    return int(min(max(suite.batch_seconds / max(one_call_s, 1e-9), 1), suite.max_repeats))


def calibrate(device: DeviceLayer, suite: Suite | None = None, seconds: float = 60.0,
              progress: Progress | None = None, spec: GPUSpec | None = None) -> Calibration:
    """Time the suite on ``device`` within about ``seconds`` (wall clock): each figure first timed with one
    call per batch, then with as many calls as fill the suite's ``batch_seconds``; once the budget is spent,
    the measurements left are skipped (``skipped``): fp16 and fp32 GEMMs, the copy and the launches come first.
    ``progress`` gets one line per measurement (with the share of ``spec``'s figure where one is given).
    A budget too short for the GEMMs and the copy raises a ValueError."""
    suite = suite or Suite()
    if not seconds > 0:
        raise ValueError(f"--seconds must be a positive number of seconds, not {seconds!r}")
    say = progress or (lambda _line: None)
    t0 = time.monotonic()
    info = device.info()
    order = ("fp16", "fp32", "bf16", "tf32", "fp16_acc16")  # autocast's GEMMs first (the budget may end)
    precisions: list[str] = [p for p in order if p in PRECISIONS and device.supports(p)]
    total, done = suite.steps(precisions), 0
    out = Calibration(info, date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def over() -> bool:
        return time.monotonic() - t0 > seconds

    def step(label: str, timer: Callable[[int], float], work: float, unit: str, peak: float = 0.0) -> float | None:
        nonlocal done
        done += 1
        if over():
            out.skipped.append(label)
            say(f"[{done:>2}/{total}] {label}: skipped (the --seconds budget is spent)")
            return None
        first = timer(1)
        t = timer(_repeats(first, suite)) if first < suite.batch_seconds else first
        rate = work / t
        share = f" ({100 * rate / peak:.0f} % of the spec sheet's {peak / _UNITS[unit]:g})" if peak > 0 else ""
        say(f"[{done:>2}/{total}] {label}: {rate / _UNITS[unit]:.4g} {unit}{share}")
        return rate

    sheet = _sheet_peaks(spec)

    def gemms(precision: str) -> None:
        for n in suite.matmul_sizes:
            rate = step(f"GEMM {_LABELS[precision]} {n}x{n}x{n}", partial(device.matmul, n, precision),
                        2.0 * n**3, "TFLOP/s", sheet.get(precision, 0.0))
            if rate is not None:
                out.gemm_sizes.setdefault(precision, {})[n] = rate
                out.gemm[precision] = max(out.gemm.get(precision, 0.0), rate)

    # what prediction needs first (fp16 and fp32 GEMMs, the copy, launches), then the rest while time is left
    for first in [p for p in ("fp16", "fp32") if p in precisions]:
        gemms(first)
    bw = step(f"copy {suite.copy_bytes / GIB:.3g} GiB device to device", partial(device.copy, suite.copy_bytes),
              2.0 * suite.copy_bytes, "GB/s", sheet.get("bandwidth", 0.0))
    out.bandwidth = bw or 0.0
    rate = step("kernel launch (one-element add)", lambda r: device.launch(max(r, suite.launches)), 1.0, "launches/s")
    out.launch_s = 1.0 / rate if rate else 0.0
    for rest in [p for p in precisions if p not in ("fp16", "fp32")]:
        gemms(rest)
    conv_precision = "fp16" if "fp16" in precisions else "fp32"
    for conv in suite.convs:
        rate = step(f"conv {conv.name} {conv_precision}", partial(device.conv, conv, conv_precision), conv.flops,
                    "TFLOP/s")
        if rate is not None:
            out.conv[conv.name] = rate
    for att in suite.attentions:
        rate = step(f"attention {att.name} {conv_precision}", partial(device.attention, att, conv_precision),
                    att.flops, "TFLOP/s")
        if rate is not None:
            out.attention[att.name] = rate
    out.seconds = time.monotonic() - t0
    needed = {"fp32", "fp16"} - set(out.gemm)
    if needed or out.bandwidth <= 0:
        missing = ", ".join([*(f"GEMM {p}" for p in sorted(needed)), *(["the copy"] if out.bandwidth <= 0 else [])])
        raise ValueError(f"the --seconds budget ({seconds:g} s) ran out before {missing} could be timed; "
                         "give it more (60 s is the default)")
    return out


_UNITS = {"TFLOP/s": 1e12, "GB/s": 1e9, "launches/s": 1.0}
_LABELS = {"fp32": "fp32 (TF32 off)", "tf32": "tf32", "fp16": "fp16 (fp32 accumulate)",
           "bf16": "bf16 (fp32 accumulate)", "fp16_acc16": "fp16 (fp16 accumulate)"}


def _sheet_peaks(spec: GPUSpec | None) -> dict[str, float]:
    if spec is None:
        return {}
    return {"fp32": spec.peak_flops_fp32, "tf32": spec.peak_flops_tf32, "fp16": spec.peak_half("fp16"),
            "bf16": spec.peak_flops_bf16, "bandwidth": spec.bandwidth}


def spec_sheet_for(info: DeviceInfo, spec: GPUSpec | None = None) -> tuple[GPUSpec | None, str]:
    """The spec sheet a calibration is compared with: ``spec`` where given (a ``--spec`` file), else the GPU's
    entry in :data:`~dprobe.core.gpus.GPUS` by its name; None where there is neither. The second value says
    which ("file", "GPUS['key']", "")."""
    if spec is not None:
        return spec, "file"
    try:
        key = gpu_key(info.name)
    except ValueError:
        return None, ""
    return GPUS[key], f"dprobe.core.gpus.GPUS[{key!r}]"


def spec_document(cal: Calibration, spec: GPUSpec | None = None, name: str | None = None) -> dict[str, Any]:
    """The ``--gpu-spec`` document of a calibration: the spec sheet's fields (``spec``'s; without one, the
    device's memory, SMs, L2 and clock and the *measured* peaks in their place, so that the file still
    loads), the ``measured:`` block with ``fraction_of_peak`` (measured / spec sheet, only with a spec
    sheet). It is checked by reading it back (:func:`~dprobe.core.gpus.gpu_spec_from_dict`)."""
    gpu_cal = cal.as_gpu_calibration()
    if spec is not None:
        doc = {k: v for k, v in spec_as_dict(spec).items() if k != "measured"}
    else:
        info = cal.info
        missing = [what for what, v in (("memory", info.memory_bytes), ("SM count", info.sm_count),
                                        ("L2 size", info.l2_bytes), ("boost clock", info.clock_mhz)) if not v > 0]
        if missing:
            raise ValueError(f"the device does not report its {', '.join(missing)}: give the GPU's spec sheet "
                             "with --spec FILE (the --gpu-spec fields)")
        doc = {"name": info.name, "memory_gib": round(info.memory_bytes / GIB, 3),
               "fp32_tflops": round(cal.gemm["fp32"] / 1e12, 3), "tf32_tflops": round(cal.gemm.get("tf32", cal.gemm["fp32"]) / 1e12, 3),
               "fp16_tflops": round(max(cal.gemm["fp16"], cal.gemm["fp32"]) / 1e12, 3),
               "bf16_tflops": round(cal.gemm.get("bf16", cal.gemm["fp32"]) / 1e12, 3),
               "bandwidth_gbps": round(cal.bandwidth / 1e9, 3), "sm_count": int(info.sm_count),
               "l2_mib": round(info.l2_bytes / 2**20, 3), "boost_clock_mhz": round(info.clock_mhz, 1)}
    if name:
        doc["name"] = name
    measured = calibration_as_dict(gpu_cal)
    if spec is not None:
        measured["fraction_of_peak"] = fractions_of_peak(spec, gpu_cal)
    doc["measured"] = measured
    gpu_spec_from_dict(doc, "the calibration's spec")  # what --gpu-spec will read
    return doc


def spec_yaml(doc: dict[str, Any], header: str = "") -> str:
    """The document as YAML (keys in the order written), with ``header`` as comment lines above it."""
    import yaml

    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


__all__ = ["Calibration", "Suite", "calibrate", "spec_document", "spec_sheet_for", "spec_yaml"]
