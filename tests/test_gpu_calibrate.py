"""``dprobe gpu calibrate``: the suite through a fake device layer (deterministic timings), through torch on the
CPU at tiny sizes, the spec file it writes (read back by --gpu-spec), its budget and errors; and a calibrated
GPU's inference step on its measured peaks. The same suite on CUDA where a GPU is present (``-m gpu``)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml

from dprobe.cli import main
from dprobe.core.gpus import GPUS, GPUCalibration, load_gpu_spec, measured_spec
from dprobe.profiling.calibrate import run as calibrate_run
from dprobe.profiling.calibrate.device import AttentionShape, ConvShape, FakeDevice, TorchDevice
from dprobe.profiling.calibrate.run import Suite, calibrate, spec_document, spec_sheet_for, spec_yaml

SMALL = Suite(matmul_sizes=(1024, 4096), copy_bytes=1 << 28, launches=100,
              convs=(ConvShape("3x3", 8, 64, 64, 32),), attentions=(AttentionShape("att", 2, 4, 256, 64),))


def test_the_suite_reads_back_the_fake_devices_figures() -> None:
    dev = FakeDevice()
    cal = calibrate(dev, SMALL, seconds=60)
    n = 4096  # the larger GEMM amortises the launch best
    for p, flops in dev.flops.items():
        assert cal.gemm[p] == pytest.approx(2 * n**3 / (dev.launch_s + 2 * n**3 / flops)), p
        assert cal.gemm[p] == max(cal.gemm_sizes[p].values())
    assert cal.bandwidth == pytest.approx(2 * SMALL.copy_bytes / (dev.launch_s + 2 * SMALL.copy_bytes / 900e9))
    assert cal.launch_s == pytest.approx(dev.launch_s)
    conv = SMALL.convs[0]
    assert cal.conv["3x3"] == pytest.approx(conv.flops / (dev.launch_s + conv.flops / (150e12 * 0.6)))
    assert set(cal.attention) == {"att"} and not cal.skipped
    kinds = {k for k, _ in dev.calls}
    assert kinds == {"matmul", "copy", "launch", "conv", "attention"}
    # each figure timed once with one call, then with as many as fill a timed batch (capped)
    assert ("matmul", (1024, "fp16", 1)) in dev.calls
    assert ("matmul", (1024, "fp16", SMALL.max_repeats)) in dev.calls


def test_the_spec_file_is_what_gpu_spec_reads(tmp_path) -> None:
    sheet = GPUS["rtx4090"]
    cal = calibrate(FakeDevice(name="NVIDIA GeForce RTX 4090"), SMALL, seconds=60)
    spec, source = spec_sheet_for(cal.info)
    assert spec == sheet and source == "dprobe.core.gpus.GPUS['rtx4090']"
    path = tmp_path / "gpu.yaml"
    path.write_text(spec_yaml(spec_document(cal, spec), "a header"))
    doc = yaml.safe_load(path.read_text())
    assert doc["fp16_tflops"] == pytest.approx(165.2) and doc["measured"]["fp16_tflops"] == pytest.approx(
        cal.gemm["fp16"] / 1e12, rel=1e-4)
    assert doc["measured"]["fraction_of_peak"]["fp16"] == pytest.approx(cal.gemm["fp16"] / 165.2e12, rel=1e-3)
    assert doc["measured"]["fraction_of_peak"]["bandwidth"] == pytest.approx(cal.bandwidth / 1008e9, rel=1e-3)
    assert {"torch", "cuda", "date", "device", "conv", "attention", "launch_overhead_us"} <= set(doc["measured"])
    loaded = load_gpu_spec(path)
    assert loaded.peak_half("fp16") == pytest.approx(165.2e12) and loaded.calibration is not None
    assert loaded.calibration.flops_fp16 == pytest.approx(cal.gemm["fp16"], rel=1e-4)
    assert loaded.calibration.launch_overhead_s == pytest.approx(5e-6, rel=1e-3)
    assert measured_spec(loaded).bandwidth == pytest.approx(cal.bandwidth, rel=1e-4)
    assert dict(loaded.calibration.software)["device"] == "NVIDIA GeForce RTX 4090"


def test_without_a_spec_sheet_the_measured_figures_stand_in() -> None:
    cal = calibrate(FakeDevice(name="Mystery GPU"), SMALL, seconds=60)
    assert spec_sheet_for(cal.info) == (None, "")
    doc = spec_document(cal, None, name="my card")
    assert doc["name"] == "my card" and doc["fp16_tflops"] == pytest.approx(cal.gemm["fp16"] / 1e12, rel=1e-3)
    assert "fraction_of_peak" not in doc["measured"] and doc["memory_gib"] == 24


class Clock:
    """A wall clock the fake device moves on by the time its calls take."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_the_budget_skips_what_is_left_and_refuses_a_budget_too_short(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(calibrate_run, "time", SimpleNamespace(monotonic=clock.monotonic))

    class Slow(FakeDevice):
        def matmul(self, n: int, precision: str, repeats: int) -> float:
            clock.now += 1.0  # a second a GEMM measurement
            return super().matmul(n, precision, repeats)

    lines: list[str] = []
    cal = calibrate(Slow(), SMALL, seconds=8.5, progress=lines.append)
    # a GEMM size takes 2 s (one call, then a batch): fp16 and fp32 (8 s), the copy, the launches, one bf16
    # size; what is left is skipped, the GEMMs prediction needs first
    assert set(cal.gemm) == {"fp16", "fp32", "bf16"} and cal.bandwidth > 0 and cal.launch_s > 0
    assert cal.gemm_sizes["bf16"].keys() == {1024} and "GEMM tf32 1024x1024x1024" in cal.skipped
    assert not cal.conv and "conv 3x3 fp16" in cal.skipped
    assert any(line.endswith("skipped (the --seconds budget is spent)") for line in lines) and lines[0].startswith("[ 1/")
    clock.now = 0.0
    with pytest.raises(ValueError, match="budget .* ran out before GEMM fp32"):
        calibrate(Slow(), SMALL, seconds=3)
    with pytest.raises(ValueError, match="positive number"):
        calibrate(FakeDevice(), SMALL, seconds=0)


def test_progress_lines_give_the_share_of_the_spec_sheet() -> None:
    lines: list[str] = []
    calibrate(FakeDevice(), SMALL, seconds=60, progress=lines.append, spec=GPUS["rtx4090"])
    fp16 = next(line for line in lines if "GEMM fp16 (fp32 accumulate) 4096" in line)
    assert "TFLOP/s" in fp16 and "% of the spec sheet's 165.2" in fp16
    assert any("GB/s" in line and "of the spec sheet's 1008" in line for line in lines)


@pytest.mark.slow
def test_a_real_torch_device_on_the_cpu_at_tiny_sizes() -> None:
    dev = TorchDevice("cpu")
    assert not dev.supports("tf32") and not dev.supports("fp16_acc16") and dev.supports("fp16")
    cal = calibrate(dev, Suite.tiny(), seconds=60)
    assert {"fp32", "fp16", "bf16"} <= set(cal.gemm) and all(v > 0 for v in cal.gemm.values())
    assert cal.bandwidth > 0 and cal.launch_s > 0 and cal.conv and cal.attention and not cal.skipped
    assert cal.info.kind == "cpu" and cal.info.torch
    with pytest.raises(ValueError, match="--spec FILE"):  # a CPU reports no SMs, L2 or clock
        spec_document(cal, None)
    doc = spec_document(cal, GPUS["t4"], name="cpu as a t4")
    assert doc["measured"]["fp32_tflops"] > 0


@pytest.mark.slow
def test_no_gpu_is_one_line_that_suggests_a_spec_sheet(capsys, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpu", "calibrate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA GPU" in err and "--gpu-spec FILE" in err
    assert main(["gpu", "calibrate", "--device", "cpu"]) == 2
    assert "a CUDA device" in capsys.readouterr().err
    assert main(["gpu", "calibrate", "--seconds", "-1"]) == 2
    assert "--seconds must be a positive" in capsys.readouterr().err


def test_the_cli_writes_the_file_through_the_device_layer(tmp_path, capsys, monkeypatch) -> None:
    import dprobe.profiling.calibrate.device as device

    monkeypatch.setattr(device, "TorchDevice", lambda name: FakeDevice(name="NVIDIA GeForce RTX 5090"))
    monkeypatch.setattr(calibrate_run, "Suite", lambda: SMALL)
    out = tmp_path / "gpu.yaml"
    assert main(["gpu", "calibrate", "--out", str(out), "--name", "my 5090"]) == 0
    err = capsys.readouterr().err
    assert "calibrating NVIDIA GeForce RTX 5090" in err and "GEMM fp16" in err and f"wrote {out}" in err
    spec = load_gpu_spec(out)
    assert spec.name == "my 5090" and spec.bandwidth == GPUS["rtx5090"].bandwidth and spec.calibration
    assert out.read_text().startswith("# dprobe gpu calibrate on NVIDIA GeForce RTX 5090")
    assert main(["gpu", "calibrate", "--quiet"]) == 0  # no --out: the file on stdout, no progress
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["measured"]["bandwidth_gbps"] > 0 and captured.err == ""


def _calibrated(spec, fractions: dict[str, float], name: str):
    """``spec`` renamed, with a calibration reaching these shares of its figures."""
    cal = GPUCalibration(flops_fp32=spec.peak_flops_fp32 * fractions["fp32"],
                         flops_tf32=spec.peak_flops_tf32 * fractions["tf32"],
                         flops_fp16=spec.peak_half("fp16") * fractions["fp16"],
                         flops_bf16=spec.peak_flops_bf16 * fractions["bf16"],
                         bandwidth=spec.bandwidth * fractions["bandwidth"], launch_overhead_s=5e-6)
    return replace(spec, name=name, calibration=cal)


def test_a_calibrated_gpu_is_predicted_on_its_measured_peaks() -> None:
    """A spec-sheet workstation card on the RTX 5090's chip: calibrated, its roofline is put on its measured
    peaks (over its typical share) and takes the 5090's factor; the p50 is roofline x factor exactly."""
    from dprobe.profiling.coldstart.features import roofline_seconds
    from dprobe.profiling.coldstart.inference import default_model, predict_inference_step
    from dprobe.profiling.coldstart.memtrack import FORWARD, OP_CLASSES, ReplayOp
    from dprobe.profiling.coldstart.replay import ReplayEstimate

    model = default_model()
    mm, ew = OP_CLASSES.index("matmul"), OP_CLASSES.index("elementwise")
    ops = [ReplayOp(FORWARD, mm, 1, 4e11, 5e7), ReplayOp(FORWARD, ew, 1, 1e6, 4e9)] * 20
    est = ReplayEstimate(*([1.0] * 13), ops=ops)
    card = replace(GPUS["rtx5090"], name="RTX PRO 6000 Blackwell", peak_flops_fp16=503.8e12,
                   peak_flops_bf16=503.8e12, memory_bytes=96 * 2**30, sm_count=188)
    even = _calibrated(card, dict.fromkeys(("fp32", "tf32", "fp16", "bf16", "bandwidth"), 0.9), card.name)
    assert model.method_for_spec(card) == "sibling-factor" and model.method_for_spec(even) == "calibrated"
    assert model.anchor(even.name, even.bandwidth, even.peak_half("fp16"), True) == "GeForce RTX 5090"
    # every figure at the same share: the measured balance is the spec sheet's, so the step is the sibling's
    assert predict_inference_step(est, "fp16", even, model=model)[0] == pytest.approx(
        predict_inference_step(est, "fp16", card, model=model)[0], rel=1e-6)
    # tensor cores far short of the sheet (the share of the others typical): the roofline on measured peaks
    slow_tc = _calibrated(card, {"fp32": 0.9, "tf32": 0.9, "fp16": 0.3, "bf16": 0.3, "bandwidth": 0.9}, card.name)
    eff = model.roofline_spec(slow_tc)
    assert eff.peak_half("fp16") == pytest.approx(503.8e12 * 0.3 / 0.9) and eff.bandwidth == pytest.approx(card.bandwidth)
    p50, p90 = predict_inference_step(est, "fp16", slow_tc, model=model)
    from dprobe.profiling.coldstart.inference import feature_frame

    roof = float(feature_frame([est], "fp16", eff, model.roofline)["roof"].iloc[0])
    assert p50 == pytest.approx(roof * model.gpu_factors["GeForce RTX 5090"], rel=1e-6)
    assert p50 > predict_inference_step(est, "fp16", card, model=model)[0] * 1.2
    assert p90 / p50 == pytest.approx(model.nearest_p90_factor or model.gpu_p90_factor * model.between_gpu_spread())
    # a seen GPU keeps its own factor whatever its calibration says
    own = _calibrated(GPUS["rtx4090"], dict.fromkeys(("fp32", "tf32", "fp16", "bf16", "bandwidth"), 0.5),
                      GPUS["rtx4090"].name)
    assert model.method_for_spec(own) == "gpu-factor" and model.roofline_spec(own) == own
    assert roofline_seconds(est, "fp16", own)["roof"] > 0
    # a reference calibration of the anchor, where one ships, replaces the typical share
    ref = replace(model, reference_fractions={"GeForce RTX 5090": {"fp16": 0.6, "bandwidth": 0.9}})
    assert ref.roofline_spec(slow_tc).peak_half("fp16") == pytest.approx(503.8e12 * 0.3 / 0.6)


@pytest.mark.slow
def test_predict_with_a_calibrated_spec_file_says_which_method_ran_and_why(tmp_path, capsys) -> None:
    cal = calibrate(FakeDevice(name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                               flops={"fp32": 88e12, "tf32": 88e12, "fp16": 250e12, "bf16": 250e12},
                               bandwidth=1.5e12), SMALL, seconds=60)
    sheet = replace(GPUS["rtx5090"], name="RTX PRO 6000 Blackwell", peak_flops_fp16=503.8e12,
                    peak_flops_bf16=503.8e12, memory_bytes=96 * 2**30, sm_count=188)
    path = tmp_path / "pro6000.yaml"
    path.write_text(spec_yaml(spec_document(cal, sheet)))
    args = ["predict", "timm:resnet18", "--batch", "256", "--image", "160", "--precision", "fp16", "--mode",
            "inference", "--json"]
    assert main([*args, "--gpu-spec", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "calibrated" and "measured peaks" in out["note"] and "GeForce RTX 5090" in out["note"]
    assert out["gpu_spec"]["measured"]["fp16_tflops"] == pytest.approx(cal.gemm["fp16"] / 1e12, rel=1e-3)
    plain = tmp_path / "sheet.yaml"
    plain.write_text(spec_yaml({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "measured"}))
    assert main([*args, "--gpu-spec", str(plain)]) == 0
    sheet_only = json.loads(capsys.readouterr().out)
    assert sheet_only["method"] == "sibling-factor" and "measured" not in sheet_only["gpu_spec"]
    # the tensor cores reach half of the sheet's figure, everything else 84 %: slower than the sheet says
    assert out["step_time_seconds"]["p50"] > sheet_only["step_time_seconds"]["p50"]
    assert math.isfinite(out["step_time_seconds"]["p90"])


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs an NVIDIA GPU (CUDA)")
def test_calibrate_on_the_gpu(tmp_path) -> None:
    """On a GPU: the suite runs within its budget and the figures sit at plausible shares of the spec sheet."""
    dev = TorchDevice("cuda")
    cal = calibrate(dev, seconds=60)
    assert cal.seconds < 90 and {"fp32", "fp16"} <= set(cal.gemm) and cal.bandwidth > 0
    assert 1e-6 < cal.launch_s < 1e-3
    spec, _ = spec_sheet_for(cal.info)
    doc = spec_document(cal, spec)
    if spec is not None:
        for figure, share in doc["measured"]["fraction_of_peak"].items():
            assert 0.2 < share < 1.5, (figure, share)
    path = tmp_path / "gpu.yaml"
    path.write_text(spec_yaml(doc))
    assert load_gpu_spec(path).calibration is not None


@pytest.mark.slow
def test_gpu_help_imports_no_torch() -> None:
    """``dprobe gpu --help`` and ``dprobe gpu calibrate --help`` build their parsers without torch, numpy or pandas."""
    import subprocess
    import sys

    code = ("import sys\nfrom dprobe.cli import main\nfor args in (['gpu', '--help'], ['gpu', 'calibrate', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'pandas', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "--seconds" in out and "--spec FILE" in out and out.strip().splitlines()[-1] == "[]"
