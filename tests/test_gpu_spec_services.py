"""GPU spec files in the services: a file ``dprobe gpu calibrate`` wrote (through the fake device layer) or a
spec sheet, read by the sidecar's job profiles (a GPU it names by its NVML name or a job's ``gpu=``, predicted
as ``dprobe predict --gpu-spec`` predicts it) and by the scaler's sharing settings (the GPUs' name and memory);
bad files stop the start in one line naming the file and the field."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dprobe.cli import main
from dprobe.core.gpu_registry import GPUSpecFiles, gpu_name_key
from dprobe.core.gpus import GPUS, GPUSpecError, load_gpu_spec
from dprobe.forecaster.loading import open_forecaster
from dprobe.profiling.calibrate import run as calibrate_run
from dprobe.profiling.calibrate.device import AttentionShape, ConvShape, FakeDevice
from dprobe.profiling.calibrate.run import Suite
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.scaler.config import load_config as load_scaler_config
from dprobe.services.sidecar.collector import SidecarCollector
from dprobe.services.sidecar.config import SidecarConfig, load_config
from dprobe.services.sidecar.jobs import JobProfiles, JobSpec, predict_fields
from dprobe.services.sidecar.service import Sidecar
from dprobe.services.sources import Sample

SMALL = Suite(matmul_sizes=(1024, 4096), copy_bytes=1 << 28, launches=100,
              convs=(ConvShape("3x3", 8, 64, 64, 32),), attentions=(AttentionShape("att", 2, 4, 256, 64),))
PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"  # not in dprobe's table: NVML's name of it
RESULT = {"device_memory_bytes": {"p50": 5e9, "p90": 6e9}, "peak_memory_bytes": {"p50": 3e9, "p90": 3.2e9},
          "gpu_utilization": {"p50": 0.7, "p90": 0.9}, "step_time_seconds": {"p50": 0.1, "p90": 0.12}, "fits": "yes",
          "method": "calibrated"}
SHEET = {"name": "Mystery GPU 9000", "aliases": ["NVIDIA MGX-9000"], "memory_gib": 48, "fp32_tflops": 80,
         "fp16_tflops": 320, "bandwidth_gbps": 1500, "sm_count": 120, "l2_mib": 64, "boost_clock_mhz": 2400}


def calibrated_file(path: Path, monkeypatch: pytest.MonkeyPatch, device: str = PRO6000,
                    sheet: dict | None = None) -> Path:
    """``dprobe gpu calibrate --out path`` on a fake GPU named ``device`` (with ``--spec`` ``sheet``, if any)."""
    import dprobe.profiling.calibrate.device as device_layer

    monkeypatch.setattr(device_layer, "TorchDevice", lambda name: FakeDevice(
        name=device, flops={"fp32": 88e12, "tf32": 88e12, "fp16": 250e12, "bf16": 250e12}, bandwidth=1.5e12))
    monkeypatch.setattr(calibrate_run, "Suite", lambda: SMALL)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = ["gpu", "calibrate", "--quiet", "--out", str(path)]
    if sheet is not None:
        sheet_path = path.parent.parent / f"{path.stem}-sheet.yaml"  # not beside the file: another spec of it
        sheet_path.write_text(yaml.safe_dump(sheet))
        args += ["--spec", str(sheet_path)]
    assert main(args) == 0
    return path


PRO6000_SHEET = {"name": "RTX PRO 6000 Blackwell", "memory_gib": 96, "fp32_tflops": 104.8, "tf32_tflops": 104.8,
                 "bf16_tflops": 503.8, "fp16_tflops": 503.8, "bandwidth_gbps": 1792, "sm_count": 188,
                 "l2_mib": 96, "boost_clock_mhz": 2407}


# the sidecar's jobs --------------------------------------------------------------------------------------------
def test_a_node_gpu_missing_from_the_table_is_predicted_with_its_calibrated_file(tmp_path, monkeypatch) -> None:
    """NVML names a GPU dprobe has no figures for; the file calibrated on it (``measured.device``) gives them:
    its jobs run on it, not on the default H200, and the child is handed the file's data."""
    specs = tmp_path / "gpus"
    specs.mkdir()
    path = calibrated_file(specs / "pro6000.yaml", monkeypatch, sheet=PRO6000_SHEET)
    runner = CapturingRunner(RESULT)
    jobs = JobProfiles(default="timm:resnet18 batch=64 precision=fp16 mode=inference", gpu=lambda: PRO6000,
                       gpu_specs=[str(specs)], runner=runner)
    assert jobs.spec("ml/x").gpu == "rtx-pro-6000-blackwell"  # the file's name, as gpu= gives it
    jobs.profiles(["ml/x"])
    jobs.run_pending()
    [profile] = jobs.profiles(["ml/x"]).values()
    assert (profile.gpu_spec, profile.method) == (str(path), "calibrated")
    assert profile.info["gpu"] == "rtx-pro-6000-blackwell" and profile.info["gpu_spec"] == str(path)
    [args] = runner.asked
    assert args["gpu_spec_file"] == str(path) and args["gpu_spec"]["measured"]["device"] == PRO6000
    # without the file, the same node is predicted for the default GPU
    assert JobProfiles(default="timm:resnet18 batch=64", gpu=lambda: PRO6000, predict=lambda s: RESULT
                       ).spec("ml/x").gpu == "h200"


class CapturingRunner:
    """A :class:`ChildRunner` stand-in that keeps what a child would be handed (as JSON) and answers ``answer``."""

    limits = None
    stopping = False

    def __init__(self, answer: Any = None) -> None:
        self.asked: list[dict[str, Any]] = []
        self.answer = answer

    def run(self, task: str, args: dict) -> Any:
        self.asked.append(json.loads(json.dumps(args)))
        return self.answer if self.answer is not None else predict_fields(**self.asked[-1])  # as the child runs it


@pytest.mark.slow
def test_the_sidecars_prediction_on_a_spec_file_is_dprobe_predicts(tmp_path, monkeypatch, capsys) -> None:
    """What the child computes for a spec file's GPU is ``dprobe predict --gpu-spec FILE --json``: calibrated
    (measured peaks) and spec sheet only alike."""
    path = calibrated_file(tmp_path / "calibrated" / "pro6000.yaml", monkeypatch, sheet=PRO6000_SHEET)
    plain = tmp_path / "sheet" / "pro6000.yaml"
    plain.parent.mkdir()
    plain.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "measured"}))
    cli = ["predict", "timm:resnet18", "--batch", "64", "--image", "160", "--precision", "fp16", "--mode",
           "inference", "--json"]
    for spec_path, method in ((path, "calibrated"), (plain, "sibling-factor")):
        jobs = JobProfiles(default="timm:resnet18 batch=64 image=160 precision=fp16 mode=inference",
                           gpu=lambda: PRO6000,  # the sheet's "RTX PRO 6000 Blackwell": its words are all in it
                           gpu_specs=[str(spec_path)], runner=CapturingRunner())
        jobs.profiles(["ml/x"])
        jobs.run_pending()
        [profile] = jobs.profiles(["ml/x"]).values()
        assert main([*cli, "--gpu-spec", str(spec_path)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (profile.method, profile.gpu_spec) == (out["method"], str(spec_path)) and out["method"] == method
        assert profile.values["step_seconds"] == {"0.5": out["step_time_seconds"]["p50"],
                                                  "0.9": out["step_time_seconds"]["p90"]}
        assert profile.values["gpu_memory_bytes"]["0.9"] == out["device_memory_bytes"]["p90"]
        assert profile.fits == out["fits"]


def test_an_unknown_nvml_name_is_matched_by_a_spec_files_name_or_alias(tmp_path) -> None:
    sheet = tmp_path / "mystery.yaml"
    sheet.write_text(yaml.safe_dump(SHEET))
    gpus = GPUSpecFiles.load([str(sheet)])
    [f] = gpus
    assert (f.key, f.calibrated) == ("mystery-gpu-9000", False)
    for name in ("NVIDIA MGX-9000", "nvidia mgx 9000", "Mystery GPU 9000", "NVIDIA Mystery GPU 9000 PCIe"):
        assert gpus.match(name) is f, name
    assert gpus.match("NVIDIA MGX-9000X") is None and gpus.match("NVIDIA H100 80GB HBM3") is None
    assert gpus.get("MGX-9000") is f and gpus.get("mystery-gpu-9000") is f and gpus.get("h100") is None
    # a target's GPU as its samples name it (dcgm-exporter's modelName), and the node's through NVML
    jobs = JobProfiles(default="torchvision:resnet50 batch=4", predict=lambda s: RESULT, gpu=lambda: "NVIDIA MGX-9000",
                       gpu_specs=gpus)
    assert jobs.spec("a/x", "NVIDIA MGX-9000").gpu == "mystery-gpu-9000"
    assert jobs.spec("a/y", "NVIDIA H100 80GB HBM3").gpu == "h100"  # the table still serves the GPUs it has
    assert jobs.spec("a/z", "Tesla K80").gpu == "mystery-gpu-9000"  # unknown: this node's GPU, from the file
    assert jobs.spec_file(jobs.spec("a/x", "NVIDIA MGX-9000")) is f


def test_the_most_specific_spec_file_wins_and_a_file_overrides_the_table(tmp_path) -> None:
    (tmp_path / "4080.yaml").write_text(yaml.safe_dump({**SHEET, "name": "RTX 4080", "aliases": []}))
    (tmp_path / "4080s.yaml").write_text(yaml.safe_dump({**SHEET, "name": "RTX 4080 SUPER", "aliases": []}))
    (tmp_path / "h100.yaml").write_text(yaml.safe_dump({**SHEET, "name": "H100", "memory_gib": 79.6, "aliases": []}))
    (tmp_path / "notes.txt").write_text("not a spec")
    (tmp_path / "..data").mkdir()  # a ConfigMap volume's own entries are not specs
    gpus = GPUSpecFiles.load([str(tmp_path)])
    assert sorted(gpus.keys) == ["h100", "rtx-4080", "rtx-4080-super"]
    assert gpus.match("NVIDIA GeForce RTX 4080 SUPER").key == "rtx-4080-super"
    assert gpus.match("NVIDIA GeForce RTX 4080").key == "rtx-4080"
    jobs = JobProfiles(default="torchvision:resnet50 batch=4 gpu=h100", predict=lambda s: RESULT, gpu_specs=gpus)
    assert jobs.spec_file(jobs.spec("a/x")).path == str(tmp_path / "h100.yaml")


def test_a_job_or_its_annotation_names_a_spec_files_gpu(tmp_path) -> None:
    sheet = tmp_path / "mystery.yaml"
    sheet.write_text(yaml.safe_dump(SHEET))
    ann = tmp_path / "annotations"
    ann.write_text('dprobe.io/training-job="torchvision:resnet18 batch=16 gpu=\'Mystery GPU 9000\'"\n')
    jobs = JobProfiles({"pinned/*": "torchvision:resnet50 batch=4 gpu=mgx-9000"}, annotations_file=str(ann),
                       gpu="a100", gpu_specs=[str(sheet)], predict=lambda s: RESULT)
    assert jobs.spec("any/pod").gpu == "mystery-gpu-9000" and jobs.spec("pinned/x").gpu == "mystery-gpu-9000"
    with pytest.raises(ValueError, match=r"gpu must be one of h200, .*, or a GPU of gpu_spec_files "
                                         r"\(mystery-gpu-9000\), got 'mgx-900'"):
        JobSpec.parse("torchvision:resnet50 batch=4 gpu=mgx-900", jobs.gpu_specs)
    with pytest.raises(ValueError, match="gpu must be one of h200"):  # no spec files: the table only
        JobSpec.parse("torchvision:resnet50 batch=4 gpu=mgx-9000")
    config = load_config({}, env={"DPROBE_SIDECAR_GPU_SPEC_FILES": f"{sheet}",
                                  "DPROBE_SIDECAR_JOB": "torchvision:resnet50 batch=4 gpu=mgx-9000"})
    assert config.workload.gpu_spec_files == str(sheet)
    with pytest.raises(ValueError, match="job: .*gpu must be one of"):
        load_config({}, env={"DPROBE_SIDECAR_JOB": "torchvision:resnet50 batch=4 gpu=mgx-9000"})


def test_the_sidecar_exports_the_spec_file_and_the_method(tmp_path) -> None:
    sheet = tmp_path / "mystery.yaml"
    sheet.write_text(yaml.safe_dump(SHEET))
    config = SidecarConfig(listen_address="127.0.0.1", port=0, job="torchvision:resnet50 batch=4",
                           gpu_spec_files=str(tmp_path))
    sc = Sidecar(config, sources=[], model=open_forecaster(None, "last_value"))
    sc.jobs._predict = lambda spec: RESULT  # the prediction itself: test_the_sidecars_prediction_on_a_spec_file...
    sc._sink([Sample("ml/trainer-0", time.time(), 2e9, 0.5, {"namespace": "ml", "pod": "trainer-0"},
                     gpu_model="NVIDIA MGX-9000")], "dcgm")
    sc.job_rows(sc.latest_samples(), {"ml/trainer-0"})
    sc.jobs.run_pending()
    [row] = sc.job_rows(sc.latest_samples(), {"ml/trainer-0"})
    assert (row.info["gpu"], row.info["gpu_spec"], row.info["method"]) == ("mystery-gpu-9000", str(sheet),
                                                                          "calibrated")
    [info] = [m for m in SidecarCollector._jobs([row]) if m.name == "dprobe_job"]
    [sample] = info.samples
    assert (sample.labels["gpu"], sample.labels["gpu_spec"], sample.labels["method"]) == (
        "mystery-gpu-9000", str(sheet), "calibrated")


@pytest.mark.parametrize(("edit", "message"), [
    ({"memory_gib": None}, "field 'memory_gib' missing"),
    ({"hbm_gbps": 3}, "unknown field 'hbm_gbps'"),
    ({"aliases": "NVIDIA MGX-9000"}, "field 'aliases' must be a list of names"),
    ({"bandwidth_gbps": 5}, "field 'bandwidth_gbps' = 5 is implausible"),
])
def test_a_bad_spec_file_stops_the_sidecar_in_one_line(tmp_path, capsys, edit: dict, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in {**SHEET, **edit}.items() if v is not None}))
    with pytest.raises(GPUSpecError, match=f"{path}: {message}"):
        load_config({}, env={"DPROBE_SIDECAR_GPU_SPEC_FILES": str(path)})
    assert main(["sidecar", "--gpu-spec-files", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"dprobe sidecar: error: {path}: {message}" in err


def test_unreadable_duplicate_and_malformed_spec_files_are_named(tmp_path) -> None:
    with pytest.raises(GPUSpecError, match=f"{tmp_path / 'none.yaml'}: cannot read the GPU spec"):
        GPUSpecFiles.load([str(tmp_path / "none.yaml")])
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(SHEET))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**SHEET, "name": "MGX 9000", "aliases": []}))
    with pytest.raises(GPUSpecError, match=r"b.yaml: the GPU name 'mgx-9000' is given by .*a.yaml too"):
        GPUSpecFiles.load([str(tmp_path)])
    (tmp_path / "b.yaml").write_text("name: [unclosed\n")
    with pytest.raises(GPUSpecError, match="b.yaml: not valid YAML"):
        GPUSpecFiles.load([str(tmp_path)])
    assert len(GPUSpecFiles.load([str(tmp_path / "a.yaml"), str(tmp_path / "a.yaml")])) == 1
    assert gpu_name_key("NVIDIA GeForce RTX-4090") == "geforce-rtx-4090"


# the scaler's sharing ------------------------------------------------------------------------------------------
def test_the_scalers_sharing_reads_the_gpu_from_a_calibrated_file(tmp_path, monkeypatch) -> None:
    """An unknown GPU calibrated on its node: its name and memory (the device's) from the file."""
    path = calibrated_file(tmp_path / "fake.yaml", monkeypatch, device="NVIDIA Fake GPU")
    s = ScalerConfig(sharing_enabled=True, sharing_gpu_spec_file=str(path)).validate().sharing_settings()
    assert s is not None and s.gpu.name == "NVIDIA Fake GPU" and s.capacity == 24 * 2**30
    assert s.gpu.mig_profiles == ()
    with pytest.raises(ValueError, match="sharing_mode mig needs a MIG-capable sharing_gpu_model, got 'NVIDIA Fake GPU'"):
        ScalerConfig(sharing_enabled=True, sharing_mode="mig", sharing_gpu_spec_file=str(path)).validate()
    same = ScalerConfig(sharing_enabled=True, sharing_gpu_spec_file=str(path), sharing_gpu_memory_bytes=24 * 2**30)
    assert same.validate().sharing_settings().capacity == 24 * 2**30
    yaml_config = tmp_path / "scaler.yaml"
    yaml_config.write_text(f"sharing:\n  enabled: true\n  mode: mps\n  gpu_spec_file: {path}\n")
    assert load_scaler_config({"config": str(yaml_config)}, env={}).sharing_settings().capacity == 24 * 2**30


def test_a_calibrated_mig_gpu_keeps_its_mig_profiles(tmp_path, monkeypatch) -> None:
    """A calibrated H100 (spec sheet from dprobe's table, memory as NVML reports it): mode mig gets the
    H100-80GB's profiles, and the capacity is the file's memory."""
    path = calibrated_file(tmp_path / "h100.yaml", monkeypatch, device="NVIDIA H100 80GB HBM3")
    assert load_gpu_spec(path).name == GPUS["h100"].name
    s = ScalerConfig(sharing_enabled=True, sharing_mode="mig", sharing_gpu_spec_file=str(path),
                     sharing_mig_profiles="1g.10gb,3g.40gb").validate().sharing_settings()
    assert s is not None and [p.name for p in s.mig_profiles] == ["1g.10gb", "3g.40gb"]
    assert s.capacity == pytest.approx(GPUS["h100"].memory_bytes, rel=1e-4)


@pytest.mark.parametrize(("options", "message"), [
    ({"sharing_gpu_model": "H100-80GB"}, "sharing_gpu_spec_file .* and sharing_gpu_model 'H100-80GB' both name "
                                         "the GPU: give one of them"),
    ({"sharing_gpu_memory_bytes": 80e9}, "sharing_gpu_memory_bytes 8e\\+10 contradicts sharing_gpu_spec_file"),
])
def test_conflicting_sharing_gpu_options_are_refused(tmp_path, options: dict, message: str) -> None:
    path = tmp_path / "mystery.yaml"
    path.write_text(yaml.safe_dump(SHEET))
    with pytest.raises(ValueError, match=message):
        ScalerConfig(sharing_enabled=True, sharing_gpu_spec_file=str(path), **options).validate()


def test_a_bad_sharing_spec_file_is_named_with_its_field(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in SHEET.items() if k != "memory_gib"}))
    with pytest.raises(ValueError, match=f"^sharing_gpu_spec_file: {path}: field 'memory_gib' missing$"):
        ScalerConfig(sharing_enabled=True, sharing_gpu_spec_file=str(path)).validate()
    with pytest.raises(ValueError, match="sharing_gpu_spec_file: .*none.yaml: cannot read the GPU spec"):
        ScalerConfig(sharing_enabled=True, sharing_gpu_spec_file=str(tmp_path / "none.yaml")).validate()
