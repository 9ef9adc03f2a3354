"""The kernel-graph GNN of an inference step (dprobe.profiling.coldstart.kernel_gnn) on synthetic replays."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.data import Batch

from dprobe.core.gpus import GPUS
from dprobe.profiling.coldstart.features import LAUNCH_S, roofline_seconds
from dprobe.profiling.coldstart.kernel_gnn import (
    ATTENTION,
    CLASSES,
    NODE_FEATURES,
    TRAINING_NODE_FEATURES,
    FittedKernelGNN,
    KernelGNN,
    crossval_kernel_gnn,
    fit_kernel_gnn,
    graphs_for,
    kernel_graph,
    predict_kernel_gnn,
    training_graph,
)
from dprobe.profiling.coldstart.memtrack import BACKWARD, FORWARD, OP_CLASSES, OPTIMIZER, ReplayOp
from dprobe.profiling.coldstart.replay import ReplayEstimate

EW, NORM, MM, CONV = (OP_CLASSES.index(c) for c in ("elementwise", "norm", "matmul", "conv"))


def _est(ops: list[tuple[int, int, float, float]], attention_flops: float = 0.0) -> ReplayEstimate:
    """A forward-only replay of (class, low precision, FLOPs, bytes) kernels."""
    replay_ops = [ReplayOp(0, c, low, f, b) for c, low, f, b in ops]
    return ReplayEstimate(peak_bytes=1e9, reserved_bytes=1e9, device_bytes=1e9, param_bytes=1e8, state_bytes=0,
                          steady_bytes=1e8, activation_bytes=1e8, flops=sum(o[2] for o in ops), matmul_flops=0.0,
                          bytes_moved=sum(o[3] for o in ops), kernels=len(ops), large_allocs=0,
                          attention_flops=attention_flops, forward_only=1.0, ops=replay_ops)


def _cnn(blocks: int, width: float = 1.0) -> ReplayEstimate:
    ops = []
    for _ in range(blocks):
        ops += [(CONV, 1, 4e9 * width, 6e7 * width), (NORM, 1, 1e7, 5e7 * width), (EW, 1, 0.0, 5e7 * width),
                (EW, 1, 0.0, 5e7 * width)]
    return _est(ops)


def test_graph_nodes_features_and_edges() -> None:
    est = _est([(CONV, 1, 4e9, 6e7), (EW, 1, 0, 5e7), (EW, 1, 0, 5e7), (EW, 1, 0, 1e6), (MM, 1, 2e9, 1e7)],
               attention_flops=1e10)
    g = kernel_graph(est, "fp16", "rtx4090", y=0.01)
    # the three elementwise kernels are one node; attention one more
    assert g.num_nodes == 4
    assert g.x.shape == (4, NODE_FEATURES)
    assert torch.isfinite(g.x).all()
    assert g.x[:, :len(CLASSES)].argmax(1).tolist() == [CONV, EW, MM, ATTENTION]
    assert g.kernels.tolist() == [1.0, 3.0, 1.0, 1.0]
    assert float(g.n_kernels) == 6.0
    assert float(g.y) == pytest.approx(0.01)
    # chain and skip edges, both ways
    edges = set(map(tuple, g.edge_index.t().tolist()))
    assert {(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (0, 2), (2, 0), (1, 3), (3, 1)} == edges
    # the nodes' roofs sum to the roofline's GPU time
    assert float(g.roof.sum()) == pytest.approx(roofline_seconds(est, "fp16", GPUS["rtx4090"])["gpu"], rel=1e-9)
    # uncoarsened: one node per kernel, same sum
    g1 = kernel_graph(est, "fp16", GPUS["rtx4090"], coarsen=False)
    assert g1.num_nodes == 6 and float(g1.roof.sum()) == pytest.approx(float(g.roof.sum()), rel=1e-12)


def test_gpu_enters_the_features() -> None:
    est = _cnn(3)
    a, b = kernel_graph(est, "fp16", "rtx3090"), kernel_graph(est, "fp16", "rtx5090")
    assert a.num_nodes == b.num_nodes
    assert float(a.roof.sum()) > float(b.roof.sum())
    assert not torch.allclose(a.x, b.x)
    with pytest.raises(ValueError, match="no GPU spec"):
        kernel_graph(est, "fp16", "nosuchgpu")


def test_zero_multipliers_give_the_roofline_sum_plus_host() -> None:
    graphs = [kernel_graph(_cnn(n), "fp16", "rtx4090") for n in (1, 2, 5)]
    batch = Batch.from_data_list(graphs)
    model = KernelGNN(hidden=16, layers=2).eval()
    host = math.exp(float(model.log_host.detach()))
    expected = [float(g.roof.sum()) + host * float(g.n_kernels) for g in graphs]
    # the head starts at zero: the untrained model is the roofline sum (times exp(b) = 1) plus the host term
    assert model(batch).tolist() == pytest.approx(expected, rel=1e-6)
    r = torch.zeros(batch.num_nodes)
    assert model.step_time(batch, r).tolist() == pytest.approx(expected, rel=1e-9)
    # additive: a multiplier on one graph's nodes changes that graph's prediction only
    r[batch.batch == 1] = math.log(2.0)
    got = model.step_time(batch, r).tolist()
    assert got[0] == pytest.approx(expected[0]) and got[2] == pytest.approx(expected[2])
    assert got[1] == pytest.approx(2 * float(graphs[1].roof.sum()) + host * float(graphs[1].n_kernels), rel=1e-6)
    assert LAUNCH_S > 0


def test_training_step_graph_phases_nodes_and_additive_host() -> None:
    # forward: conv, 2 elementwise; backward: 2 elementwise (not merged with the forward's), conv; optimizer: 3
    ops = [(FORWARD, CONV, 1, 4e9, 6e7), (FORWARD, EW, 1, 0, 5e7), (FORWARD, EW, 1, 0, 5e7),
           (BACKWARD, EW, 1, 0, 5e7), (BACKWARD, EW, 1, 0, 5e7), (BACKWARD, CONV, 1, 8e9, 1e8),
           (OPTIMIZER, EW, 0, 1e6, 1e7), (OPTIMIZER, EW, 0, 1e6, 1e7), (OPTIMIZER, EW, 0, 1e6, 1e7)]
    est = ReplayEstimate(peak_bytes=1e9, reserved_bytes=1e9, device_bytes=1e9, param_bytes=1e8, state_bytes=2e8,
                         steady_bytes=3e8, activation_bytes=1e8, flops=1.2e10, matmul_flops=0.0, bytes_moved=4e8,
                         kernels=len(ops), large_allocs=0, attention_flops=1e9, forward_only=0.0,
                         ops=[ReplayOp(*o) for o in ops])
    g = training_graph(est, "bf16", "h200", host_scale=2.0)
    # nodes: conv, ew x2 | ew x2, conv | ew x3 | fused attention's forward, its backward
    assert g.x.shape == (7, TRAINING_NODE_FEATURES) and torch.isfinite(g.x).all()
    assert g.kernels.tolist() == [1.0, 2.0, 2.0, 1.0, 3.0, 1.0, 1.0]
    assert float(g.n_kernels) == len(ops) + 2
    assert g.x[:, :len(CLASSES)].argmax(1).tolist() == [CONV, EW, EW, CONV, EW, ATTENTION, ATTENTION]
    phases = g.x[:, NODE_FEATURES:]
    assert phases.sum(1).tolist() == [1.0] * 7
    assert phases.argmax(1).tolist() == [FORWARD, FORWARD, BACKWARD, BACKWARD, OPTIMIZER, FORWARD, BACKWARD]
    # the roofs sum to the training step's roofline GPU time (attention 3.5 forwards)
    assert float(g.roof.sum()) == pytest.approx(roofline_seconds(est, "bf16", GPUS["h200"])["gpu"], rel=1e-9)
    # the GPU's part is a sum over the nodes; the host term scales with host_scale
    model = KernelGNN(hidden=8, layers=1, node_features=TRAINING_NODE_FEATURES).eval()
    assert KernelGNN(**model.config()).node_features == TRAINING_NODE_FEATURES  # kept with the weights
    host = math.exp(float(model.log_host.detach())) * float(g.n_kernels)
    assert float(model(g)) == pytest.approx(float(g.roof.sum()) + 2.0 * host, rel=1e-6)
    # an inference replay has no training graph; the inference graph keeps its columns
    with pytest.raises(ValueError, match="inference replay"):
        training_graph(_cnn(1), "fp16", "h200")
    assert kernel_graph(est, "bf16", "h200").x.shape[1] == NODE_FEATURES


def _toy_set(n: int = 24, seed: int = 0) -> tuple[list, np.ndarray]:
    """Graphs whose step is 1.3x the roofline, 2x on convolutions of wide blocks: a pattern to learn."""
    rng = np.random.default_rng(seed)
    graphs, y = [], []
    for _ in range(n):
        blocks, width = int(rng.integers(1, 6)), float(rng.choice([0.2, 1.0, 5.0]))
        g = kernel_graph(_cnn(blocks, width), "fp16", str(rng.choice(["rtx3090", "rtx4090"])))
        graphs.append(g)
        y.append(float(g.roof.sum()) * (2.0 if width > 1 else 1.3))
    return graphs, np.array(y)


def test_training_reduces_the_loss() -> None:
    torch.set_num_threads(1)
    graphs, y = _toy_set()
    fitted = fit_kernel_gnn(graphs, y, epochs=25, batch_size=8, lr=1e-2, hidden=16, layers=1, dropout=0.0)
    loss = [h["train"] for h in fitted.history]
    assert loss[-1] < 0.5 * loss[0]
    pred = predict_kernel_gnn(fitted, graphs)
    assert np.mean(np.abs(pred - y) / y) < 0.15
    assert fitted.p90_factor > 0


def test_save_and_load_weights_only(tmp_path) -> None:
    graphs, y = _toy_set(8)
    fitted = fit_kernel_gnn(graphs, y, epochs=2, batch_size=4, hidden=8, layers=1)
    path = tmp_path / "kgnn.pt"
    torch.save(fitted.state(), path)
    loaded = FittedKernelGNN.from_state(torch.load(path, weights_only=True))
    assert loaded.p90_factor == pytest.approx(fitted.p90_factor)
    assert predict_kernel_gnn(loaded, graphs) == pytest.approx(predict_kernel_gnn(fitted, graphs), rel=1e-6)


def test_shared_graphs_are_run_once_and_weighted() -> None:
    est = _cnn(2)
    runs = pd.DataFrame({"gpu": ["rtx4090", "rtx4090", "rtx3090"], "precision": "fp16"})
    graphs = graphs_for(runs, [est, est, est])
    assert graphs[0] is graphs[1] and graphs[0] is not graphs[2]
    # one graph with two targets fits their geometric mean
    fitted = fit_kernel_gnn([graphs[0], graphs[0]], [1e-3, 4e-3], epochs=60, batch_size=4, lr=3e-2,
                            hidden=8, layers=0, dropout=0.0)
    assert predict_kernel_gnn(fitted, [graphs[0]])[0] == pytest.approx(2e-3, rel=0.1)


@pytest.mark.slow
def test_crossval_on_a_toy_set() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    rows, ests = [], []
    for i in range(30):
        blocks, width = int(rng.integers(1, 6)), float(rng.choice([0.2, 1.0, 5.0]))
        est = _cnn(blocks, width)
        for gpu in ("rtx3090", "rtx4090", "rtx5090"):
            roof = roofline_seconds(est, "fp16", GPUS[gpu])["gpu"]
            rows.append({"model": f"m{i}", "family": f"f{i % 10}", "gpu": gpu, "precision": "fp16",
                         "step_time_s": roof * (2.0 if width > 1 else 1.3)})
            ests.append(est)
    runs = pd.DataFrame(rows)
    out = crossval_kernel_gnn(runs, ests, "gpu", epochs=4, hidden=8, layers=1)
    assert [f["name"] for f in out["folds"]] == ["gpu=rtx3090", "gpu=rtx4090", "gpu=rtx5090"]
    assert np.isfinite(out["pred"]).all() and all(np.isfinite(f["mape"]) for f in out["folds"])


@pytest.mark.slow
def test_the_training_stage_scores_rule_vector_and_network_on_families_it_never_saw(tmp_path) -> None:
    """``+exp=gnn``'s stage (one epoch here): a report beside the rule and the vector, weights that load safely."""
    import json

    from dprobe.profiling.coldstart.kernel_gnn_train import train_kernel_gnn

    out = train_kernel_gnn(str(tmp_path), "datasets/timm-infer-gpus", epochs=1, held_out_fold=1)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["held_out"] == "family=1" and set(report["scores"]) == {"rule", "vector", "gnn"}
    assert all(0 < s["mape"] < 100 and 0.5 < s["spearman"] <= 1 for s in report["scores"].values())
    assert out["gnn_mape"] == pytest.approx(report["scores"]["gnn"]["mape"])
    state = torch.load(out["checkpoint"], weights_only=True)
    assert FittedKernelGNN.from_state(state).p90_factor >= 1.0
    with pytest.raises(ValueError, match="held_out_fold must be 0-4"):
        train_kernel_gnn(str(tmp_path), "datasets/timm-infer-gpus", held_out_fold=5)
