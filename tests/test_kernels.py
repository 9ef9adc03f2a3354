"""Per-kernel efficiency from a GPU's spec sheet (dprobe.profiling.kernels) on NeuSight's measured calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.data.common import DatasetError
from dprobe.profiling.kernels.data import load_device_specs, load_neusight, op_cost
from dprobe.profiling.kernels.model import (
    KernelModel,
    crossval,
    default_model,
    fit,
    launch_overhead,
    predict_kernel_latency,
)

NEUSIGHT = Path(__file__).resolve().parents[1] / "datasets" / "neusight-kernels"


@pytest.fixture(scope="module")
def calls() -> pd.DataFrame:
    return load_neusight(NEUSIGHT, ops=("bmm", "linear", "conv", "add", "relu", "softmax"))


@pytest.fixture(scope="module")
def specs():
    return load_device_specs(NEUSIGHT)


def test_costs_of_known_shapes():
    frame = pd.DataFrame({"op": ["bmm", "linear", "conv", "add", "relu"],
                          "B": [2, 3, 1, 4, 4], "M": [3, 5, np.nan, np.nan, np.nan], "N": [4, 6, np.nan, np.nan, np.nan],
                          "K": [5, 7, np.nan, np.nan, np.nan], "H": [np.nan, np.nan, np.nan, 10, 10],
                          "in_channels": [np.nan, np.nan, 3, np.nan, np.nan],
                          "out_channels": [np.nan, np.nan, 8, np.nan, np.nan],
                          "kernel": [np.nan, np.nan, 3, np.nan, np.nan], "image": [np.nan, np.nan, 32, np.nan, np.nan],
                          "stride": [np.nan, np.nan, 1, np.nan, np.nan], "padding": [np.nan, np.nan, 1, np.nan, np.nan]})
    flops, moved = op_cost(frame)
    assert flops[0] == 2 * 2 * 3 * 4 * 5 and moved[0] == 4 * 2 * (3 * 5 + 5 * 4 + 3 * 4)
    assert flops[1] == 2 * 3 * 5 * 6 * 7 and moved[1] == 4 * (3 * 5 * 7 + 6 * 7 + 3 * 5 * 6)
    assert flops[2] == 2 * 8 * 32**2 * 3 * 9  # padding 1 keeps 32x32
    assert moved[3] == 4 * 3 * 40 and moved[4] == 4 * 2 * 40  # two inputs and an output; one in, one out


def test_loader_reads_every_gpu_with_its_spec(calls, specs):
    assert set(calls["family"]) == {"A100", "Tesla_P100-PCIE-16GB", "Tesla_P4", "Tesla_T4", "Tesla_V100-PCIE-32GB"}
    assert set(calls["gpu"]) <= set(specs)
    conv_a100 = calls[(calls["op"] == "conv") & (calls["family"] == "A100")]
    assert len(conv_a100) > 1000 and set(conv_a100["gpu"]) == {"NVIDIA_A100_80GB_PCIe"}
    assert (calls["flops"] > 0).all() and (calls["latency_s"] > 0).all()
    assert specs["Tesla_T4"].bandwidth == 320e9 and specs["Tesla_T4"].sm_count == 40


def test_a_directory_without_device_configs_is_refused(tmp_path):
    (tmp_path / "add").mkdir()
    with pytest.raises(DatasetError, match="device_configs"):
        load_neusight(tmp_path)


def test_shipped_model_beats_the_roofline_and_its_p90_is_above(calls, specs):
    model = default_model()
    assert set(model.gpus) == set(specs)  # fitted on every bundled GPU (so this is a check, not a score)
    part = calls[calls["gpu"] == "Tesla_T4"].sample(3000, random_state=0)
    pred = predict_kernel_latency(part, specs["Tesla_T4"])
    lat = part["latency_s"].to_numpy()
    model_err = np.median(np.abs(pred["p50"] / lat - 1))
    rule_err = np.median(np.abs((pred["roofline_s"] + model.overhead_s) / lat - 1))
    assert model_err < 0.5 * rule_err
    assert (pred["p90"] >= pred["p50"]).all() and model.p90_factor > 1


def test_measured_overhead_is_an_input(calls, specs):
    part = calls[(calls["gpu"] == "Tesla_P4") & (calls["op"] == "add")].head(200)
    slow = predict_kernel_latency(part, specs["Tesla_P4"], launch_overhead_s=1e-3)
    assert (slow["p50"] > 1e-3).all()
    with pytest.raises(ValueError, match="overhead"):
        predict_kernel_latency(part, specs["Tesla_P4"], launch_overhead_s=0.0)
    assert launch_overhead(part["latency_s"]) <= part["latency_s"].median()


@pytest.mark.slow
def test_model_round_trips_and_refuses_other_files(tmp_path, calls, specs):
    part = calls[calls["gpu"].isin(["Tesla_P4", "Tesla_T4"])].groupby(["gpu", "op"]).head(300)
    model = fit(part, specs, p90_factor=1.3)
    model.save(tmp_path / "m.json")
    back = KernelModel.load(tmp_path / "m.json")
    a = predict_kernel_latency(part, specs["Tesla_T4"], model=model)
    b = predict_kernel_latency(part, specs["Tesla_T4"], model=back)
    assert np.allclose(a["p50"], b["p50"]) and back.p90_factor == 1.3
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a dprobe kernel model"):
        KernelModel.load(tmp_path / "other.json")


@pytest.mark.slow
def test_leave_one_gpu_out_beats_the_roofline_on_every_fold(calls, specs):
    sub = calls[calls["family"].isin(["Tesla_P4", "Tesla_T4", "Tesla_V100-PCIE-32GB"])]
    sub = sub.groupby(["gpu", "op"]).sample(400, random_state=0)
    folds = crossval(sub, specs)
    assert [f.family for f in folds] == ["Tesla_P4", "Tesla_T4", "Tesla_V100-PCIE-32GB"]
    for f in folds:
        assert f.calls == 6 * 400
        assert f.median_error < f.roofline_overhead_median_error
        assert f.median_error < f.roofline_median_error
        assert 0 <= f.p90_coverage <= 1
