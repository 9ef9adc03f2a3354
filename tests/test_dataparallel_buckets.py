"""The bucketed all-reduce model of data-parallel sync (dprobe.profiling.dataparallel.buckets), the
visible-median baseline, where each ships as the default, and their physical properties."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dprobe.profiling.dataparallel._buckets_fitted import BUCKETS_FITTED
from dprobe.profiling.dataparallel.baseline import baseline_sync, fit_baseline, predict_baseline
from dprobe.profiling.dataparallel.bucket_fit import choose_methods, fit_cluster, predict_links
from dprobe.profiling.dataparallel.buckets import (
    BACKWARD_SHARE,
    FIRST_BUCKET_BYTES,
    MB,
    LinkParams,
    bucket_sizes,
    exposed_seconds,
    ring_seconds,
    sync_breakdown,
)
from dprobe.profiling.dataparallel.interconnect import resolve_interconnect
from dprobe.profiling.dataparallel.methods import resolve_sync_model
from dprobe.profiling.dataparallel.placement import Placement, parse_placement
from dprobe.profiling.dataparallel.predict import predict_data_parallel

links = st.builds(LinkParams, intra_bandwidth=st.floats(1e8, 5e11), inter_bandwidth=st.floats(1e7, 1e11),
                  latency=st.floats(0.0, 1e-3), overlap=st.floats(0.0, BACKWARD_SHARE))
steps = st.floats(1e-4, 10.0)
grads = st.floats(1e3, 2e9)
windows = st.floats(0.0, 1.0)


def exposed(p: LinkParams, single: float, grad: float, gpus: int, nodes: int, window: float) -> float:
    return float(exposed_seconds(p, np.array([single]), np.array([grad]), np.array([gpus]), np.array([nodes]),
                                 window)[0])


# buckets ---------------------------------------------------------------------------------------------------

def test_buckets_are_ddps_first_small_one_then_25_mb():
    sizes = bucket_sizes(260 * MB)
    assert sizes[0] == FIRST_BUCKET_BYTES and sizes.sum() == pytest.approx(260 * MB)
    assert list(sizes[-10:] / MB) == [25.0] * 10 and sizes[1] == pytest.approx(9 * MB)
    assert list(bucket_sizes(0.5 * MB) / MB) == [0.5]
    assert len(bucket_sizes(260 * MB, bucket_cap_mb=100)) == 4
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        bucket_sizes(1e9, bucket_cap_mb=0)


def test_ring_costs_two_n_minus_one_over_n_on_the_slowest_link():
    p = LinkParams(intra_bandwidth=10e9, inter_bandwidth=1e9, latency=1e-5)
    one_node = ring_seconds(100e6, 4, 1, p)
    across = ring_seconds(100e6, 4, 2, p)
    assert float(one_node) == pytest.approx(2 * 3 / 4 * 100e6 / 10e9 + 6 * 1e-5)
    assert float(across) == pytest.approx(2 * 3 / 4 * 100e6 / 1e9 + 6 * 1e-5)
    # a network faster than the link inside the node: the ring still crosses the slower one
    fast_net = LinkParams(intra_bandwidth=1e9, inter_bandwidth=10e9, latency=0.0)
    assert float(ring_seconds(100e6, 4, 2, fast_net)) == pytest.approx(2 * 3 / 4 * 100e6 / 1e9)
    assert float(ring_seconds(100e6, 1, 1, p)) == 0.0


def test_only_what_exceeds_the_remaining_backward_is_exposed_and_the_last_bucket_never_hides():
    p = LinkParams(intra_bandwidth=1e12, inter_bandwidth=1e9, latency=0.0, overlap=BACKWARD_SHARE)
    # a long backward hides every bucket but the last (25 MB over 8 GPUs on 2 nodes)
    long = sync_breakdown(p, 100.0, 260 * MB, 8, 2, 0.8)
    assert long.exposed == pytest.approx(2 * 7 / 8 * 25 * MB / 1e9)
    assert long.buckets == 12 and long.total == pytest.approx(2 * 7 / 8 * 260 * MB / 1e9)
    # no backward to hide behind: all of it
    assert sync_breakdown(p, 1e-9, 260 * MB, 8, 2, 0.8).exposed == pytest.approx(long.total)
    # every byte ready only as backward ends (window 0): nothing hides
    assert sync_breakdown(p, 100.0, 260 * MB, 8, 2, 0.0).exposed == pytest.approx(long.total)
    # the vectorised form agrees
    assert exposed(p, 100.0, 260 * MB, 8, 2, 0.8) == pytest.approx(long.exposed)


# physical properties ---------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(p=links, single=steps, grad=grads, window=windows, per_node=st.integers(1, 8), nodes=st.integers(1, 8),
       more=st.integers(1, 8))
def test_more_nodes_never_sync_faster(p, single, grad, window, per_node, nodes, more):
    """The same gradient bytes at the same bandwidths: more nodes of the same GPUs each, or the same GPUs
    spread over more nodes, never sync faster."""
    base = exposed(p, single, grad, per_node * nodes, nodes, window)
    assert exposed(p, single, grad, per_node * (nodes + more), nodes + more, window) >= base - 1e-12
    gpus = per_node * nodes
    spread_over = min(gpus, nodes + more)
    assert exposed(p, single, grad, gpus, spread_over, window) >= base - 1e-12


@settings(max_examples=150, deadline=None)
@given(p=links, single=steps, grad=grads, window=windows, gpus=st.integers(2, 64), nodes=st.integers(1, 8),
       factor=st.floats(1.0, 20.0))
def test_larger_gradients_never_sync_faster(p, single, grad, window, gpus, nodes, factor):
    nodes = min(nodes, gpus)
    small = exposed(p, single, grad, gpus, nodes, window)
    assert exposed(p, single, grad * factor, gpus, nodes, window) >= small * (1 - 1e-9) - 1e-12


@settings(max_examples=150, deadline=None)
@given(p=links, single=steps, grad=grads, window=windows, gpus=st.integers(1, 64), nodes=st.integers(1, 8))
def test_exposed_sync_never_exceeds_the_full_all_reduce(p, single, grad, window, gpus, nodes):
    nodes = min(nodes, gpus)
    got = sync_breakdown(p, single, grad, gpus, nodes, window)
    assert 0.0 <= got.exposed <= got.total * (1 + 1e-9) + 1e-15
    assert got.exposed == pytest.approx(exposed(p, single, grad, gpus, nodes, window), rel=1e-9, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(p=links, single=steps, grad=grads, window=windows)
def test_a_single_gpu_has_no_sync(p, single, grad, window):
    assert exposed(p, single, grad, 1, 1, window) == 0.0
    assert sync_breakdown(p, single, grad, 1, 1, window).total == 0.0
    dp = predict_data_parallel((single, single), grad, 8, Placement((1,)), 8, "--step-time", "--params",
                               window=window, sync_model="buckets", limit=False)
    assert dp.sync_time_seconds == (0.0, 0.0)


# the visible-median baseline -------------------------------------------------------------------------------

def _rows(**cols: object) -> pd.DataFrame:
    n = max(len(v) for v in cols.values() if isinstance(v, list))
    frame = pd.DataFrame({k: v if isinstance(v, list) else [v] * n for k, v in cols.items()})
    frame["gpus"] = [parse_placement(p).gpus for p in frame.placement]
    frame["nodes"] = [parse_placement(p).nodes for p in frame.placement]
    return frame


def test_visible_median_baseline_is_the_models_median_sync_per_byte_at_the_placement():
    rows = _rows(cluster="c", group=["a", "a", "b", "c"], placement=["22", "22", "22", "22"],
                 grad_bytes=[1e8, 1e8, 2e8, 1e8], sync_time=[0.1, 0.3, 0.2, 0.5], step_time=1.0, single_step=0.5)
    tables = fit_baseline(rows)
    # per model: a 2e-9 s/B (median of 1e-9, 3e-9), b 1e-9, c 5e-9: median 2e-9
    assert baseline_sync(tables, "c", "22", 4, 2, 1e9) == pytest.approx(2.0, rel=1e-5)
    assert baseline_sync(tables, "c", "1111", 4, 4, 1e9) == pytest.approx(2.0, rel=1e-5)  # same side, ring-scaled
    assert baseline_sync(tables, "c", "4", 4, 1, 1e9) is None  # no one-node rows
    assert baseline_sync(tables, "other", "22", 4, 2, 1e9) is None
    assert baseline_sync(tables, "c", "1", 1, 1, 1e9) == 0.0
    # where only the step was measured, its excess over one GPU's counts as the wait
    gavel = rows.assign(sync_time=np.nan, step_time=[0.6, 0.6, 0.7, 0.5], cluster="g")
    assert predict_baseline(fit_baseline(gavel), gavel.iloc[:1]) == pytest.approx([0.1])


def _scored(buckets: list[float], baseline: list[float], exponential: list[float] | None = None) -> pd.DataFrame:
    frame = _rows(cluster="c", group=["a", "b"], placement=["22", "22"], grad_bytes=1e8, sync_time=[0.1, 0.2],
                  step_time=[1.1, 1.2], single_step=1.0)
    frame["pred_sync_buckets"], frame["pred_sync_baseline"] = buckets, baseline
    if exponential is not None:
        frame["pred_sync_exponential"] = exponential
    return frame


def test_the_bucket_model_ships_only_where_it_beats_the_baseline_on_every_left_out_model():
    assert choose_methods(_scored([0.1, 0.19], [0.15, 0.3]))["c|several nodes"]["method"] == "buckets"
    lost = choose_methods(_scored([0.1, 0.4], [0.15, 0.3]))["c|several nodes"]
    assert lost["method"] == "baseline" and "b step" in lost["why"] and "did not beat" in lost["why"]
    # the earlier model ships where it, not the bucket model, beat the baseline on every model
    assert choose_methods(_scored([0.1, 0.4], [0.15, 0.3], [0.11, 0.21]))["c|several nodes"]["method"] == \
        "exponential"


def test_auto_says_which_sync_model_ran_and_why():
    t4 = resolve_interconnect(None, "t4")
    for key, choice in BUCKETS_FITTED["methods"].items():
        cluster, where = key.split("|")
        if cluster != "pollux-t4":
            continue
        placement = parse_placement("22" if where == "several nodes" else "4")
        ran, why = resolve_sync_model("auto", t4, placement, BUCKETS_FITTED)
        assert ran == choice["method"] and where in why
        dp = predict_data_parallel((0.3, 0.3), 1e8, 16, placement, 4, "--step-time", "--params", interconnect=t4,
                                   limit=False)
        assert dp.as_dict()["sync_model"] == {"model": ran, "why": why}
    # a cluster never measured has no baseline: the bucket model, on nominal links x measured efficiency
    h100 = resolve_interconnect(None, "h100")
    dp = predict_data_parallel((0.3, 0.3), 1e8, 16, parse_placement("88"), 8, "--step-time", "--params",
                               interconnect=h100, limit=False)
    out = dp.as_dict()
    assert out["sync_model"]["model"] == "buckets" and "never measured" in out["sync_model"]["why"]
    eff = out["interconnect"]["effective_bytes_per_second"]
    assert eff["inter"] == pytest.approx(h100.inter.bandwidth * BUCKETS_FITTED["unseen"]["inter_efficiency"])
    with pytest.raises(ValueError, match="--sync-model baseline needs a measured cluster"):
        predict_data_parallel((0.3, 0.3), 1e8, 16, parse_placement("88"), 8, "--step-time", "--params",
                              interconnect=h100, sync_model="baseline")
    with pytest.raises(ValueError, match="--sync-model must be one of"):
        resolve_sync_model("fastest", h100, parse_placement("88"), BUCKETS_FITTED)


def test_the_bucket_model_through_predict_is_the_fitted_simulation():
    t4 = resolve_interconnect(None, "t4")
    where = parse_placement("1122")
    dp = predict_data_parallel((0.4, 0.5), 248e6, 12, where, 4, "--step-time", "--params", window=0.6,
                               interconnect=t4, sync_model="buckets")
    p = LinkParams(**BUCKETS_FITTED["links"]["pollux-t4"])
    assert dp.sync_time_seconds[0] == pytest.approx(exposed(p, 0.4, 248e6, 6, 4, 0.6))
    assert dp.step_time_seconds[0] == pytest.approx(0.4 + dp.sync_time_seconds[0])
    assert dp.sync_time_seconds[1] > dp.sync_time_seconds[0] and dp.step_time_seconds[1] > dp.step_time_seconds[0]
    assert dp.scaling_limit_gpus is not None and dp.scaling_limit_gpus >= 1
    assert json.loads(json.dumps(dp.as_dict()))["interconnect"]["overlap"] == pytest.approx(p.overlap)


def test_fit_recovers_the_links_it_was_given():
    rng = np.random.default_rng(0)
    truth = LinkParams(intra_bandwidth=3e9, inter_bandwidth=6e8, latency=5e-5, overlap=0.3)
    placements = ["2", "4", "11", "22", "1111", "44", "2222"]
    rows = []
    for group, grad, window in (("a", 1e8, 0.8), ("b", 4e8, 0.4), ("c", 2e7, 0.05)):
        for placement in placements:
            for single in rng.uniform(0.05, 1.0, 6):
                rows.append({"group": group, "cluster": "c", "placement": placement, "single_step": single,
                             "grad_bytes": grad, "window": window})
    frame = _rows(**{k: [r[k] for r in rows] for k in rows[0]})
    frame["sync_time"] = predict_links(truth, frame)
    frame["step_time"] = frame.single_step + frame.sync_time
    got = fit_cluster(frame)
    assert got.inter_bandwidth == pytest.approx(truth.inter_bandwidth, rel=0.05)
    assert got.intra_bandwidth == pytest.approx(truth.intra_bandwidth, rel=0.1)
    assert got.overlap == pytest.approx(truth.overlap, rel=0.1)


@pytest.mark.slow
def test_shipped_bucket_fit_is_the_refit_of_the_bundled_data():
    """``_buckets_fitted.py`` is what ``python -m dprobe.profiling.dataparallel.bucket_fit --write`` writes."""
    from dprobe.profiling.dataparallel.bucket_fit import fitted

    got = fitted()
    assert {k: v["method"] for k, v in got["methods"].items()} == \
        {k: v["method"] for k, v in BUCKETS_FITTED["methods"].items()}
    for cluster, values in BUCKETS_FITTED["links"].items():
        for name, value in values.items():
            assert got["links"][cluster][name] == pytest.approx(value, rel=1e-3), (cluster, name)
    assert got["baseline"] == BUCKETS_FITTED["baseline"]
