"""Fragmentation, FGD and cluster placement of GPU-sharing pods (dprobe.sharing.fgd, .cluster, .openb)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprobe.data.common import DatasetError
from dprobe.sharing.cluster import CLUSTER_POLICIES, Nodes, Pods, place_all, summary
from dprobe.sharing.fgd import TaskTypes, gpu_fragment_table, node_fragmentation, placement_delta
from dprobe.sharing.openb import load_openb

ROOT = Path(__file__).resolve().parent.parent
OPENB = ROOT / "datasets" / "alibaba-openb-2023"


def _types(gpus, share, cpu=None):
    return TaskTypes.from_requests(np.array(gpus), np.array(share), None if cpu is None else np.array(cpu))


def test_fragment_of_a_node_follows_the_definition():
    half = _types([1], [0.5])
    free = np.array([[1.0, 0.3]])
    assert node_fragmentation(free, np.array([10.0]), half)[0] == pytest.approx(0.3)
    starved = _types([1], [0.5], cpu=[20.0])  # not enough CPU: all free GPU is a fragment
    assert node_fragmentation(free, np.array([10.0]), starved)[0] == pytest.approx(1.3)
    assert node_fragmentation(free, np.array([10.0]), _types([1], [1.0]))[0] == pytest.approx(0.3)
    assert node_fragmentation(free, np.array([10.0]), _types([2], [1.0]))[0] == pytest.approx(1.3)
    mix = _types([1, 1, 1, 2], [0.5, 0.5, 0.5, 1.0])  # weights 3/4 and 1/4
    assert mix.weight.tolist() == [0.75, 0.25]
    assert node_fragmentation(free, np.array([10.0]), mix)[0] == pytest.approx(0.75 * 0.3 + 0.25 * 1.3)


def test_tasks_without_gpus_are_left_out_and_an_empty_distribution_is_refused():
    t = _types([0, 1], [0.0, 0.25])
    assert t.share.tolist() == [0.25]
    with pytest.raises(ValueError, match="at least one task"):
        _types([0, 0], [0.0, 0.0])


def test_gpu_table_is_free_share_times_weight_of_larger_tasks():
    table = gpu_fragment_table(np.array([0.25, 0.5, 0.5, 1.0]), resolution=100)
    assert table[30] == pytest.approx(0.3 * 0.75)  # 0.3 free: too small for 0.5, 0.5 and 1.0
    assert table[100] == 0.0 and table[0] == 0.0
    assert table[60] == pytest.approx(0.6 * 0.25)


def test_fgd_prefers_the_gpu_whose_leftover_is_useless_anyway():
    types = _types([1, 1], [0.3, 0.6])
    free = np.array([[1.0, 0.3]])
    delta = placement_delta(free, np.array([10.0]), np.array([0, 0]), np.array([0, 1]), 0.3, 0.0, types)
    assert delta[1] < delta[0]


def _tiny() -> tuple[Nodes, Pods]:
    nodes = Nodes(["n0", "n1"], gpus=np.array([2, 2]), cpu=np.array([100.0, 100.0]), memory=np.array([1e3, 1e3]),
                  model=["A", "B"])
    shares = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    pods = Pods([f"p{i}" for i in range(len(shares))], num_gpu=np.ones(len(shares), int), share=np.array(shares),
                cpu=np.ones(len(shares)), memory=np.ones(len(shares)))
    return nodes, pods


@pytest.mark.parametrize("policy", CLUSTER_POLICIES)
def test_every_policy_places_within_capacity(policy):
    nodes, pods = _tiny()
    r = place_all(nodes, pods, policy)
    for nd in range(2):
        on = r.node == nd
        assert pods.gpu_demand()[on].sum() <= nodes.gpus[nd] + 1e-9
    s = summary(r, pods)
    assert s["pods_placed"] + s["pods_not_placed"] == len(pods)
    assert s["gpu_placed"] <= s["capacity_gpus"]


@pytest.mark.parametrize("policy", CLUSTER_POLICIES)
def test_halves_are_paired_so_that_whole_gpus_stay_free(policy):
    nodes, pods = _tiny()  # 4 halves, then 4 whole GPUs on 4 GPUs: only 2 of the wholes can fit
    r = place_all(nodes, pods, policy)
    assert r.placed.tolist() == [True] * 6 + [False] * 2
    assert summary(r, pods)["fragmented_gpus"] == pytest.approx(0.0)


def test_gpu_spec_and_cpu_limit_where_a_pod_goes():
    nodes = Nodes(["n0", "n1"], gpus=np.array([1, 1]), cpu=np.array([2.0, 100.0]), memory=np.array([1e3, 1e3]),
                  model=["T4", "V100"])
    pods = Pods(["a", "b", "c"], num_gpu=np.array([1, 1, 1]), share=np.array([0.5, 0.5, 0.5]),
                cpu=np.array([1.0, 50.0, 1.0]), memory=np.ones(3), gpu_spec=["V100", "", "A100"])
    r = place_all(nodes, pods, "first-fit")
    assert r.node.tolist() == [1, 1, -1]


def test_bad_pods_are_refused():
    with pytest.raises(ValueError, match="share"):
        Pods(["a"], num_gpu=np.array([1]), share=np.array([1.5]), cpu=np.ones(1), memory=np.ones(1))
    with pytest.raises(ValueError, match="several GPUs"):
        Pods(["a"], num_gpu=np.array([2]), share=np.array([0.5]), cpu=np.ones(1), memory=np.ones(1))
    with pytest.raises(ValueError, match="unknown placement policy"):
        place_all(*_tiny(), "random")


def test_openb_loads_in_creation_order():
    nodes, pods = load_openb(OPENB)
    assert len(nodes.names) == 1213 and int(nodes.gpus.sum()) == 6212
    assert len(pods) == 8152
    assert set(np.unique(pods.num_gpu)) <= {0, 1, 2, 4, 8}
    assert ((pods.share > 0) & (pods.share <= 1)).sum() == (pods.num_gpu > 0).sum()


def test_openb_bad_value_names_file_and_column(tmp_path):
    for f in OPENB.glob("*.csv.gz"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    path = tmp_path / "openb_pod_list_default.csv.gz"
    df = pd.read_csv(path)
    df.loc[3, "gpu_milli"] = 1500
    with gzip.open(path, "wt") as fh:
        df.to_csv(fh, index=False)
    with pytest.raises(DatasetError, match="gpu_milli"):
        load_openb(tmp_path)
    (tmp_path / "openb_node_list_gpu_node.csv.gz").unlink()
    with pytest.raises(DatasetError):
        load_openb(tmp_path)


def test_fgd_fragments_less_than_first_fit_on_an_openb_slice():
    nodes, pods = load_openb(OPENB)
    keep = slice(0, 120)
    nodes = Nodes(nodes.names[:24], nodes.gpus[:24], nodes.cpu[:24], nodes.memory[:24], nodes.model[:24])
    pods = Pods(pods.names[keep], pods.num_gpu[keep], pods.share[keep], pods.cpu[keep], pods.memory[keep])
    ff, fgd = (summary(place_all(nodes, pods, p), pods) for p in ("first-fit", "fgd"))
    assert fgd["gpu_placed"] >= ff["gpu_placed"] - 1e-9
    assert fgd["fragmented_gpus"] <= ff["fragmented_gpus"] + 1e-9
