"""Memory on a GPU / stack no source measured: factors from the spread between sources
(dprobe.profiling.coldstart.memory_sources), and dprobe predict applying them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dprobe.profiling.coldstart.memory_sources import (
    MemorySource,
    fit_label_factor,
    load_sources,
    unseen_memory,
    write_sources,
)

ROOT = Path(__file__).resolve().parent.parent


def _src(name: str, factor: float) -> MemorySource:
    return MemorySource(name, (name,), "stack", factor, "fit labels", 10)


def test_unseen_factors_are_the_mean_and_the_worst_left_out_error():
    u = unseen_memory([_src("a", 1.0), _src("b", 1.2), _src("c", 1.1)])
    assert u.p50_factor == pytest.approx((1.0 * 1.2 * 1.1) ** (1 / 3))
    # b left out: the others' mean is sqrt(1.1); its error is the largest
    assert u.p90_factor == pytest.approx(1.2 / math.sqrt(1.1))
    rows = {r["source"]: r for r in u.left_out}
    assert rows["b"]["others_factor"] == pytest.approx(math.sqrt(1.1), abs=1e-4)
    # each left-out row is judged by the other two alone: their mean, widened by their own spread (1.1 / 1.0)
    assert rows["b"]["others_p90_factor"] == pytest.approx(math.sqrt(1.1) * 1.1, abs=1e-4)
    assert rows["b"]["covered"] is False and rows["a"]["covered"] is True
    one = unseen_memory([_src("a", 1.3)])
    assert one.p50_factor == pytest.approx(1.3) and one.p90_factor == 1.0 and one.left_out == ()
    with pytest.raises(ValueError, match="no memory sources"):
        unseen_memory([])


def test_fit_labels_give_back_the_factor_that_made_them():
    rng = np.random.default_rng(0)
    need = rng.uniform(1, 20, 400)
    ran = 1.15 * need + 1.0 <= 16.0
    factor, right = fit_label_factor(need, np.full(400, 16.0), ran, fixed=1.0)
    assert factor == pytest.approx(1.15, abs=0.02) and right == 1.0


def test_written_sources_load_back(tmp_path):
    path = tmp_path / "sources.json"
    write_sources([_src("a", 1.0), _src("b", 1.1)], path)
    u = load_sources(str(path))
    assert [s.name for s in u.sources] == ["a", "b"] and u.p50_factor == pytest.approx(math.sqrt(1.1))
    path.write_text(json.dumps({"format": "other"}))
    load_sources.cache_clear()
    with pytest.raises(ValueError, match="not dprobe's memory sources"):
        load_sources(str(path))


def test_shipped_sources_cover_every_source_left_out():
    u = load_sources()
    assert {s.name for s in u.sources} >= {"h200-profiles", "timm-train-rtx3090", "gavel-colocation"}
    assert 1.0 < u.p50_factor < 1.2 and u.p90_factor >= 1.0
    assert all(r["covered"] for r in u.left_out)


@pytest.mark.slow
def test_predict_scales_memory_only_where_no_source_measured_it():
    from dprobe.profiling.coldstart.predict import predict_job

    home = predict_job("torchvision:resnet18", 4, "fp32", image=64, gpu="h200").as_dict()
    away = predict_job("torchvision:resnet18", 4, "fp32", image=64, gpu="a100").as_dict()
    u = load_sources()
    assert home["memory_calibration"]["source"] == "measured"
    assert away["memory_calibration"] == {"source": "none measured", "p50_factor": round(u.p50_factor, 4),
                                          "p90_factor": round(u.p50_factor * u.p90_factor, 4),
                                          "sources": [s.name for s in u.sources]}
    assert "no source measured" in away["note"]
    # the same replay, the same learned corrections: the p90 is wider than the p50 by the sources' spread
    assert away["device_memory_bytes"]["p90"] / away["device_memory_bytes"]["p50"] == pytest.approx(
        home["device_memory_bytes"]["p90"] / home["device_memory_bytes"]["p50"] * u.p90_factor, rel=1e-4)


@pytest.mark.slow
def test_benchmark_reproduces_the_shipped_sources(script, capsys):
    bench = script("benchmarks/memory_sources.py")
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    shipped = load_sources()
    assert [s["factor"] for s in out["sources"]] == pytest.approx([s.factor for s in shipped.sources], abs=1e-4)
    assert out["p50_factor"] == pytest.approx(shipped.p50_factor, abs=1e-4)
