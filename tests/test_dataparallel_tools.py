"""The data-parallel tools: tools/pollux_backward_window.py (the ``backward_window`` column of
pollux-placements' models.csv) and the models.csv that tools/collect_ddp_steps.py writes."""

from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

import pandas as pd
import pytest

from dprobe.profiling.dataparallel.data import backward_windows, parameter_counts

ROOT = Path(__file__).resolve().parent.parent
MODELS_CSV = ROOT / "datasets" / "pollux-placements" / "models.csv"
HALF_LAST_DIGIT = 0.5e-3 + 1e-12  # models.csv prints the window with 3 decimals


@pytest.fixture(scope="module")
def pollux():
    """tools/pollux_backward_window.py, imported from tools/ as the script runs (its dataclass and the
    ``module:pollux_models`` specs need it importable by name)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        yield importlib.import_module("pollux_backward_window")
    finally:
        sys.path.remove(str(ROOT / "tools"))


@pytest.fixture(scope="module")
def collect(script):
    return script("tools/collect_ddp_steps.py")


def _csv_rows() -> dict[str, dict[str, str]]:
    with MODELS_CSV.open(newline="") as f:
        return {row["model"]: row for row in csv.DictReader(f)}


# tools/pollux_backward_window.py -----------------------------------------------------------------------

@pytest.mark.parametrize("model", ["cifar10", "deepspeech2"])
def test_traced_window_and_parameters_match_models_csv(pollux, model):
    """A re-implemented model (tools/pollux_models.py) traces to models.csv's window and parameter count."""
    row = _csv_rows()[model]
    traced = pollux.model_window(model)
    assert traced.parameters == int(row["parameters"])
    assert abs(traced.window - float(row["backward_window"])) <= HALF_LAST_DIGIT
    assert pollux.differences([traced], list(_csv_rows().values())) == []


def test_unknown_model_is_refused(pollux):
    with pytest.raises(ValueError, match="unknown model 'resnet-9000'"):
        pollux.model_window("resnet-9000")


def test_write_sets_the_column_and_keeps_the_rest(pollux, tmp_path):
    """--write adds the column to a models.csv without it, sets the models given and keeps every other cell."""
    before = pd.read_csv(MODELS_CSV).drop(columns="backward_window")
    path = tmp_path / "models.csv"
    before.to_csv(path, index=False)
    pollux.write_windows(path, [pollux.Window("cifar10", "spec", 0.77019, 11173962),
                                pollux.Window("ncf", "spec", None, 1602657)])
    after = pd.read_csv(path)
    pd.testing.assert_frame_equal(after.drop(columns="backward_window"), before)
    assert backward_windows(tmp_path) == {"cifar10": 0.770}  # ncf's empty cell: the uniform default
    with pytest.raises(ValueError, match="no row for vgg"):
        pollux.write_windows(path, [pollux.Window("vgg", "spec", 0.5, 1)])


def test_differences_name_the_value_and_count(pollux):
    rows = [{"model": "cifar10", "parameters": "11173962", "backward_window": "0.770"}]
    assert pollux.differences([pollux.Window("cifar10", "s", 0.7704, 11173962)], rows) == []
    found = pollux.differences([pollux.Window("cifar10", "s", 0.7706, 11173963)], rows)
    assert len(found) == 2 and "0.771" in found[0] and "11173963" in found[1]
    assert pollux.differences([pollux.Window("bert", "s", 0.4, 1)], rows) == ["bert: no row in the CSV"]


# tools/collect_ddp_steps.py ----------------------------------------------------------------------------

def test_collect_models_csv_has_the_backward_window(collect, tmp_path):
    """The models.csv the collector writes carries each model's window, read by dprobe's loader."""
    path = tmp_path / "models.csv"
    assert collect.add_model_row(path, "resnet18", "torchvision:resnet18", 11689512, 0.79123)
    assert collect.add_model_row(path, "odd", "transformers:odd", 1000, None)  # not traceable: empty cell
    assert not collect.add_model_row(path, "resnet18", "torchvision:resnet18", 11689512, 0.1)  # once a model
    assert next(csv.reader(path.open())) == collect.MODELS_HEADER
    assert backward_windows(tmp_path) == {"resnet18": 0.791}
    assert parameter_counts(tmp_path) == {"resnet18": 11689512, "odd": 1000}


def test_collect_adds_the_column_to_an_older_models_csv(collect, tmp_path):
    path = tmp_path / "models.csv"
    path.write_text("model,architecture,parameters,source\nvgg16,torchvision:vgg16,138357544,counted\n")
    collect.add_model_row(path, "resnet50", "torchvision:resnet50", 25557032, 0.795)
    table = pd.read_csv(path)
    assert list(table.columns) == collect.MODELS_HEADER
    assert list(table.model) == ["vgg16", "resnet50"] and pd.isna(table.backward_window[0])
    assert backward_windows(tmp_path) == {"resnet50": 0.795}


def test_collect_window_is_the_one_models_csv_gives(collect):
    """The collector's window of torchvision's ResNet-50 is pollux-placements' (imagenet), traced the same way."""
    window = collect.model_window({"lib": "torchvision", "model": "resnet50"}, 2)
    assert abs(window - float(_csv_rows()["imagenet"]["backward_window"])) <= HALF_LAST_DIGIT


def test_collect_graph_specs(collect, capsys):
    spec = {"lib": "transformers", "model": "bert-base", "config": "BertConfig", "arch": "BertForMaskedLM",
            "seq": 128, "task": "lm", "config_kwargs": {"num_hidden_layers": 2}}
    assert collect.graph_spec(spec) == ("transformers:BertConfig/BertForMaskedLM",
                                        {"seq": 128, "config_kwargs": {"num_hidden_layers": 2}})
    assert collect.graph_spec({"lib": "timm", "model": "vit_base_patch16_224", "image": 224}) == (
        "timm:vit_base_patch16_224", {"image": 224})
    with pytest.raises(ValueError, match="lib must be"):
        collect.graph_spec({"lib": "keras", "model": "x"})
    assert collect.model_window({"lib": "torchvision", "model": "no_such_net"}, 2) is None  # rows kept, a note
    assert "no backward window for no_such_net" in capsys.readouterr().out
