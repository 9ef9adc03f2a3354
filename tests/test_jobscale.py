"""Job scale: first-second observations, targets, residuals, and the leave-family-out report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dprobe.profiling.jobscale import data as js_data
from dprobe.profiling.jobscale import train as js_train
from dprobe.profiling.jobscale.data import load_job_dataset, observe_run
from dprobe.profiling.jobscale.features import (
    COLDSTART_FEATURE,
    GRAPH_FEATURES,
    OBS_FEATURES,
    ColdStartInputs,
    JobScaleDataset,
    first_second,
    first_second_features,
    logit,
)
from dprobe.profiling.jobscale.model import (
    LEVELS,
    JobScaleNet,
    anchors,
    from_residual,
    graph_anchor,
    persist,
    predict_quantiles,
    to_residual,
)
from dprobe.profiling.jobscale.predict import DEFAULT_CHECKPOINT, KIND, load_jobscale, predict_next
from dprobe.profiling.jobscale.report import format_table
from dprobe.profiling.jobscale.train import (
    calibrate_upper,
    cross_validate,
    cross_validate_predictions,
    fit,
    fit_memory_quantiles,
    train_jobscale,
)

GIB = 2**30


def _samples(mem_gib: list[float], util: list[float], dt: float = 0.1) -> pd.DataFrame:
    n = len(mem_gib)
    return pd.DataFrame({"t_rel": np.arange(n) * dt, "mem_used_bytes": np.array(mem_gib) * GIB,
                         "gpu_util_pct": util, "mem_total_bytes": [140 * GIB] * n})


def test_observe_run_by_hand():
    # 11 samples in the first second (t = 0.0 .. 1.0), then 10 more up to 2.0 s
    mem = [1.0] * 5 + [2.0] * 6 + [4.0] * 10
    util = [0] * 5 + [50] * 6 + [100] * 10
    obs, target = observe_run(_samples(mem, util), batch=32, precision="bf16", optimizer="adamw")
    o = dict(zip(OBS_FEATURES, obs, strict=True))
    assert np.exp(o["log_mem_last"]) == pytest.approx(2 * GIB)
    assert np.exp(o["log_mem_max"]) == pytest.approx(2 * GIB)
    assert o["util_mean"] == pytest.approx(300 / 11 / 100)
    assert o["util_busy_share"] == pytest.approx(6 / 11)
    assert (o["bf16"], o["fp16"], o["adamw"]) == (1.0, 0.0, 1.0)
    assert target == [pytest.approx(4 * GIB), pytest.approx(1.0)]


def test_too_short_runs_are_skipped():
    assert observe_run(_samples([1.0] * 12, [0] * 12), 8, "fp32", "sgd") is None


def test_residuals_round_trip_and_persist_is_zero():
    rng = np.random.default_rng(0)
    obs = np.zeros((5, len(OBS_FEATURES)))
    obs[:, 1] = np.log(rng.uniform(1, 10, 5) * GIB)
    obs[:, 2] = rng.uniform(0.05, 0.9, 5)
    y = np.stack([rng.uniform(1, 20, 5) * GIB, rng.uniform(0.05, 0.95, 5)], axis=1)
    ds = JobScaleDataset(obs=obs, coldstart_util=rng.uniform(0.05, 0.95, 5))
    idx = np.arange(5)
    np.testing.assert_allclose(anchors(ds, idx, "no_graph"), persist(obs))
    graph = anchors(ds, idx, "graph")  # utilisation from the cold-start prediction, memory as seen
    np.testing.assert_allclose(graph, np.stack([persist(obs)[:, 0], ds.coldstart_util], axis=1))
    for anchor in (persist(obs), graph):
        r = to_residual(y, anchor)
        back = from_residual(r[:, :, None], anchor)[:, :, 0]
        np.testing.assert_allclose(back, y, rtol=1e-9)
        np.testing.assert_allclose(from_residual(np.zeros((5, 2, 1)), anchor)[:, :, 0], anchor, rtol=1e-9)


@pytest.mark.slow
def test_cross_validation_without_graphs_on_the_bundled_runs():
    ds = load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    assert ds.graph_feats is None and len(ds.run_ids) >= 20
    result = cross_validate(ds, epochs=20, folds=4)  # families held out in 4 groups
    assert set(result) == {"persist", "no_graph"}
    anchor = persist(ds.obs)
    by_hand = np.mean(np.abs(anchor[:, 0] - ds.y[:, 0]) / ds.y[:, 0]) * 100
    assert result["persist"]["plateau_mape"] == pytest.approx(by_hand)
    assert 0 <= result["no_graph"]["p90_coverage"] <= 1
    table = format_table(result, len(ds.run_ids), len(set(ds.families)), folds=4)
    assert "| persist |" in table and "| no_graph |" in table and "in 4 folds" in table
    # the folds fitted in two worker processes: the same predictions
    alone = cross_validate_predictions(ds, epochs=20, folds=4, progress=False)
    pooled = cross_validate_predictions(ds, epochs=20, folds=4, progress=False, workers=2)
    np.testing.assert_allclose(pooled["no_graph"], alone["no_graph"], rtol=1e-5)


@pytest.mark.slow
def test_graph_variant_with_gnn_trains_and_saves(tmp_path, monkeypatch):
    from dprobe.graph import build_model_graph
    from dprobe.graph.encoder import graph_to_data

    g = graph_to_data(build_model_graph("torchvision:resnet18", batch=2, image=64))
    rng = np.random.default_rng(1)
    n = 8
    obs = np.zeros((n, len(OBS_FEATURES)))
    obs[:, 1] = np.log(rng.uniform(2, 8, n) * GIB)
    obs[:, 2] = rng.uniform(0.1, 0.9, n)
    ds = JobScaleDataset(obs=obs, y=np.stack([np.exp(obs[:, 1]) * 1.2, obs[:, 2]], axis=1),
                         families=[f"f{i % 3}" for i in range(n)], run_ids=[str(i) for i in range(n)],
                         graphs=[g] * n, graph_feats=rng.normal(size=(n, 3)), coldstart_util=rng.uniform(0.2, 0.9, n),
                         device_estimate=np.exp(obs[:, 1]) * rng.uniform(0.8, 1.4, n))
    monkeypatch.setattr(js_train, "load_job_dataset", lambda *a, **k: ds)
    out = train_jobscale("unused", str(tmp_path), use_graph=True, epochs=5, graph_dim=4)
    assert set(out["metrics"]) == {"persist", "no_graph", "graph"}
    assert Path(out["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # predicted against measured
    assert "(lofo.png)" in Path(out["report"]).read_text()  # the report shows it
    ckpt = torch.load(out["checkpoint"], weights_only=True)
    assert ckpt["kind"] == KIND and ckpt["variant"] == "graph" and ckpt["graph_dim"] == 4
    assert ckpt["util_anchor"] == "coldstart_util" and ckpt["graph_features"][-1] == COLDSTART_FEATURE
    assert len(ckpt["memory_log_offsets"]) == len(LEVELS)
    net = JobScaleNet(ckpt["n_features"], graph_dim=ckpt["graph_dim"])
    net.load_state_dict(ckpt["state_dict"])
    q = predict_quantiles(net.eval(), ds, np.arange(2), "graph", np.array(ckpt["quantile_shifts"]))
    assert q.shape == (2, 2, 3) and (np.diff(q, axis=-1) >= 0).all()


@pytest.mark.slow
def test_upper_quantiles_are_calibrated_on_held_out_families():
    """The shifts leave p50 alone and make p90 / p99 cover held-out families at about their levels."""
    ds = load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    idx = np.arange(len(ds.run_ids))
    shifts = calibrate_upper(ds, idx, "no_graph", epochs=40)
    assert shifts.shape == (2, len(LEVELS)) and (shifts[:, 0] == 0).all()
    # the same family folds, scored by hand: with the shifts, p90 covers at least 90 % of held-out runs
    fams = np.array(ds.families)
    names = sorted(set(fams))
    group = dict(zip(np.random.default_rng(0).permutation(names), np.arange(len(names)) % 3, strict=True))
    covered = []
    for g in range(3):
        held = np.array([group[f] == g for f in fams])
        net = fit(ds, idx[~held], "no_graph", epochs=40)
        q = predict_quantiles(net, ds, idx[held], "no_graph", shifts)
        assert (np.diff(q, axis=-1) >= 0).all()
        covered.append(ds.y[held] <= q[:, :, 1])
    assert (np.concatenate(covered).mean(axis=0) >= 0.9).all()
    # too few families to hold any out: no shift
    assert (calibrate_upper(ds, idx[np.isin(fams, names[:2])], "no_graph", epochs=5) == 0).all()


def test_graph_memory_rule_by_hand():
    """Graph variant memory: max(seen so far, replayed estimate), quantiles from training errors."""
    obs = np.zeros((4, len(OBS_FEATURES)))
    obs[:, 1] = np.log(np.array([2.0, 6.0, 3.0, 5.0]) * GIB)
    ds = JobScaleDataset(obs=obs, device_estimate=np.array([4.0, 5.0, 3.5, 5.0]) * GIB,
                         y=np.array([[4.0, 0.5], [6.6, 0.5], [3.5, 0.5], [5.5, 0.5]]) * np.array([GIB, 1.0]))
    np.testing.assert_allclose(graph_anchor(ds, np.arange(4)) / GIB, [4.0, 6.0, 3.5, 5.0])
    offsets = fit_memory_quantiles(ds, np.arange(4))
    residuals = np.log(np.array([1.0, 1.1, 1.0, 1.1]))
    np.testing.assert_allclose(offsets, np.quantile(residuals, LEVELS))


def test_conformal_shift_and_family_folds():
    from dprobe.core.conformal import conformal_shift, family_folds, held_out_groups

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


@pytest.mark.slow
def test_graph_dataset_carries_the_coldstart_utilisation(monkeypatch):
    """With graphs, each run gets the cold-start profiler's utilisation prediction (given, or cross-validated
    when not), as the graph variant's anchor and as an input; a run without one is refused by name."""
    import dprobe.profiling.coldstart.dataset as cs_dataset
    from dprobe.profiling.coldstart.features import FEATURES

    plain = load_job_dataset("datasets/h200-profiles", cache_dir="unused", with_graphs=False)
    ids = plain.run_ids
    rng = np.random.default_rng(0)
    fake = cs_dataset.make_dataset([None] * len(ids), rng.normal(size=(len(ids), len(FEATURES))),
                                   rng.uniform(1, 2, size=(len(ids), 4)) * GIB, np.ones((len(ids), 4)), ids, ids)
    monkeypatch.setattr(cs_dataset, "load_dataset", lambda *a, **k: fake)
    util = {rid: float(u) for rid, u in zip(ids, rng.uniform(0.1, 0.9, len(ids)), strict=True)}
    ds = load_job_dataset("datasets/h200-profiles", cache_dir="unused", coldstart_util=util)
    np.testing.assert_allclose(ds.coldstart_util, [util[r] for r in ds.run_ids])
    assert ds.graph_feats.shape == (len(ids), len(GRAPH_FEATURES) + 1)
    np.testing.assert_allclose(ds.graph_feats[:, -1], logit(ds.coldstart_util))
    np.testing.assert_allclose(anchors(ds, np.arange(3), "graph")[:, 1], ds.coldstart_util[:3])

    calls = []
    monkeypatch.setattr(js_data, "coldstart_utilisation", lambda *a, **k: calls.append(a) or util)
    load_job_dataset("datasets/h200-profiles", cache_dir="unused", folds=4)
    assert len(calls) == 1 and calls[0][2] is fake  # cross-validated on the replayed runs when not given
    with pytest.raises(ValueError, match="no cold-start utilisation prediction for runs"):
        load_job_dataset("datasets/h200-profiles", cache_dir="unused", coldstart_util={ids[0]: 0.5})


@pytest.mark.slow
def test_predict_next_reproduces_the_training_path(tmp_path, monkeypatch):
    """Inference from a job's samples gives what the leave-family-out path gives for the same inputs:
    the first second's features, the cold-start anchor, the calibrated shifts and the graph memory rule."""
    rng = np.random.default_rng(2)
    mem = [1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0] + [3.2] * 5
    util = [0, 0, 20, 60, 90, 95, 95, 95, 95, 95, 95] + [95] * 5
    samples = _samples(mem, util)
    n = 8
    obs = np.tile(first_second_features(samples[samples["t_rel"] <= 1.0], 64, "bf16", "sgd"), (n, 1))
    obs[1:, 1] += rng.normal(0, 0.3, n - 1)
    obs[1:, 2] = rng.uniform(0.1, 0.9, n - 1)
    cold = ColdStartInputs(gpu_seconds=0.02, host_seconds=0.008, gpu_utilization=0.85, device_memory_bytes=3.4 * GIB)
    util_cs = np.r_[cold.gpu_utilization, rng.uniform(0.3, 0.9, n - 1)]
    graph_feats = np.c_[rng.normal(-4, 1, (n, 2)), logit(util_cs)]
    graph_feats[0, :2] = np.log([cold.gpu_seconds, cold.host_seconds])
    ds = JobScaleDataset(obs=obs, y=np.stack([np.exp(obs[:, 1]) * 1.1, np.clip(obs[:, 2] + 0.1, 0, 1)], axis=1),
                         families=[f"f{i % 4}" for i in range(n)], run_ids=[str(i) for i in range(n)],
                         graph_feats=graph_feats, coldstart_util=util_cs,
                         device_estimate=np.r_[cold.device_memory_bytes,
                                               np.exp(obs[1:, 1]) * rng.uniform(0.8, 1.4, n - 1)])
    monkeypatch.setattr(js_train, "load_job_dataset", lambda *a, **k: ds)
    ckpt = train_jobscale("unused", str(tmp_path), use_graph=True, epochs=20, folds=None)["checkpoint"]
    net, saved = load_jobscale(ckpt)
    out = predict_next(ckpt, samples, 64, "bf16", "sgd", coldstart=cold)
    expected = predict_quantiles(net, ds, np.arange(1), "graph", np.array(saved["quantile_shifts"]))[0]
    memory = graph_anchor(ds, np.arange(1))[0] * np.exp(saved["memory_log_offsets"])
    assert out.samples_used == 11 and out.variant == "graph"
    assert list(out.memory_plateau_bytes.values()) == [int(v) for v in memory]
    np.testing.assert_allclose(list(out.gpu_utilization.values()), expected[1], atol=1e-4)
    assert max(3.0 * GIB, cold.device_memory_bytes) == pytest.approx(graph_anchor(ds, np.arange(1))[0])
    with pytest.raises(ValueError, match="needs the cold-start prediction"):
        predict_next(ckpt, samples, 64, "bf16", "sgd")


def test_predict_next_refuses_too_few_samples_and_other_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="first 1 s of samples, at least 3 of them.*got 2 over 0.10 s"):
        first_second(_samples([1.0, 1.0], [0, 0]))
    sparse = _samples([1.0, 1.0, 1.0], [0, 0, 0], dt=1.0)  # one sample a second, as DCGM's default
    with pytest.raises(ValueError, match="got 2 over 1.00 s"):
        first_second(sparse)
    torch.save({"kind": "something-else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a dprobe job-scale checkpoint"):
        load_jobscale(tmp_path / "other.pt")


@pytest.mark.slow
def test_cli_predict_with_samples_of_a_bundled_run(tmp_path, capsys):
    """`dprobe predict --samples` on a bundled run's first second (as nvidia-smi logs it, in MiB and %),
    with the shipped checkpoints: the next ten seconds as measured."""
    import json

    from dprobe.cli import main
    from dprobe.data import load_h200_profiles

    profiles = load_h200_profiles("datasets/h200-profiles")
    run = profiles.train_runs().set_index("run_id").loc["r149"]  # resnet18, batch 64, bf16, sgd
    samples = profiles.run_samples("r149")
    measured = observe_run(samples, int(run["batch"]), run["precision"], run["optimizer"],
                           float(run["host_stall_s"]))[1]
    first = samples[samples["t_rel"] <= 1.2]
    stamps = pd.Timestamp("2026-12-01 05:20:00") + pd.to_timedelta(first["t_rel"], unit="s")
    log = tmp_path / "nvidia-smi.csv"
    log.write_text("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n" + "".join(
        f"{t:%Y/%m/%d %H:%M:%S.%f}, 0, {u:.0f} %, {m / 2**20:.0f} MiB, {tot / 2**20:.0f} MiB\n"
        for t, u, m, tot in zip(stamps, first["gpu_util_pct"], first["mem_used_bytes"], first["mem_total_bytes"],
                                strict=True)))
    args = ["predict", "torchvision:resnet18", "--batch", "64", "--precision", "bf16", "--optimizer", "sgd",
            "--host-stall", str(run["host_stall_s"]), "--samples", str(log)]
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["job_scale"]
    mem, util = got["memory_plateau_bytes"], got["gpu_utilization"]
    assert mem["p50"] <= mem["p90"] <= mem["p99"] and util["p50"] <= util["p90"] <= util["p99"] <= 1
    assert mem["p50"] == pytest.approx(measured[0], rel=0.05)  # the run was in training: within 5 %
    assert abs(util["p50"] - measured[1]) < 0.08
    assert main(args) == 0
    assert "next 10 s, from the first 1 s of samples" in capsys.readouterr().out
    # another kind of checkpoint, a damaged one, too few samples: refused and said why
    assert main([*args, "--jobscale-checkpoint", "dprobe/profiling/coldstart/default_coldstart.pt"]) == 2
    assert "not a dprobe job-scale checkpoint" in capsys.readouterr().err
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(Path(DEFAULT_CHECKPOINT).read_bytes()[:500])
    assert main([*args, "--jobscale-checkpoint", str(damaged)]) == 2
    assert "cannot be read (corrupt, truncated" in capsys.readouterr().err
    log.write_text("\n".join(log.read_text().splitlines()[:3]) + "\n")
    assert main(args) == 2
    assert "at least 3 of them" in capsys.readouterr().err
