"""Job scale: first-second observations, targets, residuals, and the leave-family-out report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dprobe import jobscale as js

GIB = 2**30


def _samples(mem_gib: list[float], util: list[float], dt: float = 0.1) -> pd.DataFrame:
    n = len(mem_gib)
    return pd.DataFrame({"t_rel": np.arange(n) * dt, "mem_used_bytes": np.array(mem_gib) * GIB,
                         "gpu_util_pct": util, "mem_total_bytes": [140 * GIB] * n})


def test_observe_run_by_hand():
    # 11 samples in the first second (t = 0.0 .. 1.0), then 10 more up to 2.0 s
    mem = [1.0] * 5 + [2.0] * 6 + [4.0] * 10
    util = [0] * 5 + [50] * 6 + [100] * 10
    obs, target = js.observe_run(_samples(mem, util), batch=32, precision="bf16", optimizer="adamw")
    o = dict(zip(js.OBS_FEATURES, obs, strict=True))
    assert np.exp(o["log_mem_last"]) == pytest.approx(2 * GIB)
    assert np.exp(o["log_mem_max"]) == pytest.approx(2 * GIB)
    assert o["util_mean"] == pytest.approx(300 / 11 / 100)
    assert o["util_busy_share"] == pytest.approx(6 / 11)
    assert (o["bf16"], o["fp16"], o["adamw"]) == (1.0, 0.0, 1.0)
    assert target == [pytest.approx(4 * GIB), pytest.approx(1.0)]


def test_too_short_runs_are_skipped():
    assert js.observe_run(_samples([1.0] * 12, [0] * 12), 8, "fp32", "sgd") is None


def test_residuals_round_trip_and_persist_is_zero():
    rng = np.random.default_rng(0)
    obs = np.zeros((5, len(js.OBS_FEATURES)))
    obs[:, 1] = np.log(rng.uniform(1, 10, 5) * GIB)
    obs[:, 2] = rng.uniform(0.05, 0.9, 5)
    y = np.stack([rng.uniform(1, 20, 5) * GIB, rng.uniform(0.05, 0.95, 5)], axis=1)
    ds = {"obs": obs, "coldstart_util": rng.uniform(0.05, 0.95, 5)}
    idx = np.arange(5)
    np.testing.assert_allclose(js.anchors(ds, idx, "no_graph"), js.persist(obs))
    graph = js.anchors(ds, idx, "graph")  # utilisation from the cold-start prediction, memory as seen
    np.testing.assert_allclose(graph, np.stack([js.persist(obs)[:, 0], ds["coldstart_util"]], axis=1))
    for anchor in (js.persist(obs), graph):
        r = js.to_residual(y, anchor)
        back = js.from_residual(r[:, :, None], anchor)[:, :, 0]
        np.testing.assert_allclose(back, y, rtol=1e-9)
        np.testing.assert_allclose(js.from_residual(np.zeros((5, 2, 1)), anchor)[:, :, 0], anchor, rtol=1e-9)


def test_cross_validation_without_graphs_on_the_bundled_runs():
    ds = js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    assert ds["graph_feats"] is None and len(ds["run_ids"]) >= 20
    result = js.cross_validate(ds, epochs=20, folds=4)  # families held out in 4 groups
    assert set(result) == {"persist", "no_graph"}
    anchor = js.persist(ds["obs"])
    by_hand = np.mean(np.abs(anchor[:, 0] - ds["y"][:, 0]) / ds["y"][:, 0]) * 100
    assert result["persist"]["plateau_mape"] == pytest.approx(by_hand)
    assert 0 <= result["no_graph"]["p90_coverage"] <= 1
    table = js.format_table(result, len(ds["run_ids"]), len(set(ds["families"])), folds=4)
    assert "| persist |" in table and "| no_graph |" in table and "in 4 folds" in table


def test_graph_variant_with_gnn_trains_and_saves(tmp_path, monkeypatch):
    from dprobe.graph import build_model_graph
    from dprobe.graph.encoder import graph_to_data

    g = graph_to_data(build_model_graph("torchvision:resnet18", batch=2, image=64))
    rng = np.random.default_rng(1)
    n = 8
    obs = np.zeros((n, len(js.OBS_FEATURES)))
    obs[:, 1] = np.log(rng.uniform(2, 8, n) * GIB)
    obs[:, 2] = rng.uniform(0.1, 0.9, n)
    ds = {"obs": obs, "y": np.stack([np.exp(obs[:, 1]) * 1.2, obs[:, 2]], axis=1),
          "families": [f"f{i % 3}" for i in range(n)], "run_ids": [str(i) for i in range(n)],
          "graphs": [g] * n, "graph_feats": rng.normal(size=(n, 3)), "coldstart_util": rng.uniform(0.2, 0.9, n),
          "device_estimate": np.exp(obs[:, 1]) * rng.uniform(0.8, 1.4, n)}
    monkeypatch.setattr(js, "load_job_dataset", lambda *a, **k: ds)
    out = js.train_jobscale("unused", str(tmp_path), use_graph=True, epochs=5, graph_dim=4)
    assert set(out["metrics"]) == {"persist", "no_graph", "graph"}
    assert Path(out["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # predicted against measured
    assert "(lofo.png)" in Path(out["report"]).read_text()  # the report shows it
    ckpt = torch.load(out["checkpoint"], weights_only=True)
    assert ckpt["kind"] == js.KIND and ckpt["variant"] == "graph" and ckpt["graph_dim"] == 4
    assert ckpt["util_anchor"] == "coldstart_util" and ckpt["graph_features"][-1] == js.COLDSTART_FEATURE
    assert len(ckpt["memory_log_offsets"]) == len(js.LEVELS)
    net = js.JobScaleNet(ckpt["n_features"], graph_dim=ckpt["graph_dim"])
    net.load_state_dict(ckpt["state_dict"])
    q = js.predict(net.eval(), ds, np.arange(2), "graph", np.array(ckpt["quantile_shifts"]))
    assert q.shape == (2, 2, 3) and (np.diff(q, axis=-1) >= 0).all()


def test_upper_quantiles_are_calibrated_on_held_out_families():
    """The shifts leave p50 alone and make p90 / p99 cover held-out families at about their levels."""
    ds = js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    idx = np.arange(len(ds["run_ids"]))
    shifts = js.calibrate_upper(ds, idx, "no_graph", epochs=40)
    assert shifts.shape == (2, len(js.LEVELS)) and (shifts[:, 0] == 0).all()
    # the same family folds, scored by hand: with the shifts, p90 covers at least 90 % of held-out runs
    fams = np.array(ds["families"])
    names = sorted(set(fams))
    group = dict(zip(np.random.default_rng(0).permutation(names), np.arange(len(names)) % 3, strict=True))
    covered = []
    for g in range(3):
        held = np.array([group[f] == g for f in fams])
        net = js.fit(ds, idx[~held], "no_graph", epochs=40)
        q = js.predict(net, ds, idx[held], "no_graph", shifts)
        assert (np.diff(q, axis=-1) >= 0).all()
        covered.append(ds["y"][held] <= q[:, :, 1])
    assert (np.concatenate(covered).mean(axis=0) >= 0.9).all()
    # too few families to hold any out: no shift
    assert (js.calibrate_upper(ds, idx[np.isin(fams, names[:2])], "no_graph", epochs=5) == 0).all()


def test_graph_memory_rule_by_hand():
    """Graph variant memory: max(seen so far, replayed estimate), quantiles from training errors."""
    obs = np.zeros((4, len(js.OBS_FEATURES)))
    obs[:, 1] = np.log(np.array([2.0, 6.0, 3.0, 5.0]) * GIB)
    ds = {"obs": obs, "device_estimate": np.array([4.0, 5.0, 3.5, 5.0]) * GIB,
          "y": np.array([[4.0, 0.5], [6.6, 0.5], [3.5, 0.5], [5.5, 0.5]]) * np.array([GIB, 1.0])}
    np.testing.assert_allclose(js.graph_anchor(ds, np.arange(4)) / GIB, [4.0, 6.0, 3.5, 5.0])
    offsets = js.fit_memory_quantiles(ds, np.arange(4))
    residuals = np.log(np.array([1.0, 1.1, 1.0, 1.1]))
    np.testing.assert_allclose(offsets, np.quantile(residuals, js.LEVELS))


def test_conformal_shift_and_family_folds():
    from dprobe.conformal import conformal_shift, family_folds, held_out_groups

    scores = np.array([np.nan, *range(1, 20)], dtype=float)  # 19 scores, NaN ignored
    # level ceil(0.9 * (19 + 1)) / 19: between the 18th and 19th smallest, so at least 90 % of 20 covered
    assert conformal_shift(scores, 0.9) == pytest.approx(np.quantile(np.arange(1, 20), 18 / 19))
    assert 18 < conformal_shift(scores, 0.9) < 19
    assert conformal_shift(np.array([np.nan]), 0.9) == 0.0
    fold = family_folds(["a", "b", "a", "c", "d", "b"], 3, seed=0)
    assert fold is not None and set(fold) == {0, 1, 2}
    assert fold[0] == fold[2] and fold[1] == fold[5]  # a family stays in one fold
    assert family_folds(["a", "b"], 3, seed=0) is None
    fams = ["a", "b", "a", "c", "d", "b"]
    groups = held_out_groups(fams, 3, seed=0)
    assert len(groups) == 3 and sorted(np.concatenate(groups)) == list(range(6))  # each run held out once
    group_of = {i: k for k, g in enumerate(groups) for i in g}
    assert group_of[0] == group_of[2] and group_of[1] == group_of[5]  # a family is never split
    assert {frozenset(fams[i] for i in g) for g in held_out_groups(fams, None, seed=0)} == {
        frozenset({f}) for f in "abcd"}  # one family at a time
    with pytest.raises(ValueError, match="folds"):
        held_out_groups(fams, 1, seed=0)


def test_graph_dataset_carries_the_coldstart_utilisation(monkeypatch):
    """With graphs, each run gets the cold-start profiler's utilisation prediction (given, or cross-validated
    when not), as the graph variant's anchor and as an input; a run without one is refused by name."""
    import dprobe.coldstart.train as cs_train
    from dprobe.coldstart.features import FEATURES

    plain = js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    ids = plain["run_ids"]
    rng = np.random.default_rng(0)
    fake = {"run_ids": ids, "graphs": [None] * len(ids), "feats": rng.normal(size=(len(ids), len(FEATURES))),
            "base": rng.uniform(1, 2, size=(len(ids), 4)) * GIB}
    monkeypatch.setattr(cs_train, "load_dataset", lambda *a, **k: fake)
    util = {rid: float(u) for rid, u in zip(ids, rng.uniform(0.1, 0.9, len(ids)), strict=True)}
    ds = js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", coldstart_util=util)
    np.testing.assert_allclose(ds["coldstart_util"], [util[r] for r in ds["run_ids"]])
    assert ds["graph_feats"].shape == (len(ids), len(js.GRAPH_FEATURES) + 1)
    np.testing.assert_allclose(ds["graph_feats"][:, -1], js._logit(ds["coldstart_util"]))
    np.testing.assert_allclose(js.anchors(ds, np.arange(3), "graph")[:, 1], ds["coldstart_util"][:3])

    calls = []
    monkeypatch.setattr(js, "coldstart_utilisation", lambda *a, **k: calls.append(a) or util)
    js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", folds=4)
    assert len(calls) == 1 and calls[0][2] is fake  # cross-validated on the replayed runs when not given
    with pytest.raises(ValueError, match="no cold-start utilisation prediction for runs"):
        js.load_job_dataset("datasets/h200-profiles", cache_dir="unused", coldstart_util={ids[0]: 0.5})
