"""The limits physics gives the co-location models, asserted on random pairs (hypothesis): a job beside an
idle one runs at full speed, more load beside a job never speeds it up, a speed stays within (0, 1] with its
p10 below it, and a pair never needs less memory than its two jobs. Every method is checked, ``auto`` (the
shipped default) on GPUs inside and outside the per-job model's support."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dprobe.sharing.interference import METHODS, MODES, load_fitted, predict_colocation

GIB = 1 << 30
GPUS = [  # inside the per-job model's support (Kepler, Pascal, Volta) and outside it
    {"name": "Tesla K80 (one GK210)", "memory_gib": 11.2, "fp32_tflops": 4.37, "bandwidth_gbps": 240.0},
    {"name": "Tesla V100 SXM2 16GB", "memory_gib": 15.8, "fp32_tflops": 15.7, "bandwidth_gbps": 900.0},
    {"name": "GeForce RTX 3090", "memory_gib": 24.0, "fp32_tflops": 35.6, "bandwidth_gbps": 936.0},
    {"name": "H200 SXM 141GB", "memory_gib": 139.8, "fp32_tflops": 67.0, "bandwidth_gbps": 4800.0},
]
MODELS = ["torchvision:resnet50", "LM", "Recommendation", "A3C", "CycleGAN", "transformers:GPT2Config/GPT2LMHeadModel",
          "PPO", "module:my.pkg:factory"]

utilisation = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1e-6, 0.004, 0.0121, 0.5, 0.999, 1.0]))


@st.composite
def job(draw: st.DrawFn, gpu: dict) -> dict:
    """A ``dprobe predict --json`` object with what the co-location models read, drawn at random."""
    step = draw(st.floats(1e-4, 5.0))
    u = draw(utilisation)
    busy = draw(st.floats(0.0, 1.0)) * step
    memory = draw(st.floats(0.05, 0.6)) * gpu["memory_gib"] * GIB
    return {"model": draw(st.sampled_from(MODELS)), "batch": 8,
            "gpu_utilization": {"p50": u, "p90": min(1.0, u + 0.1)},
            "device_memory_bytes": {"p50": memory, "p90": memory * draw(st.floats(1.0, 1.3))},
            "peak_memory_bytes": {"p50": memory * 0.8, "p90": memory * 0.9},
            "step_time_seconds": {"p50": step, "p90": step * 1.2}, "gpu_spec": gpu,
            "analytical": {"flops_per_step": draw(st.floats(0.0, 1e15)), "gpu_seconds_per_step": busy,
                           "host_seconds_per_step": draw(st.floats(0.0, 1.0)) * step, "step_time_seconds": step}}


@st.composite
def pair(draw: st.DrawFn) -> tuple[dict, dict, str, str]:
    gpu = draw(st.sampled_from(GPUS))
    return draw(job(gpu)), draw(job(gpu)), draw(st.sampled_from(METHODS)), draw(st.sampled_from(MODES))


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_u(profile: dict, u: float) -> dict:
    return {**profile, "gpu_utilization": {"p50": u, "p90": min(1.0, u + 0.1)}}


@PROPERTY
@given(pair())
def test_a_job_beside_an_idle_one_runs_at_full_speed(p):
    a, b, method, mode = p
    out = predict_colocation(a, _with_u(b, 0.0), method=method, mode=mode)
    assert out["speeds"][0] == pytest.approx(1.0)


@PROPERTY
@given(pair(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_more_load_beside_a_job_never_speeds_it_up(p, u1, u2):
    a, b, method, mode = p
    lo, hi = sorted((u1, u2))
    light = predict_colocation(a, _with_u(b, lo), method=method, mode=mode)["speeds"][0]
    heavy = predict_colocation(a, _with_u(b, hi), method=method, mode=mode)["speeds"][0]
    assert heavy <= light + 1e-12


@PROPERTY
@given(pair(), st.floats(1.0, 3.0), st.floats(1.0, 30.0))
def test_a_partner_with_more_flops_or_memory_never_speeds_a_job_up(p, more_memory, more_flops):
    a, b, method, mode = p
    bigger = {**b, "device_memory_bytes": {k: v * more_memory for k, v in b["device_memory_bytes"].items()},
              "analytical": {**b["analytical"], "flops_per_step": b["analytical"]["flops_per_step"] * more_flops}}
    assert predict_colocation(a, bigger, method=method, mode=mode)["speeds"][0] <= predict_colocation(
        a, b, method=method, mode=mode)["speeds"][0] + 1e-12


@PROPERTY
@given(pair())
def test_speeds_and_their_intervals_stay_in_range(p):
    a, b, method, mode = p
    out = predict_colocation(a, b, method=method, mode=mode)
    for s, low in zip(out["speeds"], out["speeds_p10"], strict=True):
        assert 0 < s <= 1 and math.isfinite(s)
        assert 0 <= low <= s
    assert out["slowdowns_p90"] == pytest.approx([1 - x for x in out["speeds_p10"]])
    assert out["method"] != "auto" and out["why"]


@PROPERTY
@given(pair())
def test_a_pair_needs_at_least_its_two_jobs_memory(p):
    a, b, method, mode = p
    out = predict_colocation(a, b, method=method, mode=mode)
    for q in ("p50", "p90"):
        assert out["device_memory_bytes"][q] >= a["device_memory_bytes"][q] + b["device_memory_bytes"][q]
    assert out["device_memory_bytes"]["p90"] >= out["device_memory_bytes"]["p50"]


@PROPERTY
@given(pair())
def test_auto_runs_the_per_job_model_only_inside_its_support(p):
    a, b, _, _ = p
    out = predict_colocation(a, b)
    fitted = load_fitted()
    if out["method"] == "per-job":
        assert out["support"]["inside"] and fitted.per_job_default
        assert {"kepler", "pascal", "volta"} >= set(fitted.support.generations)
    else:
        assert out["method"] == "time-share"
        assert not out["support"]["inside"] or not fitted.per_job_default
        assert out["why"].startswith("outside the per-job model's support") or not fitted.per_job_default
