"""GPUs as features: the data-sheet table, spec files for other GPUs (validated), and the roofline's use of them."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dprobe.core.gpus import (
    GPUS,
    SPEC_FIELDS,
    GPUSpec,
    GPUSpecError,
    gpu_key,
    gpu_spec_from_dict,
    load_gpu_spec,
    spec_as_dict,
)

RTX4090 = {"name": "RTX 4090", "memory_gib": 24, "fp32_tflops": 82.6, "fp16_tflops": 165.2, "bf16_tflops": 165.2,
           "tf32_tflops": 82.6, "bandwidth_gbps": 1008, "sm_count": 128, "l2_mib": 72, "boost_clock_mhz": 2520}


def test_every_gpu_has_every_figure_within_the_plausible_range() -> None:
    """Each table entry goes through the spec file's own validation (the same fields, units and ranges)."""
    for key, spec in GPUS.items():
        again = gpu_spec_from_dict(spec_as_dict(spec), key)
        assert again.sm_count == spec.sm_count > 0 and again.l2_bytes > 0 and again.boost_clock_mhz > 0, key
        for attr in ("memory_bytes", "peak_flops_fp32", "peak_flops_tf32", "bandwidth"):
            assert getattr(again, attr) == pytest.approx(getattr(spec, attr), rel=1e-3), (key, attr)
        assert spec.peak_half("fp16") >= spec.peak_flops_tf32 >= spec.peak_flops_fp32 * 0.99, key
    assert {"rtx3090", "t4"} <= set(GPUS)
    # a GPU without bf16 tensor cores or TF32 (Turing) has its fp32 figure there, fp16 its own
    assert GPUS["t4"].peak_half("bf16") == GPUS["t4"].peak_flops_fp32 < GPUS["t4"].peak_half("fp16")
    assert GPUS["h200"].peak_half("fp16") == GPUS["h200"].peak_half("bf16")


def test_nvml_names_map_to_the_table() -> None:
    names = {"NVIDIA GeForce RTX 3090": "rtx3090", "Tesla T4": "t4", "NVIDIA H200": "h200",
             "NVIDIA A100-SXM4-40GB": "a100", "NVIDIA L40S": "l40s", "NVIDIA GeForce RTX 4090": "rtx4090",
             "NVIDIA GeForce RTX 5090": "rtx5090"}
    assert {n: gpu_key(n) for n in names} == names
    with pytest.raises(ValueError, match="--gpu-spec"):
        gpu_key("NVIDIA GeForce RTX 4080")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_spec_file_gives_the_gpu(tmp_path, suffix) -> None:
    path = tmp_path / f"gpu{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(RTX4090))
    else:
        path.write_text("\n".join(f"{k}: {v}" for k, v in RTX4090.items()) + "\n")
    spec = load_gpu_spec(path)
    assert spec.name == "RTX 4090" and spec.memory_bytes == 24 * 2**30 and spec.sm_count == 128
    assert spec.peak_half("fp16") == 165.2e12 and spec.bandwidth == 1008e9 and spec.l2_bytes == 72 * 2**20
    partial = {k: v for k, v in RTX4090.items() if k not in ("tf32_tflops", "bf16_tflops")}
    assert gpu_spec_from_dict(partial).peak_flops_tf32 == gpu_spec_from_dict(partial).peak_flops_fp32 == 82.6e12


@pytest.mark.parametrize(("change", "message"), [
    ({"memory_gib": None}, "field 'memory_gib' missing"),
    ({"bandwidth_gbps": None}, "field 'bandwidth_gbps' missing"),
    ({"name": None}, "field 'name' missing"),
    ({"fp16_tflops": 1e7}, "field 'fp16_tflops' = 1e\\+07 is implausible"),
    ({"memory_gib": 0}, "field 'memory_gib' = 0 is implausible"),
    ({"sm_count": -4}, "field 'sm_count' = -4 is implausible"),
    ({"boost_clock_mhz": "fast"}, "field 'boost_clock_mhz' must be a number"),
    ({"l2_mib": float("nan")}, "field 'l2_mib' must be a number"),
    ({"fp16_tflops": 20}, "'fp16_tflops' \\(20\\) is below 'fp32_tflops'"),
    ({"hbm": 3}, "unknown field 'hbm'"),
])
def test_a_bad_spec_is_refused_naming_the_field(tmp_path, change, message) -> None:
    data = {**RTX4090, **change}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GPUSpecError, match=message):
        load_gpu_spec(path)


def test_unreadable_spec_files(tmp_path) -> None:
    with pytest.raises(GPUSpecError, match="cannot read"):
        load_gpu_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "gpu.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(GPUSpecError, match="not valid YAML"):
        load_gpu_spec(bad)
    bad.write_text("- a list\n")
    with pytest.raises(GPUSpecError, match="a mapping of fields"):
        load_gpu_spec(bad)
    assert set(SPEC_FIELDS) >= {"memory_gib", "fp16_tflops", "sm_count", "l2_mib", "boost_clock_mhz"}


def test_the_roofline_puts_each_kernel_on_the_gpus_peak_for_its_precision() -> None:
    """One fp16 matmul and one elementwise kernel: the matmul at the GPU's fp16 tensor peak, the other at
    its bandwidth; a spec with twice the bandwidth halves the memory-bound kernel alone."""
    from dprobe.profiling.coldstart.features import LAUNCH_S, roofline_seconds
    from dprobe.profiling.coldstart.memtrack import FORWARD, OP_CLASSES, ReplayOp
    from dprobe.profiling.coldstart.replay import ReplayEstimate

    mm, ew = OP_CLASSES.index("matmul"), OP_CLASSES.index("elementwise")
    ops = [ReplayOp(FORWARD, mm, 1, 1e12, 1e6), ReplayOp(FORWARD, ew, 1, 1e3, 1e10)]
    est = ReplayEstimate(*([1.0] * 13), ops=ops)
    t = roofline_seconds(est, "fp16", GPUS["rtx3090"])
    expected = 1e12 / 71e12 + 1e10 / 936e9 + 2 * LAUNCH_S
    assert t["gpu"] == pytest.approx(expected)
    t4 = roofline_seconds(est, "fp16", GPUS["t4"])
    assert t4["compute"] == pytest.approx(1e12 / 65e12 + 1e3 / 8.1e12)
    fast = GPUSpec(**{**GPUS["rtx3090"].__dict__, "bandwidth": 2 * 936e9})
    assert roofline_seconds(est, "fp16", fast)["memory"] == pytest.approx(t["memory"] / 2)
    assert math.isclose(roofline_seconds(est, "bf16", GPUS["t4"])["compute"], 1e12 / 8.1e12 + 1e3 / 8.1e12)


def test_cli_refuses_a_bad_gpu_spec_before_replaying(tmp_path, capsys) -> None:
    from dprobe.cli import main

    path = tmp_path / "gpu.yaml"
    path.write_text("name: mystery\nmemory_gib: 16\n")
    assert main(["predict", "torchvision:resnet18", "--batch", "8", "--gpu-spec", str(path), "--json"]) == 2
    assert "field 'fp32_tflops' missing" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RTX4090))
    assert main(["predict", "torchvision:resnet18", "--batch", "8", "--gpu-spec", str(good), "--gpu", "a100"]) == 2
    assert "not both" in capsys.readouterr().err


MEASURED = {"fp32_tflops": 70.1, "tf32_tflops": 75.0, "fp16_tflops": 150.2, "bf16_tflops": 149.8,
            "fp16_acc16_tflops": 290.0, "bandwidth_gbps": 912.5, "launch_overhead_us": 4.2,
            "conv": {"3x3 c256 56px b64": 101.5}, "attention": {"b32 h12 s1024 d64": 120.0},
            "fraction_of_peak": {"fp16": 0.909}, "torch": "2.9.1", "cuda": "12.8", "date": "2026-12-07T21:00:00Z",
            "device": "NVIDIA GeForce RTX 4090", "seconds": 41.5}


def test_a_measured_block_is_read_as_the_gpus_calibration(tmp_path) -> None:
    """``dprobe gpu calibrate``'s block: the measured peaks replace the spec sheet's on the roofline it is put on
    (measured_spec), the spec sheet stays what the file says, and the block survives the prediction's JSON."""
    from dprobe.core.gpus import fractions_of_peak, measured_spec

    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**RTX4090, "measured": MEASURED}))
    spec = load_gpu_spec(path)
    cal = spec.calibration
    assert spec.peak_half("fp16") == 165.2e12 and cal is not None
    assert cal.flops_fp16 == pytest.approx(150.2e12) and cal.bandwidth == pytest.approx(912.5e9)
    assert cal.launch_overhead_s == pytest.approx(4.2e-6) and dict(cal.conv)["3x3 c256 56px b64"] == pytest.approx(101.5e12)
    assert dict(cal.software) == {"device": "NVIDIA GeForce RTX 4090", "torch": "2.9.1", "cuda": "12.8",
                                  "date": "2026-12-07T21:00:00Z", "seconds": "41.5"}
    m = measured_spec(spec)
    assert (m.peak_half("fp16"), m.peak_flops_bf16, m.peak_flops_tf32, m.peak_flops_fp32, m.bandwidth) == pytest.approx(
        (150.2e12, 149.8e12, 75e12, 70.1e12, 912.5e9))
    assert m.memory_bytes == spec.memory_bytes and measured_spec(GPUS["h200"]) == GPUS["h200"]
    assert fractions_of_peak(spec, cal)["fp16"] == pytest.approx(150.2 / 165.2, rel=1e-4)
    again = gpu_spec_from_dict(spec_as_dict(spec))  # the prediction's gpu_spec reads back, measured block and all
    assert again == spec
    # only the required figures: the others keep the spec sheet's on the measured roofline
    partial = gpu_spec_from_dict({**RTX4090, "measured": {"fp32_tflops": 70, "fp16_tflops": 150, "bandwidth_gbps": 900}})
    assert measured_spec(partial).peak_flops_tf32 == 82.6e12 and partial.calibration.conv == ()


@pytest.mark.parametrize(("measured", "message"), [
    ({"fp16_tflops": 150, "bandwidth_gbps": 900}, "field 'measured.fp32_tflops' missing"),
    ({**MEASURED, "bandwidth_gbps": 0}, "field 'measured.bandwidth_gbps' = 0 is implausible"),
    ({**MEASURED, "fp16_tflops": "fast"}, "field 'measured.fp16_tflops' must be a number"),
    ({**MEASURED, "hbm_gbps": 3}, "unknown field 'measured.hbm_gbps'"),
    ({**MEASURED, "conv": [1, 2]}, "field 'measured.conv' is a mapping"),
    ({**MEASURED, "conv": {"a": -1}}, "field 'measured.conv.a' = -1 is implausible"),
    ([1, 2], "field 'measured' is a mapping"),
])
def test_a_bad_measured_block_is_refused_naming_the_field(measured, message) -> None:
    with pytest.raises(GPUSpecError, match=message):
        gpu_spec_from_dict({**RTX4090, "measured": measured})
