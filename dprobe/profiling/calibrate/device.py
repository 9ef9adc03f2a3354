"""The device layer the calibration's timers run through: one timer per kind of work, each returning the
seconds one call takes (median of timed batches after warm-up).

:class:`TorchDevice` times real work with torch (CUDA events on a GPU, the wall clock on the CPU, where tests
run it at tiny sizes); :class:`FakeDevice` answers from given figures, deterministically, so that the suite,
its budget and the spec file are tested without a GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp16_acc16")  # GEMM: fp16_acc16 is fp16 accumulating in fp16


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution: batch, input and output channels, image side, kernel side, groups (stride 1, same
    padding)."""

    name: str
    batch: int
    cin: int
    cout: int
    image: int
    kernel: int = 3
    groups: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.cout * self.image**2 * (self.cin // self.groups) * self.kernel**2


@dataclass(frozen=True)
class AttentionShape:
    """``scaled_dot_product_attention`` of batch x heads x seq x head_dim queries, keys and values."""

    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool = False

    @property
    def flops(self) -> float:
        full = 4.0 * self.batch * self.heads * self.seq**2 * self.head_dim
        return full / 2 if self.causal else full


@dataclass(frozen=True)
class DeviceInfo:
    """What the device says of itself (0 or "" where it does not)."""

    name: str
    kind: str  # "cuda", "cpu" or "fake"
    memory_bytes: float = 0.0
    sm_count: int = 0
    l2_bytes: float = 0.0
    clock_mhz: float = 0.0
    torch: str = ""
    cuda: str = ""


class DeviceLayer(Protocol):
    """The timers a calibration needs; each returns seconds per call (``repeats`` timed calls after warm-up).
    ``supports(precision)`` says whether a GEMM precision can run here at all."""

    def info(self) -> DeviceInfo: ...

    def supports(self, precision: str) -> bool: ...

    def matmul(self, n: int, precision: str, repeats: int) -> float: ...

    def copy(self, nbytes: int, repeats: int) -> float: ...

    def launch(self, repeats: int) -> float: ...

    def conv(self, shape: ConvShape, precision: str, repeats: int) -> float: ...

    def attention(self, shape: AttentionShape, precision: str, repeats: int) -> float: ...


@dataclass
class FakeDevice:
    """A device that answers from figures (FLOP/s per GEMM precision, bytes/s, a launch's seconds), each call
    taking ``launch_s`` plus its work at that rate: deterministic timings for tests. ``calls`` records every
    timer called, with its arguments."""

    flops: dict[str, float] = field(default_factory=lambda: {"fp32": 20e12, "tf32": 60e12, "fp16": 150e12,
                                                            "bf16": 150e12, "fp16_acc16": 300e12})
    bandwidth: float = 900e9
    launch_s: float = 5e-6
    conv_efficiency: float = 0.6  # of the fp16 / fp32 GEMM rate
    attention_efficiency: float = 0.5
    name: str = "Fake GPU"
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def info(self) -> DeviceInfo:
        return DeviceInfo(self.name, "fake", memory_bytes=24 * 2**30, sm_count=128, l2_bytes=72 * 2**20,
                          clock_mhz=2520, torch="fake", cuda="fake")

    def supports(self, precision: str) -> bool:
        return precision in self.flops

    def matmul(self, n: int, precision: str, repeats: int) -> float:
        self.calls.append(("matmul", (n, precision, repeats)))
        return self.launch_s + 2.0 * n**3 / self.flops[precision]

    def copy(self, nbytes: int, repeats: int) -> float:
        self.calls.append(("copy", (nbytes, repeats)))
        return self.launch_s + 2.0 * nbytes / self.bandwidth

    def launch(self, repeats: int) -> float:
        self.calls.append(("launch", repeats))
        return self.launch_s

    def conv(self, shape: ConvShape, precision: str, repeats: int) -> float:
        self.calls.append(("conv", (shape.name, precision, repeats)))
        return self.launch_s + shape.flops / (self.flops[precision] * self.conv_efficiency)

    def attention(self, shape: AttentionShape, precision: str, repeats: int) -> float:
        self.calls.append(("attention", (shape.name, precision, repeats)))
        return self.launch_s + shape.flops / (self.flops[precision] * self.attention_efficiency)


class TorchDevice:
    """Timers on a torch device: ``cuda`` / ``cuda:N`` (CUDA events around the timed calls, after warm-up) or
    ``cpu`` (the wall clock; tests use it at tiny sizes). Opening a CUDA device that is not there raises a
    ValueError."""

    WARMUP = 2
    BATCHES = 3  # timed batches of ``repeats`` calls; their median is the answer

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
            index = self.device.index or 0
            if index >= torch.cuda.device_count():
                raise ValueError(f"no CUDA device {device!r} (this machine has {torch.cuda.device_count()})")
            self.device = torch.device("cuda", index)
        elif self.device.type != "cpu":
            raise ValueError(f"device {device!r}: a CUDA device (cuda, cuda:N) or cpu")

    # --- what the device says of itself
    def info(self) -> DeviceInfo:
        torch = self.torch
        if self.device.type != "cuda":
            import platform

            return DeviceInfo(platform.processor() or "CPU", "cpu", torch=torch.__version__)
        props = torch.cuda.get_device_properties(self.device)
        l2 = float(getattr(props, "L2_cache_size", 0) or 0)
        clock = float(getattr(props, "clock_rate", 0) or 0) / 1000.0  # kHz in the properties where given
        if clock <= 0:
            clock = _nvml_max_clock_mhz(self.device.index or 0)
        return DeviceInfo(props.name, "cuda", memory_bytes=float(props.total_memory),
                          sm_count=int(props.multi_processor_count), l2_bytes=l2, clock_mhz=clock,
                          torch=torch.__version__, cuda=str(torch.version.cuda or ""))

    def supports(self, precision: str) -> bool:
        torch = self.torch
        if precision == "fp16_acc16":
            return self.device.type == "cuda" and hasattr(torch.backends.cuda.matmul, "allow_fp16_accumulation")
        if precision == "tf32":
            return self.device.type == "cuda"
        if precision == "bf16" and self.device.type == "cuda":
            return bool(torch.cuda.is_bf16_supported())
        return True

    # --- timing
    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _time(self, fn: Any, repeats: int) -> float:
        """Seconds per call of ``fn``: warm-up, then the median of :attr:`BATCHES` timed batches."""
        torch = self.torch
        repeats = max(int(repeats), 1)
        for _ in range(self.WARMUP):
            fn()
        self._sync()
        times = []
        for _ in range(self.BATCHES):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(repeats):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000.0 / repeats)
            else:
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fn()
                times.append((time.perf_counter() - t0) / repeats)
        return statistics.median(times)

    def _matmul_flags(self, precision: str) -> dict[str, Any]:
        """The backend switches a precision needs (set for the timing, restored after)."""
        m = self.torch.backends.cuda.matmul
        flags: dict[str, Any] = {"allow_tf32": precision == "tf32"}
        if hasattr(m, "allow_fp16_reduced_precision_reduction"):
            flags["allow_fp16_reduced_precision_reduction"] = precision == "fp16_acc16"
        if hasattr(m, "allow_fp16_accumulation"):
            flags["allow_fp16_accumulation"] = precision == "fp16_acc16"
        return flags

    def _with_flags(self, precision: str, fn: Any) -> Any:
        m = self.torch.backends.cuda.matmul
        flags = self._matmul_flags(precision)
        before = {k: getattr(m, k) for k in flags}
        cudnn_before = self.torch.backends.cudnn.allow_tf32
        try:
            for k, v in flags.items():
                setattr(m, k, v)
            self.torch.backends.cudnn.allow_tf32 = precision == "tf32"
            return fn()
        finally:
            for k, v in before.items():
                setattr(m, k, v)
            self.torch.backends.cudnn.allow_tf32 = cudnn_before

    def _dtype(self, precision: str) -> Any:
        torch = self.torch
        return {"fp16": torch.float16, "fp16_acc16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)

    def matmul(self, n: int, precision: str, repeats: int) -> float:
        torch = self.torch
        a = torch.randn(n, n, device=self.device, dtype=self._dtype(precision))
        b = torch.randn(n, n, device=self.device, dtype=self._dtype(precision))
        out = torch.empty(n, n, device=self.device, dtype=a.dtype)
        return self._with_flags(precision, lambda: self._time(lambda: torch.mm(a, b, out=out), repeats))

    def copy(self, nbytes: int, repeats: int) -> float:
        torch = self.torch
        src = torch.empty(int(nbytes), device=self.device, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        return self._time(lambda: dst.copy_(src), repeats)

    def launch(self, repeats: int) -> float:
        """Host-side seconds per launch of a one-element kernel, the GPU kept waiting on the host."""
        torch = self.torch
        x = torch.zeros(1, device=self.device)
        for _ in range(self.WARMUP * 10):
            x.add_(1.0)
        self._sync()
        times = []
        for _ in range(self.BATCHES):
            t0 = time.perf_counter()
            for _ in range(max(int(repeats), 1)):
                x.add_(1.0)
            self._sync()
            times.append((time.perf_counter() - t0) / max(int(repeats), 1))
        return statistics.median(times)

    def conv(self, shape: ConvShape, precision: str, repeats: int) -> float:
        torch = self.torch
        dtype = self._dtype(precision)
        x = torch.randn(shape.batch, shape.cin, shape.image, shape.image, device=self.device, dtype=dtype)
        w = torch.randn(shape.cout, shape.cin // shape.groups, shape.kernel, shape.kernel, device=self.device,
                        dtype=dtype)
        conv = torch.nn.functional.conv2d
        with torch.no_grad():
            return self._with_flags(precision, lambda: self._time(
                lambda: conv(x, w, padding=shape.kernel // 2, groups=shape.groups), repeats))

    def attention(self, shape: AttentionShape, precision: str, repeats: int) -> float:
        torch = self.torch
        dtype = self._dtype(precision)
        q, k, v = (torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, device=self.device, dtype=dtype)
                   for _ in range(3))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with torch.no_grad():
            return self._with_flags(precision, lambda: self._time(lambda: sdpa(q, k, v, is_causal=shape.causal),
                                                                  repeats))


def _nvml_max_clock_mhz(index: int) -> float:
    """The GPU's highest SM clock as NVML reports it (0 where NVML cannot say)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no driver, an old GPU: the clock is simply not known
        return 0.0


__all__ = ["PRECISIONS", "AttentionShape", "ConvShape", "DeviceInfo", "DeviceLayer", "FakeDevice", "TorchDevice"]
