"""NeuSight's per-kernel measurements (``datasets/neusight-kernels``) as one frame of calls.

One row a measured PyTorch call: its op kind, shapes, the GPU it ran on and its latency, with the FLOPs and
bytes a roofline needs (fp32: four bytes an element). Each GPU's spec sheet (``device_configs/``) becomes a
:class:`~dprobe.core.gpus.GPUSpec`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from dprobe.core.gpus import GPUSpec
from dprobe.data.common import DatasetError

GEMM_OPS = ("bmm", "linear")
CONV_OPS = ("conv",)
# element-wise and row ops: (tensors read + written, FLOPs an element)
ELEMENTWISE_OPS: dict[str, tuple[int, float]] = {
    "add": (3, 1), "mul": (3, 1), "div": (3, 1), "pow": (3, 8),
    "addu": (2, 1), "mulu": (2, 1), "divu": (2, 1), "powu": (2, 8),
    "relu": (2, 1), "gelu": (2, 10), "tanh": (2, 8), "ln": (2, 8), "softmax": (2, 5),
}
OPS = (*GEMM_OPS, *CONV_OPS, *ELEMENTWISE_OPS)
SHAPE_COLUMNS = ("B", "M", "N", "K", "H", "in_channels", "out_channels", "kernel", "image", "stride", "padding")
_RENAME = {"Input_Channel": "in_channels", "Output_Channel": "out_channels", "Kernel_Szie": "kernel",
           "Input_Size": "image", "Stride": "stride", "Padding": "padding"}
FP32_BYTES = 4.0

# NeuSight measured conv on A100 80GB PCIe, without a device config: its data sheet (same chip as the 40GB
# card, HBM2e at 1,935 GB/s)
EXTRA_DEVICES = {"NVIDIA_A100_80GB_PCIe": {"Device": "NVIDIA A100 80GB PCIe", "Dev_Mem": 80, "Mem_Bw": 1935,
                                           "Num_Sm": 108, "Core_Per_SM": 64, "Freq": 1410,
                                           "SingleFLOPs": 19492, "L2Cache": 40}}


def device_spec(config: dict) -> GPUSpec:
    """A NeuSight device config (GB, GB/s, MHz, GFLOP/s, MB) as a GPUSpec (fp32 everywhere: no tensor cores)."""
    fp32 = float(config["SingleFLOPs"]) * 1e9
    return GPUSpec(memory_bytes=float(config["Dev_Mem"]) * 2**30, peak_flops_bf16=fp32, peak_flops_tf32=fp32,
                   peak_flops_fp32=fp32, bandwidth=float(config["Mem_Bw"]) * 1e9, peak_flops_fp16=fp32,
                   sm_count=int(config["Num_Sm"]), l2_bytes=float(config["L2Cache"]) * 2**20,
                   boost_clock_mhz=float(config["Freq"]), name=str(config["Device"]))


def gpu_family(gpu: str) -> str:
    """The group a GPU is left out with: the two A100 cards are one chip."""
    return "A100" if "A100" in gpu else gpu


def load_device_specs(root: str | Path) -> dict[str, GPUSpec]:
    """Every ``device_configs/*.json`` of a NeuSight directory (and the A100 80GB card it measured conv on)."""
    folder = Path(root) / "device_configs"
    if not folder.is_dir():
        raise DatasetError(f"{root}: no device_configs/ folder (not a neusight-kernels directory)")
    configs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    configs.update({k: v for k, v in EXTRA_DEVICES.items() if k not in configs})
    return {gpu: device_spec(cfg) for gpu, cfg in configs.items()}


def op_cost(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes moved of each call (``op`` and the shape columns), fp32."""
    op = frame["op"].to_numpy()
    col = {c: frame[c].to_numpy(dtype=float) if c in frame else np.full(len(frame), np.nan) for c in SHAPE_COLUMNS}
    b, m, n, k = col["B"], col["M"], col["N"], col["K"]
    flops = np.full(len(frame), np.nan)
    moved = np.full(len(frame), np.nan)
    gemm = np.isin(op, GEMM_OPS)
    flops[gemm] = (2 * b * m * n * k)[gemm]
    bmm = op == "bmm"
    moved[bmm] = (FP32_BYTES * b * (m * k + k * n + m * n))[bmm]
    lin = op == "linear"
    moved[lin] = (FP32_BYTES * (b * m * k + n * k + b * m * n))[lin]
    conv = op == "conv"
    cin, cout, ks, side = col["in_channels"], col["out_channels"], col["kernel"], col["image"]
    out = np.floor((side + 2 * col["padding"] - ks) / col["stride"]) + 1
    flops[conv] = (2 * b * cout * out**2 * cin * ks**2)[conv]
    moved[conv] = (FP32_BYTES * (b * cin * side**2 + cout * cin * ks**2 + b * cout * out**2))[conv]
    elements = b * col["H"]
    for name, (tensors, per_element) in ELEMENTWISE_OPS.items():
        sel = op == name
        flops[sel] = (per_element * elements)[sel]
        moved[sel] = (FP32_BYTES * tensors * elements)[sel]
    return flops, moved


def load_neusight(root: str | Path, ops: tuple[str, ...] = OPS) -> pd.DataFrame:
    """All calls of a NeuSight directory: ``op``, ``gpu`` (file stem), ``family`` (the left-out group),
    ``latency_s``, the shape columns, ``flops`` and ``bytes``."""
    root = Path(root)
    specs = load_device_specs(root)
    frames = []
    for name in ops:
        for path in sorted((root / name).glob("*.csv.gz")):
            raw = pd.read_csv(path)
            if "Latency" not in raw:
                raise DatasetError(f"{path}: no Latency column")
            frame = raw.rename(columns=_RENAME)
            frame = frame[[c for c in SHAPE_COLUMNS if c in frame]].astype(float)
            frame.insert(0, "latency_s", raw["Latency"].astype(float) / 1e3)
            frame.insert(0, "gpu", path.name.removesuffix(".csv.gz"))
            frame.insert(0, "op", name)
            frames.append(frame)
    if not frames:
        raise DatasetError(f"{root}: no kernel measurements (expected OP/GPU.csv.gz files)")
    calls = pd.concat(frames, ignore_index=True)
    unknown = sorted(set(calls["gpu"]) - set(specs))
    if unknown:
        raise DatasetError(f"{root}: no device config for {unknown[0]} (add device_configs/{unknown[0]}.json)")
    calls["family"] = calls["gpu"].map(gpu_family)
    calls["flops"], calls["bytes"] = op_cost(calls)
    calls = calls[np.isfinite(calls["latency_s"]) & (calls["latency_s"] > 0) & (calls["bytes"] > 0)]
    return calls.reset_index(drop=True)


__all__ = ["OPS", "device_spec", "gpu_family", "load_device_specs", "load_neusight", "op_cost"]
