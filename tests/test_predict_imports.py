"""``dprobe predict`` imports only what its path needs: the shipped cold-start model has no graph encoder,
so PyG is not imported, and a torchvision model does not import timm (each is seconds on a small machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_predict_of_a_torchvision_model_imports_neither_pyg_nor_timm():
    code = ("import json, sys; from dprobe.profiling.predict import predict_with_samples; "
            "p = predict_with_samples('torchvision:resnet18', 2, image=32); "
            "print(json.dumps({'heavy': sorted(m for m in ('torch_geometric', 'timm', 'transformers', 'lightning') "
            "if m in sys.modules), 'largest_batch': p.largest_batch, 'method': p.method}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
                     .stdout.strip().splitlines()[-1])
    assert out == {"heavy": [], "largest_batch": None, "method": "learned"}


@pytest.mark.slow
def test_the_largest_batch_is_searched_only_when_asked(capsys):
    from dprobe.cli import main

    args = ["predict", "torchvision:resnet18", "--batch", "2", "--image", "32", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["largest_batch"] is None
    assert main([*args, "--search-batch"]) == 0
    assert json.loads(capsys.readouterr().out)["largest_batch"] > 2
