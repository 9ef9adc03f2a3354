"""Inference settings: channels-last and re-parameterised replays, the layout correction, torch.compile."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from dprobe.cli import main
from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.features import analytical_for, replay_cache_key
from dprobe.profiling.coldstart.predict import predict_job
from dprobe.profiling.coldstart.settings import (
    LAYOUT_FEATURES,
    InferenceSettings,
    LayoutCorrection,
    SettingsError,
    adjust_frame,
    choose,
    fit_layout,
    memory_format_of,
    predict_setting_step,
)
from dprobe.profiling.coldstart.stack import resolve_stack


class FlattenNet(nn.Module):
    """A convolution whose output is flattened: a view in NCHW, a copy in NHWC."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).flatten(1))

    def example_inputs(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, 3, 16, 16)


class _ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))

    def fuse(self) -> nn.Module:
        """The convolution with the batch norm folded in (a bias added)."""
        fused = nn.Conv2d(3, 8, 3, padding=1, bias=True)
        return fused


class FusableNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _ConvBn()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.block(x)).flatten(1)

    def example_inputs(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, 3, 16, 16)


def flatten_net() -> nn.Module:
    return FlattenNet()


def fusable_net() -> nn.Module:
    return FusableNet()


def plain_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())


@pytest.mark.slow
def test_a_channels_last_replay_records_the_copy_its_reshape_needs() -> None:
    spec = "module:test_predict_settings:flatten_net"
    first = analytical_for(spec, 4, "fp16", "none", mode="inference")
    last = analytical_for(spec, 4, "fp16", "none", mode="inference", memory_format="nhwc")
    assert last.kernels == first.kernels + 1  # flatten of an NHWC activation is a copy
    assert last.flops == first.flops


def test_the_replay_cache_keeps_the_settings_apart() -> None:
    plain = replay_cache_key("timm:resnet18", 8, "fp16", "none", 224, mode="inference")
    assert plain == replay_cache_key("timm:resnet18", 8, "fp16", "none", 224, mode="inference", memory_format="nchw")
    assert replay_cache_key("timm:resnet18", 8, "fp16", "none", 224, mode="inference",
                            memory_format="nhwc") == plain + "-nhwc"
    assert replay_cache_key("timm:resnet18", 8, "fp16", "none", 224, mode="inference",
                            reparameterize=True) == plain + "-reparam"
    with pytest.raises(ValueError, match="memory format"):
        replay_cache_key("timm:resnet18", 8, "fp16", "none", 224, memory_format="nwhc")


@pytest.mark.slow
def test_a_reparameterised_replay_runs_the_fused_model() -> None:
    spec = "module:test_predict_settings:fusable_net"
    plain = analytical_for(spec, 4, "fp16", "none", mode="inference")
    fused = analytical_for(spec, 4, "fp16", "none", mode="inference", reparameterize=True)
    assert fused.kernels < plain.kernels  # the batch norm folded into the convolution
    assert fused.param_bytes < plain.param_bytes
    with pytest.raises(Exception, match="nothing to re-parameterise"):
        analytical_for("module:test_predict_settings:plain_net", 4, "fp16", "none", mode="inference",
                       reparameterize=True)
    with pytest.raises(ValueError, match="inference"):
        analytical_for(spec, 4, "fp16", "adamw", reparameterize=True)


def test_memory_format_names() -> None:
    assert memory_format_of("channels-last") == "nhwc" and memory_format_of("channels_first") == "nchw"
    assert resolve_stack("rtx3090", {"memory_format": "channels-last"}, "inference").memory_format == "nhwc"
    with pytest.raises(ValueError, match="channels-first"):
        memory_format_of("nwhc")


def _frame(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: rng.uniform(0, 0.5, n) for c in LAYOUT_FEATURES})


def test_the_layout_correction_fits_the_op_class_shares() -> None:
    x = _frame()
    p50 = np.full(len(x), 0.01)
    measured = p50 * np.exp(-0.1 - 0.5 * x["share_conv"].to_numpy())  # NHWC faster where convolutions dominate
    factor, intercept, coef = fit_layout(x, measured, p50)
    lc = LayoutCorrection("model", factor, intercept, list(coef), 1.1, ["rtx3090"], len(x))
    got = p50 * np.exp(lc.log_factor(x))
    assert np.mean(np.abs(got - measured) / measured) < 0.02
    rule = p50 * np.exp(lc.log_factor(x, "rule"))
    assert np.mean(np.abs(rule - measured) / measured) > np.mean(np.abs(got - measured) / measured)
    assert choose([{"rule": 10, "model": 9}, {"rule": 10, "model": 11}]) == "rule"
    assert choose([{"rule": 10, "model": 9}]) == "model"


def test_adjust_frame_says_what_ran() -> None:
    x = _frame(3)
    lc = LayoutCorrection("rule", 0.9, 0.0, [0.0] * len(LAYOUT_FEATURES), 1.2, ["rtx3090"], 10)
    settings = InferenceSettings(layout=lc)
    p50, p90 = np.full(3, 0.01), np.full(3, 0.012)
    same = adjust_frame(x, p50, p90, settings=settings)
    assert same[2] == [] and np.allclose(same[0], p50)
    nhwc = adjust_frame(x, p50, p90, memory_format="channels-last", settings=settings)
    assert np.allclose(nhwc[0], 0.009) and np.allclose(nhwc[1], 0.009 * 1.2) and nhwc[2] == ["layout-rule"]
    both = adjust_frame(x, p50, p90, memory_format="nhwc", compiled=True, settings=settings)
    assert both[2] == ["layout-rule", "compile-factor"]
    assert np.allclose(both[0], 0.009 * settings.compile_factor)
    assert both[1][0] > both[0][0] * 1.2 and "not validated" in both[3][-1]


def test_settings_file_errors(tmp_path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text("{}")
    with pytest.raises(SettingsError, match="not dprobe inference settings"):
        InferenceSettings.load(bad)
    good = tmp_path / "g.json"
    InferenceSettings(layout=LayoutCorrection("model", 0.9, -0.1, [0.1] * 5, 1.2, ["rtx3090"], 9)).save(good)
    assert InferenceSettings.load(good).layout.method == "model"


def test_the_settings_are_inference_only() -> None:
    for kw in ({"reparameterize": True}, {"compiled": True}):
        with pytest.raises(ValueError, match="--mode inference only"):
            predict_job("torchvision:resnet18", 8, "fp16", **kw)


@pytest.mark.slow
def test_dprobe_predict_with_the_settings(capsys) -> None:
    assert main(["predict", "torchvision:resnet18", "--mode", "inference", "--batch", "32", "--precision", "fp16",
                 "--gpu", "rtx3090", "--memory-format", "channels-last", "--compile", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"]["memory_format"] == "nhwc" and "compile-factor" in out["method"]
    assert "channels-last" in out["note"] and "torch.compile" in out["note"]
    eager = predict_setting_step(analytical_for("torchvision:resnet18", 32, "fp16", "none", image=None,
                                                mode="inference", memory_format="nhwc"),
                                 "fp16", GPUS["rtx3090"], memory_format="nhwc")
    assert out["step_time_seconds"]["p50"] == pytest.approx(eager.p50 * InferenceSettings(None).compile_factor)


def test_channels_last_training_takes_the_rule_where_it_ships() -> None:
    from dprobe.profiling.coldstart.settings import train_layout_step

    rule = InferenceSettings(layout=None, train_layout={"method": "rule", "factor": 0.9, "p90": 1.3,
                                                         "cv": {"mape": {"rule": 22.0, "proxy": 23.8}}})
    p50, p90, suffix, note = train_layout_step(0.1, 0.12, rule)
    assert (p50, suffix) == (pytest.approx(0.09), "layout-rule") and p90 == pytest.approx(0.09 * 1.3)
    assert "22.0 %" in note
    proxy = InferenceSettings(layout=None, train_layout={"method": "proxy", "factor": 0.9, "p90": 1.3})
    assert train_layout_step(0.1, 0.12, proxy)[:3] == (0.1, 0.12, "")


def test_reparameterize_step_follows_the_shipped_choice() -> None:
    assert InferenceSettings(layout=None).reparameterized_step()
    assert not InferenceSettings(layout=None, reparameterize={"method": "proxy"}).reparameterized_step()
