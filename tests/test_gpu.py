"""Checks that need an NVIDIA GPU: NVML readings, training on the GPU, and cold-start predictions against
a real training step. Skipped without one; run them on a GPU machine with ``pytest -m gpu``."""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]

GIB = 1024**3


def test_nvml_source_reads_the_gpu_and_this_process():
    """The sidecar's NVML source sees the GPU's used memory and this process's share, named by its pod."""
    from dprobe.services.sources.nvml import NvmlSource

    block = torch.empty(GIB, dtype=torch.uint8, device="cuda")  # 1 GiB held while NVML looks
    torch.cuda.synchronize()
    source = NvmlSource(per_process=True, pod_names={"uid-1": "team-a/trainer-0"},
                        pod_resolver=lambda pid: ("uid-1", "c" * 64) if pid == os.getpid() else None)
    try:
        samples = source.poll()
    finally:
        source.close()
        del block
    gpus = [s for s in samples if "pod" not in s.labels]
    assert gpus and gpus[0].labels["gpu"] == "0" and gpus[0].labels["UUID"].startswith("GPU-")
    assert GIB <= gpus[0].memory_bytes < gpus[0].extra["memory_total_bytes"]
    assert 0.0 <= gpus[0].utilization_ratio <= 1.0
    pods = [s for s in samples if s.labels.get("pod") == "trainer-0"]
    assert len(pods) == 1 and pods[0].labels["namespace"] == "team-a"
    assert pods[0].memory_bytes >= GIB  # NVML's per-process figure includes the CUDA context too
    assert pods[0].labels["UUID"] == gpus[0].labels["UUID"]


def test_forecaster_trains_on_the_gpu_and_its_checkpoint_loads_on_the_cpu(tmp_path, small_alibaba_dir,
                                                                          small_helios_dir):
    """``trainer=gpu`` (bf16 mixed precision) trains; the checkpoint forecasts on the CPU."""
    from dprobe.config import compose
    from dprobe.forecaster.base import ForecastInput
    from dprobe.forecaster.loading import load_forecaster
    from dprobe.training import run

    dirs = f"{small_alibaba_dir},{small_helios_dir}"
    cfg = compose([f"paths.output_dir={tmp_path}", f"data.datasets=[{dirs}]", "data.samples_per_epoch=512",
                   "data.val_samples=64", "data.batch_size=64", "trainer=gpu", "trainer.max_epochs=2",
                   "trainer.enable_progress_bar=false", "evaluate.enabled=false"])
    assert cfg.trainer.accelerator == "gpu"
    summary = run(cfg)
    ckpt = torch.load(summary["checkpoint"], weights_only=True, map_location="cpu")
    assert ckpt["kind"] == "dprobe-forecaster"
    model = load_forecaster(summary["checkpoint"])
    f = model.predict(ForecastInput(values=np.linspace(10, 20, 50)[None, :], metric="gpu_demand", leads=(6,),
                                    step_seconds=300))
    assert np.all(np.isfinite(f.quantiles)) and np.all(np.diff(f.quantiles, axis=-1) >= 0)


def _measure_training(model_name: str, batch: int, precision: str, steps: int = 12) -> dict[str, float]:
    """Train ``steps`` AdamW steps as the h200-profiles collector does; the allocator's peak, NVML's used
    bytes with the allocator's cache still held, and the median step time."""
    import pynvml

    from dprobe.graph.zoo import build_module, example_inputs, parse_spec

    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    spec = parse_spec(model_name)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_module(spec, device="cuda")
    ex = example_inputs(spec, model, batch, labels=True, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(*ex.args, **ex.kwargs)
            if ex.loss == "output":
                loss = out.loss
            else:
                logits = out[0] if isinstance(out, tuple) else out
                loss = torch.nn.functional.cross_entropy(
                    logits, torch.randint(0, logits.shape[-1], (batch,), device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t)
    pynvml.nvmlInit()
    try:
        used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    finally:
        pynvml.nvmlShutdown()
    result = {"peak": float(torch.cuda.max_memory_allocated()), "nvml": float(used),
              "step": statistics.median(times[3:])}
    del model, opt, ex, out, loss
    torch.cuda.empty_cache()
    return result


@pytest.mark.parametrize(("model", "batch", "precision", "step_rel"), [
    ("torchvision:resnet50", 64, "fp32", 0.5),  # mostly GPU-bound: the host's speed matters little
    ("transformers:GPT2Config/GPT2LMHeadModel", 8, "bf16", None),  # host-bound: see the host-factor test
])
def test_cold_start_prediction_matches_a_real_training_step(model, batch, precision, step_rel):
    """``dprobe predict`` (no GPU needed) against the same job trained here for real."""
    from dprobe.profiling.coldstart.predict import predict_job

    pred = predict_job(model, batch, precision, "adamw")
    real = _measure_training(model, batch, precision)
    print(f"{model} b{batch} {precision}: peak {pred.peak_memory_bytes.p50 / GIB:.2f} vs "
          f"{real['peak'] / GIB:.2f} GiB, NVML {pred.device_memory_bytes.p50 / GIB:.2f} vs "
          f"{real['nvml'] / GIB:.2f} GiB, step {pred.step_time_seconds.p50 * 1e3:.1f} vs "
          f"{real['step'] * 1e3:.1f} ms")
    assert pred.peak_memory_bytes.p50 == pytest.approx(real["peak"], rel=0.10)
    assert pred.device_memory_bytes.p50 == pytest.approx(real["nvml"], rel=0.15)
    if step_rel is not None:
        assert pred.step_time_seconds.p50 == pytest.approx(real["step"], rel=step_rel)


def test_host_factor_from_one_host_bound_job_carries_to_another():
    """The documented recipe for a host of unknown speed: one host-bound job's measured step over its
    prediction at factor 1 gives ``--host-factor``, which then predicts another host-bound job's step."""
    from dprobe.profiling.coldstart.predict import predict_job

    calibration = ("transformers:GPT2Config/GPT2LMHeadModel", 8, "bf16")
    target = ("transformers:BertConfig/BertForSequenceClassification", 32, "bf16")
    at_one = predict_job(*calibration, "adamw").step_time_seconds.p50
    factor = _measure_training(*calibration)["step"] / at_one
    uncalibrated = predict_job(*target, "adamw").step_time_seconds.p50
    pred = predict_job(*target, "adamw", host_factor=factor).step_time_seconds.p50
    real = _measure_training(*target)["step"]
    print(f"host factor {factor:.2f}: BERT-base b32 bf16 step {pred * 1e3:.1f} ms "
          f"(at factor 1: {uncalibrated * 1e3:.1f}) vs {real * 1e3:.1f} ms")
    assert pred == pytest.approx(real, rel=0.3)
    assert abs(pred / real - 1) <= abs(uncalibrated / real - 1) + 0.05  # calibrating does not make it worse


def test_collector_host_benchmark_times_kernel_launches(collector):
    """The collector records how fast the host issues kernels, to tell hosts of the same GPU apart."""
    bench = collector.host_benchmark(cuda=True, n=2000)
    print("host benchmark", bench, collector.host_cpu())
    assert set(bench) == {"host_launch_us", "host_linear_us", "host_sync_us"}
    assert all(0 < v < 1000 for v in bench.values())
    assert bench["host_sync_us"] > bench["host_launch_us"]  # a round trip costs more than a queued launch
