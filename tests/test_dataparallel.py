"""Data-parallel step time (dprobe.profiling.dataparallel): placements, the all-reduce model, its fit on
pollux-placements, and ``dprobe predict --gpus``."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dprobe.graph.schema import GraphNode, ModelGraph
from dprobe.profiling.dataparallel._fitted import FITTED
from dprobe.profiling.dataparallel.cli import refuse_without_gpus, run_data_parallel
from dprobe.profiling.dataparallel.data import DEFAULT_DIR, load_all, load_gavel_steps, load_steps
from dprobe.profiling.dataparallel.fit import fitted, leave_one_model_out, predict_sync
from dprobe.profiling.dataparallel.gavel_models import JOB_TYPES
from dprobe.profiling.dataparallel.interconnect import INTER_LINKS, INTRA_LINKS, resolve_interconnect
from dprobe.profiling.dataparallel.model import (
    ClusterParams,
    Fitted,
    comm_seconds,
    step_seconds,
    sync_seconds,
    unseen_cluster,
)
from dprobe.profiling.dataparallel.placement import Placement, packed, parse_placement, resolve_placement
from dprobe.profiling.dataparallel.predict import (
    cluster_params,
    predict_data_parallel,
    predict_rows,
    scaling_limit,
    shipped,
    shipped_params,
)
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW, backward_window

PARAMS = ClusterParams(intra_bandwidth=5e9, inter_bandwidth=1e9, per_gpu_on_node=0.1, two_node_penalty=0.3,
                       overlap=1.0, tail=0.2, straggler=0.0, straggler_intra=0.0)


# placements and their errors ------------------------------------------------------------------------

def test_placement_from_digits_nodes_and_packing():
    assert parse_placement("1122") == Placement((1, 1, 2, 2)) and str(parse_placement("8+8+4")) == "884"
    assert str(parse_placement("16+16+8")) == "16+16+8" and parse_placement("16+16+8").gpus == 40
    assert resolve_placement(6, placement="1122").nodes == 4
    assert resolve_placement(7, nodes=3).per_node == (3, 2, 2)
    assert resolve_placement(12, gpus_per_node=4).per_node == (4, 4, 4)  # packed onto as few nodes as hold them
    assert packed(9, 8).per_node == (5, 4) and resolve_placement(1).per_node == (1,)


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"gpus": 0}, "--gpus"),
    ({"gpus": 6, "placement": "1112"}, "--placement"),  # digits add up to 5
    ({"gpus": 4, "placement": "1030"}, "--placement"),  # a node with no GPU
    ({"gpus": 4, "placement": "2x2"}, "--placement"),
    ({"gpus": 8, "placement": "53", "gpus_per_node": 4}, "--gpus-per-node"),
    ({"gpus": 4, "placement": "22", "nodes": 3}, "--nodes"),
    ({"gpus": 2, "nodes": 3}, "--nodes"),  # more nodes than GPUs
    ({"gpus": 4, "nodes": 0}, "--nodes"),
    ({"gpus": 9, "nodes": 2, "gpus_per_node": 4}, "--gpus-per-node"),  # more GPUs than the nodes hold
    ({"gpus": 4, "gpus_per_node": 0}, "--gpus-per-node"),
])
def test_impossible_placements_are_refused_by_name(kwargs, names):
    with pytest.raises(ValueError, match=names):
        resolve_placement(**kwargs)


# the model ------------------------------------------------------------------------------------------

def _sync(params, s, g, where):
    return float(sync_seconds(params, np.array([s]), np.array([g]), np.array([where.gpus]), np.array([where.nodes]),
                              np.array([where.busiest]))[0])


def test_one_gpu_has_no_sync_and_the_ring_follows_its_links():
    assert step_seconds(PARAMS, 0.2, 1e8, Placement((1,))) == (0.2, 0.0)
    g = 1e8
    one_node = float(comm_seconds(PARAMS, g, 4, 1, 4))
    assert one_node == pytest.approx(2 * 3 / 4 * g / 5e9)
    across = float(comm_seconds(PARAMS, g, 4, 4, 1))
    assert across == pytest.approx(2 * 3 / 4 * g / 1e9) and across > one_node
    # the busiest node's GPUs share its link; a ring over exactly two nodes is slower
    assert float(comm_seconds(PARAMS, g, 8, 4, 3)) == pytest.approx(2 * 7 / 8 * g / 1e9 * 1.2)
    assert float(comm_seconds(PARAMS, g, 4, 2, 2)) == pytest.approx(2 * 3 / 4 * g / 1e9 * 1.1 * 1.3)


def test_backward_hides_all_but_the_tail_and_bigger_gradients_cost_more():
    where = Placement((2, 2))
    short, long_ = _sync(PARAMS, 0.01, 1e8, where), _sync(PARAMS, 10.0, 1e8, where)
    t = float(comm_seconds(PARAMS, 1e8, 4, 2, 2))
    assert short == pytest.approx(t, rel=0.05) and long_ == pytest.approx(PARAMS.tail * t, rel=1e-3)
    assert _sync(PARAMS, 0.1, 2e8, where) > _sync(PARAMS, 0.1, 1e8, where)
    stragglers = ClusterParams(**{**PARAMS.as_dict(), "straggler": 0.05, "straggler_intra": 0.01})
    assert _sync(stragglers, 0.1, 1e8, where) == pytest.approx(_sync(PARAMS, 0.1, 1e8, where) + 0.05 * 0.1 * math.log(4))
    one_node = Placement((4,))  # on one node the replicas wait on each other less
    assert _sync(stragglers, 0.1, 1e8, one_node) == pytest.approx(_sync(PARAMS, 0.1, 1e8, one_node)
                                                                  + 0.01 * 0.1 * math.log(4))


def _graph(layers: list[tuple[int, float]]) -> ModelGraph:
    """A chain of ops in forward order, each (parameters, forward FLOPs)."""
    nodes = [GraphNode(id=i, name=f"op{i}", kind="linear" if params else "relu", op="x", params=params,
                       param_bytes=4 * params, flops=flops) for i, (params, flops) in enumerate(layers)]
    return ModelGraph(name="chain", source="test", nodes=nodes, edges=[(i, i + 1) for i in range(len(nodes) - 1)])


def test_backward_window_is_where_gradient_bytes_sit_in_backward():
    # ten equal layers: the layer i-th from the end is ready with (10 - i) / 10 of backward left
    assert backward_window(_graph([(100, 1e6)] * 10)) == pytest.approx(sum(range(10)) / 10 / 10)
    # backward runs the ops in reverse, a parameter-bearing op costing twice its forward FLOPs
    last_heavy = _graph([(10, 3e6), (0, 1e6), (990, 1e6)])  # backward costs 2, 1, 6 (of 9)
    assert backward_window(last_heavy) == pytest.approx(0.99 * 7 / 9 + 0.01 * 0.0)
    embedding_first = _graph([(990, 1e3), (10, 1e6), (10, 1e6)])  # most bytes ready only as backward ends
    assert backward_window(embedding_first) < 0.02 < 0.7 < backward_window(last_heavy)
    assert backward_window(_graph([(0, 1e6)])) is None and backward_window(_graph([(10, 0.0)])) is None


def test_a_wider_backward_window_hides_more_of_the_all_reduce():
    where, t = Placement((2, 2)), float(comm_seconds(PARAMS, 1e8, 4, 2, 2))
    narrow, wide = (float(sync_seconds(PARAMS, 0.1, 1e8, 4, 2, 2, w)[()]) for w in (0.1, 0.9))
    assert wide < narrow < t
    assert float(sync_seconds(PARAMS, 0.1, 1e8, 4, 2, 2, 0.0)[()]) == pytest.approx(t)  # nothing left to hide behind
    assert _sync(PARAMS, 0.1, 1e8, where) == pytest.approx(
        float(sync_seconds(PARAMS, 0.1, 1e8, 4, 2, 2, UNIFORM_WINDOW)[()]))  # the default: gradients spread evenly
    assert step_seconds(PARAMS, 0.1, 1e8, where, 0.9)[1] == pytest.approx(wide)


def test_prediction_throughput_efficiency_and_scaling_limit():
    where = Placement((4, 4))
    dp = predict_data_parallel((0.2, 0.25), 1e8, 256, where, 4, "--step-time", "--params", 0.7, params=PARAMS)
    step, sync = step_seconds(PARAMS, 0.2, 1e8, where)
    assert dp.step_time_seconds[0] == pytest.approx(step) and dp.sync_time_seconds[0] == pytest.approx(sync)
    assert dp.step_time_seconds[1] >= step_seconds(PARAMS, 0.25, 1e8, where)[0]
    d = dp.as_dict()
    assert d["local_batch"] == 32 and d["throughput_samples_per_second"]["p50"] == pytest.approx(256 / step)
    assert d["scaling_efficiency"] == pytest.approx(0.2 / step, abs=1e-4)
    limit = dp.scaling_limit_gpus
    assert limit is not None and limit >= 1

    def efficiency(n):
        return 0.2 / step_seconds(PARAMS, 0.2, 1e8, packed(n, 4))[0]
    assert all(efficiency(n) >= 0.7 for n in range(1, limit + 1)) and efficiency(limit + 1) < 0.7
    # no communication to speak of: never drops
    assert scaling_limit(10.0, 1.0, 4, 0.5, ClusterParams(**{**PARAMS.as_dict(), "tail": 0.0}), max_gpus=64) is None
    with pytest.raises(ValueError, match="--min-efficiency"):
        predict_data_parallel((0.2, 0.2), 1e8, 8, where, 4, "x", "y", 1.5, params=PARAMS)


# the data and the fit -------------------------------------------------------------------------------

@pytest.fixture
def small_pollux(tmp_path: Path) -> Path:
    """Three models of pollux-placements, every fourth multi-GPU row (all one-GPU rows kept)."""
    out = tmp_path / "pollux"
    out.mkdir()
    shutil.copy(DEFAULT_DIR / "models.csv", out / "models.csv")
    for model in ("bert", "imagenet", "ncf"):
        (out / model).mkdir()
        frame = pd.read_csv(DEFAULT_DIR / model / "placements.csv", dtype={"placement": str})
        keep = (frame.placement == "1") | (np.arange(len(frame)) % 4 == 0)
        frame[keep].to_csv(out / model / "placements.csv", index=False)
    return out


def test_load_steps_pairs_each_row_with_its_one_gpu_step(small_pollux):
    steps = load_steps(small_pollux)
    assert set(steps.model) == {"bert", "imagenet", "ncf"} and (steps.gpus > 1).all()
    one = pd.read_csv(small_pollux / "ncf" / "placements.csv", dtype={"placement": str}).query("placement == '1'")
    row = steps[steps.model == "ncf"].iloc[0]
    assert row.single_step == pytest.approx(one[one.local_bsz == row.local_bsz].step_time.median())
    assert row.grad_bytes == 4 * 1602657
    assert (steps.gpus == [sum(map(int, p)) for p in steps.placement]).all()


def test_bad_data_is_refused_by_name(small_pollux):
    (small_pollux / "yolo").mkdir()
    shutil.copy(small_pollux / "ncf" / "placements.csv", small_pollux / "yolo" / "placements.csv")
    with pytest.raises(ValueError, match="yolo.*--param-count"):
        load_steps(small_pollux)
    assert "yolo" in set(load_steps(small_pollux, {"yolo": 1000}).model)
    frame = pd.read_csv(small_pollux / "ncf" / "placements.csv").drop(columns="sync_time")
    frame.to_csv(small_pollux / "ncf" / "placements.csv", index=False)
    with pytest.raises(ValueError, match="sync_time"):
        load_steps(small_pollux, {"yolo": 1000})


def test_backward_windows_come_from_models_csv(small_pollux):
    table = pd.read_csv(small_pollux / "models.csv")
    steps = load_steps(small_pollux)
    shipped = dict(zip(table.model, table.backward_window, strict=True))
    assert (steps.window == steps.model.map(shipped)).all() and steps.window.nunique() == 3
    table.loc[table.model == "ncf", "backward_window"] = np.nan  # an empty cell: gradients spread evenly
    table.to_csv(small_pollux / "models.csv", index=False)
    assert (load_steps(small_pollux).query("model == 'ncf'").window == UNIFORM_WINDOW).all()
    table.drop(columns="backward_window").to_csv(small_pollux / "models.csv", index=False)
    assert (load_steps(small_pollux).window == UNIFORM_WINDOW).all()  # no column: every model so
    table.assign(backward_window=1.5).to_csv(small_pollux / "models.csv", index=False)
    with pytest.raises(ValueError, match=r"models.csv: backward_window of 'imagenet'.*\[0, 1\], not 1.5"):
        load_steps(small_pollux)


@pytest.mark.slow
def test_held_out_model_is_predicted_without_its_own_measurements(small_pollux):
    """Leave-one-model-out: scrambling a model's multi-GPU measurements leaves its predictions as they were
    (only its one-GPU step time and parameter count are read), and the others' fit beats linear scaling."""
    base = leave_one_model_out(load_steps(small_pollux))
    path = small_pollux / "ncf" / "placements.csv"
    frame = pd.read_csv(path, dtype={"placement": str})
    multi = frame.placement != "1"
    frame.loc[multi, "sync_time"] *= 3.0
    frame.loc[multi, "step_time"] *= 2.0
    frame.to_csv(path, index=False)
    again = leave_one_model_out(load_steps(small_pollux))
    ncf = (base.model == "ncf").to_numpy()
    np.testing.assert_allclose(again.pred_sync.to_numpy()[ncf], base.pred_sync.to_numpy()[ncf])
    assert not np.allclose(again.pred_sync.to_numpy()[~ncf], base.pred_sync.to_numpy()[~ncf])
    mape = np.mean(np.abs(base.pred_step / base.step_time - 1))
    linear = np.mean(np.abs(base.single_step / base.step_time - 1))
    assert mape < 0.5 * linear


def test_an_architecture_is_held_out_from_both_sources(monkeypatch):
    """Gavel's ResNet-50 is pollux-placements' imagenet: holding out imagenet leaves Gavel's ResNet-50 rows out
    of the fit too, and every held-out row is predicted on its own cluster."""
    import dprobe.profiling.dataparallel.fit as fit_module

    steps = load_all()
    steps = steps.iloc[::25].reset_index(drop=True)
    trained_on = []

    def record(train, window_blend=0.5):
        trained_on.append(set(train.model))
        fit = _fitted_by_hand()
        return Fitted(fit.shared, {c: fit.clusters["pollux-t4"] for c in steps.cluster.unique()}, window_blend)

    monkeypatch.setattr(fit_module, "fit_params", record)
    scored = leave_one_model_out(steps)
    assert len(trained_on) == steps.group.nunique() == 7 and scored.pred_sync.notna().all()
    without_imagenet = [models for models in trained_on if "imagenet" not in models]
    assert len(without_imagenet) == 1 and "gavel ResNet-50" not in without_imagenet[0]
    assert all("gavel ResNet-50" in models for models in trained_on if "imagenet" in models)
    assert sum("gavel LM" not in models for models in trained_on) == 1  # a model of one source only


@pytest.mark.slow
def test_benchmark_ablations_and_model_subsets(small_pollux, script, monkeypatch, capsys):
    """benchmarks/dataparallel.py: --models scores a subset, --window-blend changes the held-out predictions,
    the two rules are scored beside the model, an unknown model is refused by name."""
    bench = script("benchmarks/dataparallel.py")

    def run(*flags):
        monkeypatch.setattr("sys.argv", ["dataparallel.py", "--data", str(small_pollux), "--no-gavel", "--json",
                                         *flags])
        assert bench.main() == 0
        return json.loads(capsys.readouterr().out)

    both = run("--models", "bert,ncf")
    assert {r["model"] for r in both["per_model"]} == {"bert", "ncf"}
    assert {"dprobe", "linear scaling", "nominal ring"} <= {r["method"] for r in both["per_model"]}
    traced = run("--models", "bert,ncf", "--window-blend", "1")
    assert both["per_model"][0]["sync_mape"] != traced["per_model"][0]["sync_mape"]
    assert set(both["p90_coverage_nested_per_model"]["step"]) == {"bert", "ncf"}
    # the sync models beside the visible-median baseline, each model left out, and where each would ship
    sync = both["sync_models"]
    assert {r["method"] for r in sync["per_model"]} == {"dprobe default", "bucket model", "visible-median baseline",
                                                       "current (exponential)"}
    assert all(0 <= r["p90_step_coverage"] <= 1 for r in sync["per_model"])
    assert {c["method"] for c in sync["shipped_choice"].values()} <= {"buckets", "exponential", "baseline"}
    monkeypatch.setattr("sys.argv", ["dataparallel.py", "--data", str(small_pollux), "--no-gavel", "--models",
                                     "bert,yolo"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "no yolo" in capsys.readouterr().err


def _fitted_by_hand() -> Fitted:
    shared = {"per_gpu_on_node": 0.1, "overlap": 1.0, "tail": 0.2}
    cluster = {"intra_bandwidth": 3e9, "inter_bandwidth": 8e8, "two_node_penalty": 0.3, "straggler": 0.05,
               "straggler_intra": 0.02}
    return Fitted(shared, {"pollux-t4": cluster, "gavel-v100": {**cluster, "intra_bandwidth": 1.5e10}}, 0.5)


def test_cross_validation_predicts_through_the_public_function():
    """The held-out rows are predicted by predict_data_parallel (what dprobe predict calls), which agrees
    with the vectorised model the fit optimises, on each row's own cluster and with the blended window."""
    steps = load_all()
    rows = pd.concat([steps[steps.cluster == "pollux-t4"].iloc[::400], steps[steps.cluster == "gavel-v100"].iloc[::20]])
    fit = _fitted_by_hand()
    np.testing.assert_allclose(predict_rows(rows, fit), predict_sync(fit, rows), rtol=1e-9)
    assert fit.window(0.9) == pytest.approx(0.7) and fit.window(0.1) == pytest.approx(0.3)
    v100 = rows.cluster == "gavel-v100"
    assert predict_rows(rows[v100].assign(cluster="pollux-t4"), fit).sum() > predict_rows(rows[v100], fit).sum()


def test_gavel_rows_are_steps_of_the_job(tmp_path):
    """Gavel's throughput of an N-GPU job counts every worker's steps: a step is N / throughput; one server
    is placement N, spread-out servers one GPU each; no sync time; unmeasured rows left out."""
    rows = [("v100", "ResNet-50", 32, 1, 8.0), ("v100", "ResNet-50", 32, 4, 20.0),
            ("v100_unconsolidated", "ResNet-50", 32, 1, 7.5), ("v100_unconsolidated", "ResNet-50", 32, 4, 12.0),
            ("k80", "LM", 5, 2, 30.0), ("k80", "LM", 5, 1, 0.0),  # one GPU not measured: left out
            ("p100", "CycleGAN", None, 1, 2.0), ("p100", "Transformer", 64, 8, 0.0)]
    frame = pd.DataFrame(rows, columns=["gpu", "model_a", "batch_a", "gpus_a", "alone_a"]).assign(
        model_b=np.nan, batch_b=np.nan, gpus_b=np.nan, alone_b=np.nan, colocated_a=np.nan, colocated_b=np.nan)
    frame.loc[len(frame)] = ["v100", "ResNet-50", 32, 1, 8.0, "LM", 5, 1, 9.0, 3.0, 4.0]  # a co-located pair
    path = tmp_path / "throughputs.csv"
    frame.to_csv(path, index=False)
    steps = load_gavel_steps(path)
    assert len(steps) == 2 and steps.sync_time.isna().all()
    one, spread_out = steps.iloc[0], steps.iloc[1]
    assert (one.cluster, one.placement, one.nodes, one.busiest) == ("gavel-v100", "4", 1, 4)
    assert (spread_out.cluster, spread_out.placement, spread_out.nodes) == ("gavel-v100", "1111", 4)
    assert one.step_time == pytest.approx(4 / 20.0) and one.single_step == pytest.approx(1 / 8.0)
    assert spread_out.single_step == pytest.approx(1 / 7.5)
    assert one.group == "imagenet" and one.grad_bytes == 4 * 25_557_032 and one.window == pytest.approx(0.795)
    with pytest.raises(ValueError, match="alone_a"):
        frame.drop(columns="alone_a").to_csv(path, index=False)
        load_gavel_steps(path)


@pytest.mark.slow
def test_gavel_job_types_are_counted_from_their_modules():
    """The Transformer and LSTM LM re-implementations have the parameters JOB_TYPES gives (the ResNets are
    pollux-placements' models of the same architecture, with that data set's counts)."""
    import torch

    from dprobe.profiling.dataparallel import gavel_models

    with torch.device("meta"):
        assert gavel_models.trainable_parameters(gavel_models.transformer()) == JOB_TYPES["Transformer"].parameters
        assert gavel_models.trainable_parameters(gavel_models.language_model()) == JOB_TYPES["LM"].parameters
    table = pd.read_csv(DEFAULT_DIR / "models.csv").set_index("model")
    for name in ("ResNet-18", "ResNet-50"):
        job = JOB_TYPES[name]
        assert job.parameters == table.loc[job.group, "parameters"]
        assert job.backward_window == pytest.approx(table.loc[job.group, "backward_window"])


@pytest.mark.slow
def test_gavel_job_type_windows_are_their_traced_graphs(script):
    tool = script("tools/gavel_dp_windows.py")
    assert tool.main(["--check"]) == 0
    for name in ("Transformer", "LM"):
        count, window = tool.traced(name)
        assert count == JOB_TYPES[name].parameters
        assert window == pytest.approx(JOB_TYPES[name].backward_window, abs=5e-4)


@pytest.mark.slow
def test_shipped_parameters_are_the_refit_of_the_bundled_data():
    """``python -m dprobe.profiling.dataparallel.fit --write`` on pollux-placements and Gavel's data-parallel
    rows reproduces what ships (parameters, unseen-cluster values, p90 factors, models)."""
    again = fitted()
    assert again["models"] == FITTED["models"] and again["rows"] == FITTED["rows"]
    # abs: a parameter the fit drives to its bound of 0 (``tail``) lands anywhere below 1e-8 from run to run
    for name, value in FITTED["shared"].items():
        assert again["shared"][name] == pytest.approx(value, rel=1e-3, abs=1e-6), name
    for cluster, values in FITTED["clusters"].items():
        for name, value in values.items():
            assert again["clusters"][cluster][name] == pytest.approx(value, rel=1e-3, abs=1e-6), (cluster, name)
    for name, value in FITTED["unseen"].items():
        assert again["unseen"][name] == pytest.approx(value, rel=1e-3), name
    assert again["p90_step_factor"] == pytest.approx(FITTED["p90_step_factor"], rel=1e-3)
    assert again["p90_sync_factor"] == pytest.approx(FITTED["p90_sync_factor"], rel=1e-3)


def test_shipped_parameters_describe_the_measured_clusters():
    """Each measured cluster: the network between nodes is its slow link, backward hides part of the
    all-reduce, and the shipped model predicts the bundled rows better than linear scaling; a cluster never
    measured gets nominal bandwidth x the measured clusters' median efficiency."""
    fit = shipped()
    assert set(FITTED["clusters"]) == {"pollux-t4", "gavel-k80", "gavel-p100", "gavel-v100"}
    for cluster in FITTED["clusters"]:
        p = fit.params(cluster)
        assert p.inter_bandwidth < p.intra_bandwidth and p.overlap > 0
    assert FITTED["p90_step_factor"] > 1 and FITTED["p90_sync_factor"] > FITTED["p90_step_factor"]
    steps = load_all()
    pred = steps.single_step + predict_sync(fit, steps)
    assert np.mean(np.abs(pred / steps.step_time - 1)) < 0.5 * np.mean(np.abs(steps.single_step / steps.step_time - 1))
    assert unseen_cluster(fit) == pytest.approx(FITTED["unseen"], rel=1e-4)
    h200 = cluster_params(resolve_interconnect(None, "h200"))
    assert h200.intra_bandwidth == pytest.approx(450e9 * FITTED["unseen"]["intra_efficiency"])
    assert h200.inter_bandwidth == pytest.approx(50e9 * FITTED["unseen"]["inter_efficiency"])
    assert shipped_params() == fit.params("pollux-t4")  # the T4 on its default links is the measured cluster


# the links ------------------------------------------------------------------------------------------------

def test_interconnect_presets_defaults_and_errors():
    h200 = resolve_interconnect(None, "h200")
    assert (h200.intra.name, h200.inter.name, h200.measured) == ("nvlink4", "infiniband-ndr", None)
    assert h200.source == "default for h200"
    t4 = resolve_interconnect(None, "t4")
    assert (t4.intra.name, t4.inter.name, t4.measured) == ("pcie3", "ethernet-50g", "pollux-t4")
    own = resolve_interconnect("pcie4,ethernet-25g", "h200")
    assert own.intra is INTRA_LINKS["pcie4"] and own.inter is INTER_LINKS["ethernet-25g"]
    assert own.source == "--interconnect" and own.measured is None
    assert resolve_interconnect("nvlink", "a100").inter.name == "infiniband-hdr"  # INTER left out: the GPU's
    assert resolve_interconnect("pcie3,200", "l4").inter.bandwidth == pytest.approx(25e9)  # a number: Gb/s
    assert resolve_interconnect("gavel-v100", "h200").measured == "gavel-v100"
    assert resolve_interconnect("pcie3,ethernet-50g", "h200").measured is None  # the Pollux links, not its GPU
    for bad in ("warp-drive", "pcie3,carrier-pigeon", "pcie3,ethernet-10g,x", "pcie3,-5"):
        with pytest.raises(ValueError, match="--interconnect"):
            resolve_interconnect(bad, "h200")


def test_the_links_change_the_prediction_and_are_echoed(capsys):
    cold = _Cold()
    run_data_parallel(_args(gpus=16, nodes=2, gpu="h200", step_time=0.1), cold)
    fast = json.loads(capsys.readouterr().out)["data_parallel"]
    run_data_parallel(_args(gpus=16, nodes=2, gpu="h200", step_time=0.1, interconnect="pcie3,ethernet-10g"), cold)
    slow = json.loads(capsys.readouterr().out)["data_parallel"]
    assert fast["interconnect"]["inter"]["name"] == "infiniband-ndr" and fast["interconnect"]["from"] == "default for h200"
    assert slow["interconnect"]["inter"]["name"] == "ethernet-10g" and slow["interconnect"]["from"] == "--interconnect"
    assert slow["sync_time_seconds"]["p50"] > 2 * fast["sync_time_seconds"]["p50"]
    assert slow["interconnect"]["effective_bytes_per_second"]["inter"] < 1.25e9
    with pytest.raises(ValueError, match="--interconnect is read with --gpus"):
        refuse_without_gpus(_args(interconnect="nvlink"))


def test_the_p90_carries_the_model_and_a_predicted_single_step():
    """A cold-start one-GPU step (p90 above p50) widens the step and sync p90s beyond the measured step's;
    neither collapses onto the p50."""
    where, links = Placement((4, 4)), resolve_interconnect(None, "t4")
    measured = predict_data_parallel((0.2, 0.2), 1e8, 64, where, 4, "--step-time", "--params", interconnect=links,
                                     sync_model="exponential")
    predicted = predict_data_parallel((0.2, 0.3), 1e8, 64, where, 4, "cold start", "graph", interconnect=links,
                                      sync_model="exponential")
    step50, sync50 = measured.step_time_seconds[0], measured.sync_time_seconds[0]
    assert predicted.step_time_seconds[0] == pytest.approx(step50)
    assert measured.step_time_seconds[1] == pytest.approx(step50 * FITTED["p90_step_factor"])
    assert measured.sync_time_seconds[1] == pytest.approx(sync50 * FITTED["p90_sync_factor"])
    assert predicted.step_time_seconds[1] > measured.step_time_seconds[1]
    assert predicted.sync_time_seconds[1] > measured.sync_time_seconds[1] > 2 * sync50


# dprobe predict --gpus --------------------------------------------------------------------------------

def _args(**kw):
    base = {"model": "torchvision:resnet50", "batch": 64, "precision": "fp32", "json": True, "gpus": None,
            "nodes": None, "placement": None, "gpus_per_node": None, "step_time": None, "params": None,
            "min_efficiency": None, "gpu": "h200", "gpu_spec": None, "interconnect": None}
    return argparse.Namespace(**{**base, **kw})


class _Cold:
    """A stand-in for the cold-start prediction (its step time and graph), recording the batch asked for."""

    def __init__(self):
        self.batches = []

    def __call__(self, args):
        self.batches.append(args.batch)
        return SimpleNamespace(step_time_seconds=SimpleNamespace(p50=0.1, p90=0.12),
                               graph=_graph([(1_000_000, 1e9), (0, 1e9), (24_000_000, 1e9)]),
                               analytical=SimpleNamespace(param_bytes=1),
                               as_dict=lambda: {"model": "torchvision:resnet50", "batch": args.batch,
                                                "step_time_seconds": {"p50": 0.1, "p90": 0.12}})


def test_predict_gpus_adds_data_parallel_at_the_per_gpu_batch(capsys):
    cold = _Cold()
    assert run_data_parallel(_args(gpus=8, nodes=2), cold) == 0
    out = json.loads(capsys.readouterr().out)
    assert cold.batches == [8] and out["batch"] == 8  # the cold-start figures are one GPU's at 64 / 8
    dp = out["data_parallel"]
    assert (dp["gpus"], dp["nodes"], dp["placement"], dp["global_batch"], dp["local_batch"]) == (8, 2, "44", 64, 8)
    assert dp["grad_bytes"] == 100_000_000 and dp["grad_bytes_from"] == "graph"
    assert dp["backward_window_from"] == "graph" and dp["backward_window"] == pytest.approx(0.96 * 0.6, abs=1e-4)
    assert dp["single_gpu_step_time_seconds"] == {"p50": 0.1, "p90": 0.12}
    step = dp["step_time_seconds"]
    assert step["p50"] > 0.1 and step["p90"] >= step["p50"]
    assert dp["scaling_efficiency"] == pytest.approx(0.1 / step["p50"], abs=1e-4)
    links = dp["interconnect"]  # whose links the figures assume, said every time
    assert (links["intra"]["name"], links["inter"]["name"], links["from"]) == ("nvlink4", "infiniband-ndr",
                                                                              "default for h200")
    assert links["calibrated_on"] is None and links["effective_bytes_per_second"]["intra"] > 0
    # --step-time and --params replace the cold-start step and the graph's gradients
    run_data_parallel(_args(gpus=8, placement="1124", step_time=0.5, params=10), cold)
    dp = json.loads(capsys.readouterr().out)["data_parallel"]
    assert dp["single_gpu_step_time_from"] == "--step-time" and dp["grad_bytes"] == 40
    assert dp["single_gpu_step_time_seconds"]["p50"] == 0.5 and dp["placement"] == "1124"


def test_predict_gpus_text(capsys):
    def cold(args):
        band = SimpleNamespace(p50=2 * 2**30, p90=3 * 2**30)
        return SimpleNamespace(step_time_seconds=SimpleNamespace(p50=0.3, p90=0.3), graph=None,
                               analytical=SimpleNamespace(param_bytes=4e8), peak_memory_bytes=band,
                               device_memory_bytes=band, fits="yes")

    assert run_data_parallel(_args(gpus=16, nodes=4, batch=256, json=False, min_efficiency=0.5, gpu="t4"), cold) == 0
    out = capsys.readouterr().out
    assert "links             pcie3 / ethernet-50g (default for t4)" in out
    assert "fitted on the measured cluster pollux-t4" in out
    assert "  sync model        " in out and "pollux-t4, several nodes: " in out  # which ran, and why
    assert "on 16 GPU(s), 4 node(s) (placement 4444), 16 per GPU" in out and "400.0 MB  (replay)" in out
    assert "backward window       0.50     (uniform" in out  # no graph: gradients assumed spread evenly
    assert "drops under 50 % of one GPU's beyond" in out and "allocator peak 2.00 GiB" in out


def test_sync_model_option_picks_the_model_and_is_echoed(capsys):
    """--sync-model: the default (auto) says which ran and why; each model can be asked for; without --gpus it
    is refused; baseline on a cluster never measured is refused by name."""
    cold = _Cold()
    run_data_parallel(_args(gpus=8, nodes=2, gpu="t4"), cold)
    auto = json.loads(capsys.readouterr().out)["data_parallel"]["sync_model"]
    assert auto["model"] in ("buckets", "baseline", "exponential") and "pollux-t4, several nodes" in auto["why"]
    seen = {}
    for model in ("buckets", "baseline", "exponential"):
        run_data_parallel(_args(gpus=8, nodes=2, gpu="t4", sync_model=model), cold)
        dp = json.loads(capsys.readouterr().out)["data_parallel"]
        assert dp["sync_model"] == {"model": model, "why": f"--sync-model {model}"}
        seen[model] = dp["sync_time_seconds"]["p50"]
    assert len(set(seen.values())) == 3
    with pytest.raises(ValueError, match="--sync-model baseline needs a measured cluster"):
        run_data_parallel(_args(gpus=8, nodes=2, sync_model="baseline"), cold)  # h200: never measured
    with pytest.raises(ValueError, match="--sync-model is read with --gpus"):
        refuse_without_gpus(_args(sync_model="buckets"))


def test_untraceable_model_with_step_time_and_params(capsys):
    def refuses(args):
        raise ValueError("cannot replay a training step of module:x:y")

    run_data_parallel(_args(gpus=4, step_time=0.2, params=1_000_000, json=True), refuses)
    out = json.loads(capsys.readouterr().out)
    assert "cannot replay" in out["note"] and out["data_parallel"]["step_time_seconds"]["p50"] > 0.2
    assert out["data_parallel"]["backward_window"] == UNIFORM_WINDOW
    with pytest.raises(ValueError, match="cannot replay"):  # without both, the cold start's error stands
        run_data_parallel(_args(gpus=4, step_time=0.2), refuses)


@pytest.mark.parametrize(("kw", "names"), [
    ({"gpus": 3}, "--batch"),  # 64 does not divide over 3 GPUs
    ({"gpus": 0}, "--gpus"),
    ({"gpus": 6, "placement": "1122", "batch": 66, "step_time": -1.0}, "--step-time"),
    ({"gpus": 6, "placement": "1112", "batch": 66}, "--placement"),
    ({"gpus": 4, "params": 0}, "--params"),
])
def test_bad_data_parallel_options_are_refused_before_any_replay(kw, names):
    cold = _Cold()
    with pytest.raises(ValueError, match=names):
        run_data_parallel(_args(**kw), cold)
    assert cold.batches == []


def test_data_parallel_options_want_gpus():
    with pytest.raises(ValueError, match="--nodes is read with --gpus"):
        refuse_without_gpus(_args(nodes=2))
    with pytest.raises(ValueError, match="--step-time is read with --gpus"):
        refuse_without_gpus(_args(step_time=0.1))
    refuse_without_gpus(_args())


@pytest.mark.slow
def test_without_gpus_the_json_stays_as_it_was(monkeypatch, capsys):
    import dprobe.profiling.cli as predict_cli  # imports torch and PyG

    cold = _Cold()
    monkeypatch.setattr(predict_cli, "predict_from_args", cold)
    assert predict_cli.run(_args()) == 0
    assert "data_parallel" not in json.loads(capsys.readouterr().out) and cold.batches == [64]


def test_predict_parser_has_the_data_parallel_options():
    from dprobe.cli import build_parser

    args = build_parser().parse_args(["predict", "torchvision:resnet50", "--batch", "64", "--gpus", "8",
                                      "--placement", "44", "--step-time", "0.3", "--params", "100"])
    assert (args.gpus, args.placement, args.step_time, args.params) == (8, "44", 0.3, 100)


# tools/collect_ddp_steps.py ---------------------------------------------------------------------------

def test_ddp_plans_are_checked(script, tmp_path):
    tool = script("tools/collect_ddp_steps.py")
    assert all(item["gpus"] for item in tool.read_plan("tools/plans/ddp1.json"))
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps([{"spec": {"lib": "torchvision", "model": "resnet18"}, "gpus": [2]}]))
    with pytest.raises(ValueError, match="local_batches"):
        tool.read_plan(bad)
    bad.write_text(json.dumps([{"spec": {}, "local_batches": [0], "gpus": [2]}]))
    with pytest.raises(ValueError, match=">= 1"):
        tool.read_plan(bad)


@pytest.mark.slow
def test_ddp_dry_run_writes_the_pollux_layout(tmp_path):
    """--dry-run (one gloo process on the CPU) writes placements.csv, models.csv and env.jsonl as
    load_steps reads them."""
    import subprocess
    import sys

    from dprobe.profiling.dataparallel.data import PLACEMENT_COLUMNS, parameter_counts

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"spec": {"lib": "torchvision", "model": "resnet18", "image": 32},
                                 "local_batches": [2], "gpus": [1]}]))
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, str(root / "tools" / "collect_ddp_steps.py"), "--plan", str(plan),
                          "--dry-run"], env={**os.environ, "OUT": str(tmp_path / "out")},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ddp = tmp_path / "out" / "ddp"
    rows = pd.read_csv(ddp / "resnet18" / "placements.csv", dtype={"placement": str})
    assert tuple(rows.columns) == PLACEMENT_COLUMNS and list(rows.placement) == ["1"]
    assert (rows.step_time >= rows.sync_time).all() and (rows.sync_time >= 0).all()
    assert parameter_counts(ddp) == {"resnet18": 11689512}
    env = json.loads((ddp / "env.jsonl").read_text().splitlines()[0])
    assert {"torch", "cuda", "world_size", "placement"} <= set(env)
