"""A graph neural network over the kernels of a replayed inference step, predicting its step time.

One node per kernel the meta replay dispatched (:class:`~dprobe.profiling.coldstart.replay.ReplayEstimate`
``ops``, in execution order), plus one for fused attention where there is any; undirected edges join each
kernel to the next and to the one after (GIN layers: twice as fast on a CPU as GINE's typed edges). Each
node carries its kernel's roofline time on the target GPU (``roof``, seconds: max(FLOPs / peak, bytes /
bandwidth) plus a launch, as :func:`~dprobe.profiling.coldstart.features.roofline_seconds` sums them)
and the model predicts a log multiplier ``r_i`` per node: the step time is
``sum_i roof_i * exp(b + r_i) + host``, a sum over kernels (``b``: one learnt log factor, the rule's;
``host``: a learnt cost per kernel). With the head's last layer at zero, as it starts, the model is the
rule.

Runs of consecutive elementwise kernels are coarsened into one node (their roofs, FLOPs and bytes summed,
their count a feature): a third fewer nodes on timm's models (a ResNet-50's 282 kernels are 214 nodes),
every sum as it was.

``python benchmarks/graph_gnn_inference.py`` compares it, on the folds of
:func:`~dprobe.profiling.coldstart.timm_infer.cv_folds`, with the roofline, the rule and a vector model.

A replayed *training* step (forward, backward and optimizer kernels) has its graph from
:func:`training_graph`: the same nodes and features plus the kernel's phase (one-hot, ``PHASE_FEATURES``
more columns), runs of elementwise kernels merged within a phase only, fused attention as a forward node and
a backward one, and a per-graph ``host_scale`` (the machine's host factor). ``python
benchmarks/graph_gnn_training.py`` compares it with the cold-start vector model on h200-profiles' runs.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINConv, global_add_pool, global_mean_pool

from dprobe.core.gpus import GPUS, GPUSpec
from dprobe.profiling.coldstart.features import LAUNCH_S, op_peaks
from dprobe.profiling.coldstart.memtrack import BACKWARD, FORWARD, OP_CLASSES, OPTIMIZER

CLASSES = (*OP_CLASSES, "attention")  # node classes: the replay's kernel classes and fused attention
ELEMENTWISE = OP_CLASSES.index("elementwise")
ATTENTION = CLASSES.index("attention")
# node features: class one-hot, low precision, log FLOPs, log bytes, log kernels merged, then on the GPU:
# log roof, log intensity / machine balance, log bytes / L2, log roof / launch, log share of the step,
# log tensor-core waves, log elements per SM, then the GPU's spec (the same on every node)
GPU_SPEC_FEATURES = 5
NODE_FEATURES = len(CLASSES) + 4 + 7 + GPU_SPEC_FEATURES
TILE_FLOPS = 2.0 * 128 * 128 * 64  # one 128x128 output tile over a K of 64: a tensor-core kernel's unit of work
# the head also sees the graph's context: the mean of the nodes' states, each class's share of the roofline
# time, log roofline time, log kernels
CONTEXT = len(CLASSES) + 2
MAX_LOG_MULTIPLIER = 1.5  # r_i = 1.5 tanh(head / 1.5): no kernel more than 4.5x off its roofline
SPEC_FEATURES_AT = NODE_FEATURES - GPU_SPEC_FEATURES
PHASES = (FORWARD, BACKWARD, OPTIMIZER)  # a training graph's phase one-hot, after the NODE_FEATURES columns
PHASE_FEATURES = len(PHASES)
TRAINING_NODE_FEATURES = NODE_FEATURES + PHASE_FEATURES
BACKWARD_ATTENTION = 2.5  # fused attention's backward, in forwards (forward + backward: 3.5, as the roofline)


def _gpu(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    if gpu not in GPUS:
        raise ValueError(f"no GPU spec for {gpu!r} (dprobe knows {', '.join(GPUS)})")
    return GPUS[gpu]


def gpu_spec_features(gpu: GPUSpec, precision: str) -> list[float]:
    """The GPU's spec as a few normalised numbers: log bandwidth, log tensor-core peak, log machine balance,
    log L2, SMs x clock (each about 0 for a current GPU)."""
    half = gpu.peak_half(precision) if precision != "fp32" else gpu.peak_flops_tf32
    return [math.log(gpu.bandwidth / 1e12), math.log(half / 1e14), math.log(half / gpu.bandwidth / 100.0),
            math.log(max(gpu.l2_bytes, 1 << 20) / (32 << 20)),
            math.log(max(gpu.sm_count * gpu.boost_clock_mhz, 1.0) / 2e5)]


def _coarsen(ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run ids merging each run of consecutive elementwise kernels of one phase, and the first row of each run."""
    elem = ops[:, 1] == ELEMENTWISE
    new = np.ones(len(ops), dtype=bool)
    new[1:] = ~(elem[1:] & elem[:-1] & (ops[1:, 0] == ops[:-1, 0]))
    return np.cumsum(new) - 1, np.flatnonzero(new)


def kernel_graph(est: Any, precision: str, gpu: str | GPUSpec, y: float | None = None,
                 coarsen: bool = True, phases: bool = False) -> Data:
    """The graph of one replayed step on ``gpu`` (a key of :data:`GPUS` or a :class:`GPUSpec`).

    ``x`` [nodes, NODE_FEATURES] (see the module's constants), ``edge_index`` (i <-> i+1, i <-> i+2),
    ``roof`` [nodes] (seconds, summing to the roofline's GPU time), ``kernels`` [nodes] (kernels each node
    stands for), graph-level ``n_kernels`` and ``y`` (the measured step, seconds) when given.
    ``coarsen``: merge runs of consecutive elementwise kernels (of one phase) into one node. ``phases``: ``x``
    gets each node's phase as ``PHASE_FEATURES`` more columns (``TRAINING_NODE_FEATURES`` in all), and a
    training step's fused attention is two nodes, its forward and its backward (:func:`training_graph`)."""
    spec = _gpu(gpu)
    ops = np.asarray(est.ops, dtype=np.float64).reshape(-1, 5)
    flops: np.ndarray  # per node (float; cls and phase: int)
    moved: np.ndarray
    roof: np.ndarray
    count: np.ndarray
    cls: np.ndarray
    phase: np.ndarray
    if len(ops):
        peak = op_peaks(ops, precision, spec)
        roof = np.maximum(ops[:, 3] / peak, ops[:, 4] / spec.bandwidth) + LAUNCH_S
        if coarsen:
            run, first = _coarsen(ops)
            n = len(first)
            flops = np.bincount(run, ops[:, 3], n)
            moved = np.bincount(run, ops[:, 4], n)
            roof = np.bincount(run, roof, n)
            count = np.bincount(run, minlength=n).astype(np.float64)
            cls, low, phase = ops[first, 1].astype(int), ops[first, 2], ops[first, 0].astype(int)
            peak = peak[first]
        else:
            flops, moved, count = ops[:, 3], ops[:, 4], np.ones(len(ops))
            cls, low, phase = ops[:, 1].astype(int), ops[:, 2], ops[:, 0].astype(int)
    else:
        flops = moved = roof = count = peak = low = np.zeros(0)
        cls = phase = np.zeros(0, dtype=int)
    if est.attention_flops > 0:  # fused attention (not dispatched on meta): its own node(s), last
        attn_peak = spec.peak_half(precision) if precision != "fp32" else spec.peak_flops_tf32
        t_fwd = est.attention_flops / attn_peak
        if est.forward_only or not phases:  # one node (a training step's: forward and backward, 3.5 forwards)
            parts = [(FORWARD, 1.0 if est.forward_only else 1.0 + BACKWARD_ATTENTION)]
        else:
            parts = [(FORWARD, 1.0), (BACKWARD, BACKWARD_ATTENTION)]
        for ph, times in parts:
            flops, moved = np.append(flops, times * est.attention_flops), np.append(moved, 0.0)
            roof, count = np.append(roof, times * t_fwd), np.append(count, 1.0)
            cls, low = np.append(cls, ATTENTION), np.append(low, float(precision != "fp32"))
            peak, phase = np.append(peak, attn_peak), np.append(phase, ph)
    n = len(roof)
    if n == 0:
        raise ValueError("a replay with no kernels has no kernel graph")
    total = float(roof.sum())
    lg = np.log
    onehot = np.zeros((n, len(CLASSES)))
    onehot[np.arange(n), cls] = 1.0
    intensity = (flops + 1.0) / (moved + 1.0)
    balance = peak / spec.bandwidth
    l2 = max(spec.l2_bytes, 1 << 20)
    sms = max(spec.sm_count, 1)
    elem_bytes = 4.0 if precision == "fp32" else 2.0
    cols = [low, lg(flops + 1.0) / 25.0, lg(moved + 1.0) / 20.0, lg(count) / 3.0,
            (lg(roof) + 9.0) / 3.0, lg(intensity / balance) / 5.0, lg((moved + 1.0) / l2) / 5.0,
            lg(roof / (count * LAUNCH_S)) / 5.0, lg(roof / total) / 5.0,
            lg((flops + TILE_FLOPS) / TILE_FLOPS / sms) / 5.0, lg((moved + elem_bytes) / elem_bytes / sms) / 10.0]
    spec_feats = np.tile(gpu_spec_features(spec, precision), (n, 1))
    blocks = [onehot, np.stack(cols, axis=1), spec_feats]
    if phases:
        blocks.append((phase[:, None] == np.array(PHASES)[None, :]).astype(np.float64))
    x = np.concatenate(blocks, axis=1)
    src = np.arange(n - 1)
    src2 = np.arange(n - 2) if n > 2 else np.zeros(0, dtype=np.int64)
    edge_index = np.concatenate([np.stack([src, src + 1]), np.stack([src + 1, src]),
                                 np.stack([src2, src2 + 2]), np.stack([src2 + 2, src2])], axis=1)
    data = Data(x=torch.tensor(x, dtype=torch.float32),
                edge_index=torch.tensor(edge_index, dtype=torch.long),
                roof=torch.tensor(roof, dtype=torch.float64), kernels=torch.tensor(count, dtype=torch.float32),
                n_kernels=torch.tensor([float(count.sum())]), num_nodes=n)
    if y is not None:
        data.y = torch.tensor([float(y)], dtype=torch.float64)
    return data


def training_graph(est: Any, precision: str, gpu: str | GPUSpec, y: float | None = None,
                   host_scale: float = 1.0, coarsen: bool = True) -> Data:
    """The graph of one replayed *training* step (forward, backward and optimizer kernels): :func:`kernel_graph`
    with the phases (``x`` [nodes, TRAINING_NODE_FEATURES]; the nodes' ``roof`` still sums to the roofline's
    GPU time) and a graph-level ``host_scale``: how many times as slowly as the typical one the machine's
    host issues kernels (``exp`` of :func:`~dprobe.profiling.coldstart.fit.host_factors`' figure), which
    scales the model's host time."""
    if est.forward_only:
        raise ValueError("an inference replay has no backward or optimizer: use kernel_graph")
    data = kernel_graph(est, precision, gpu, y=y, coarsen=coarsen, phases=True)
    data.host_scale = torch.tensor([float(host_scale)], dtype=torch.float64)
    return data


def _index(batch: Data) -> tuple[torch.Tensor, int]:
    """Each node's graph, and the number of graphs (a lone Data: one)."""
    if getattr(batch, "batch", None) is not None:
        return batch.batch, int(batch.num_graphs)
    return torch.zeros(batch.num_nodes, dtype=torch.long), 1


class KernelGNN(nn.Module):
    """Message passing over the kernel graph (GIN layers, residual), a per-node head giving each kernel's
    log multiplier on its roofline time (from the node's state and features and the graph's context: the
    mean state, each class's share of the roofline time, the roofline time and the kernel count), and an
    additive readout: ``sum_i roof_i * exp(b + r_i)`` plus a learnt host cost per kernel. ``layers=0``:
    the head sees each kernel alone (no message passing).
    ``spec_features=False``: the GPU's spec numbers are zeroed (the GPU enters through the rooflines only).
    ``node_features``: columns of ``x`` (``TRAINING_NODE_FEATURES`` for :func:`training_graph`'s graphs).
    A graph with a ``host_scale`` has its host time scaled by it."""

    def __init__(self, hidden: int = 32, layers: int = 3, spec_features: bool = True,
                 dropout: float = 0.1, node_features: int = NODE_FEATURES) -> None:
        super().__init__()
        self.hidden, self.layers, self.spec_features, self.dropout = hidden, layers, spec_features, dropout
        self.node_features = node_features
        self.inp = nn.Sequential(nn.Linear(node_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(
            GINConv(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)))
            for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        out = nn.Linear(hidden, 1)
        self.head = nn.Sequential(nn.Linear(2 * hidden + node_features + CONTEXT, hidden), nn.ReLU(),
                                  nn.Dropout(dropout), out)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        self.log_factor = nn.Parameter(torch.zeros(()))  # b: the rule's log factor
        self.log_host = nn.Parameter(torch.tensor(math.log(1e-6)))  # host seconds per kernel

    def config(self) -> dict[str, Any]:
        """The constructor's arguments (saved with the weights)."""
        out = {"hidden": self.hidden, "layers": self.layers, "spec_features": self.spec_features,
               "dropout": self.dropout}
        if self.node_features != NODE_FEATURES:
            out["node_features"] = self.node_features
        return out

    def _x(self, batch: Data) -> torch.Tensor:
        x = batch.x
        if not self.spec_features:
            x = torch.cat([x[:, :SPEC_FEATURES_AT], torch.zeros_like(x[:, SPEC_FEATURES_AT:NODE_FEATURES]),
                           x[:, NODE_FEATURES:]], dim=1)
        return x

    def multipliers(self, batch: Data) -> torch.Tensor:
        """Each node's log multiplier ``r_i`` (without the global ``b``)."""
        x = self._x(batch)
        idx, size = _index(batch)
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = h + torch.relu(norm(conv(h, batch.edge_index)))
        roof = batch.roof.float().unsqueeze(-1)
        total = global_add_pool(roof, idx, size)
        shares = global_add_pool(roof * x[:, :len(CLASSES)], idx, size) / total
        context = torch.cat([global_mean_pool(h, idx, size), shares, (torch.log(total) + 5.0) / 3.0,
                             torch.log(batch.n_kernels.float()).unsqueeze(-1) / 8.0], dim=1)
        raw = self.head(torch.cat([h, x, context[idx]], dim=1)).squeeze(-1)
        return MAX_LOG_MULTIPLIER * torch.tanh(raw / MAX_LOG_MULTIPLIER)

    def step_time(self, batch: Data, r: torch.Tensor) -> torch.Tensor:
        """The additive readout of log multipliers ``r`` (one per node): seconds per graph (float64)."""
        idx, size = _index(batch)
        gpu = global_add_pool((batch.roof * torch.exp(self.log_factor + r).double()).unsqueeze(-1), idx, size)
        host = torch.exp(self.log_host).double() * batch.n_kernels.double()
        scale = getattr(batch, "host_scale", None)
        return gpu.squeeze(-1) + (host if scale is None else host * scale.double())

    def forward(self, batch: Data) -> torch.Tensor:
        """Predicted step seconds, one per graph of ``batch``."""
        return self.step_time(batch, self.multipliers(batch))


@dataclass
class FittedKernelGNN:
    """A trained :class:`KernelGNN` and the factor of its p90 (from held-out residuals)."""

    model: KernelGNN
    p90_factor: float = 1.0
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    def state(self) -> dict[str, Any]:
        """What ``torch.save`` keeps (and ``torch.load(weights_only=True)`` reads back)."""
        return {"config": self.model.config(), "state_dict": self.model.state_dict(),
                "p90_factor": float(self.p90_factor)}

    @staticmethod
    def from_state(state: dict[str, Any]) -> FittedKernelGNN:
        """The model :meth:`state` kept, in eval mode."""
        model = KernelGNN(**state["config"])
        model.load_state_dict(state["state_dict"])
        model.eval()
        return FittedKernelGNN(model, float(state["p90_factor"]))


def _batches(graphs: Sequence[Data], batch_size: int,
             rng: np.random.Generator | None) -> list[tuple[np.ndarray, Batch]]:
    order = rng.permutation(len(graphs)) if rng is not None else np.arange(len(graphs))
    return [(order[s:s + batch_size], Batch.from_data_list([graphs[i] for i in order[s:s + batch_size]]))
            for s in range(0, len(graphs), batch_size)]


def predict_kernel_gnn(fitted: FittedKernelGNN | KernelGNN, graphs: Sequence[Data],
                       batch_size: int = 64) -> np.ndarray:
    """Predicted step seconds of each graph (a graph given more than once is run once)."""
    model = fitted.model if isinstance(fitted, FittedKernelGNN) else fitted
    uniq, index, _, _ = _grouped(graphs, None)
    model.eval()
    out = np.zeros(len(uniq))
    with torch.no_grad():
        for idx, b in _batches(uniq, batch_size, None):
            out[idx] = model(b).numpy()
    return out[index]


def _grouped(graphs: Sequence[Data], y: Sequence[float] | np.ndarray | None
             ) -> tuple[list[Data], np.ndarray, np.ndarray, np.ndarray]:
    """The distinct graph objects, each row's index among them, and per distinct graph the mean log of its
    rows' targets and their count (a step measured on two stacks of one GPU: one graph, two targets)."""
    pos: dict[int, int] = {}
    uniq: list[Data] = []
    index = np.zeros(len(graphs), dtype=np.int64)
    for i, g in enumerate(graphs):
        k = pos.setdefault(id(g), len(uniq))
        if k == len(uniq):
            uniq.append(g)
        index[i] = k
    count = np.bincount(index, minlength=len(uniq)).astype(np.float64)
    mean_log = np.zeros(len(uniq))
    if y is not None:
        mean_log = np.bincount(index, np.log(np.asarray(y, dtype=np.float64)), len(uniq)) / np.maximum(count, 1)
    return uniq, index, mean_log, count


def _targets(graphs: Sequence[Data], y: Sequence[float] | np.ndarray | None) -> np.ndarray:
    if y is not None:
        return np.asarray(y, dtype=np.float64)
    return np.array([float(g.y) for g in graphs])


def fit_kernel_gnn(graphs: Sequence[Data], y: Sequence[float] | np.ndarray | None = None,
                   val_graphs: Sequence[Data] | None = None,
                   val_y: Sequence[float] | np.ndarray | None = None,
                   epochs: int = 20, batch_size: int = 32, lr: float = 3e-3, hidden: int = 32, layers: int = 3,
                   spec_features: bool = True, dropout: float = 0.1, seed: int = 0,
                   max_seconds: float | None = None, weight_decay: float = 1e-4,
                   huber: float | None = 0.1, keep_best: bool = False) -> FittedKernelGNN:
    """Train on ``graphs`` and their measured step seconds ``y`` (None: each graph's ``y``): AdamW, one-cycle
    learning rate, Huber's loss of the log step (``huber``: its delta; None: squared error). A graph object
    given more than once (one step on one GPU measured on several stacks) is run once per batch, its loss
    weighted by its count.
    ``b`` starts at the training set's mean log ratio to the roofline sum, the head at zero (the rule).
    With ``val_graphs`` the p90 factor is the 90th percentile of their measured / predicted (without, of the
    training rows'), and with ``keep_best`` too the epoch of least held-out loss is kept (else the last: the
    fixed schedule :func:`crossval_kernel_gnn` uses; on timm's families the held-out loss of one sixth of
    the families was too noisy to pick an epoch by).
    ``max_seconds``: stop after this much training time (the epochs left are skipped)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = KernelGNN(hidden, layers, spec_features, dropout, node_features=int(graphs[0].x.shape[1]))
    measured = _targets(graphs, y)
    uniq, index, mean_log, count = _grouped(graphs, measured)
    roof = np.array([float(g.roof.sum()) for g in uniq])
    with torch.no_grad():
        model.log_factor.fill_(float(np.mean(np.log(measured) - np.log(roof[index]))))
    target, weight = torch.tensor(mean_log), torch.tensor(count)
    val_steps = _targets(val_graphs, val_y) if val_graphs else np.zeros(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(uniq) / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(steps, 1), pct_start=0.1)
    fitted = FittedKernelGNN(model)
    best, best_state = math.inf, None
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for idx, b in _batches(uniq, batch_size, rng):
            opt.zero_grad()
            w = weight[idx]
            err = torch.log(model(b)) - target[idx]
            per = (nn.functional.huber_loss(err, torch.zeros_like(err), reduction="none", delta=huber) / huber
                   if huber else err ** 2)
            loss = (w * per).sum() / w.sum()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach()) * float(w.sum())
        rec = {"epoch": epoch, "train": total / float(weight.sum()), "seconds": time.perf_counter() - t0}
        if val_graphs and keep_best:
            pred = predict_kernel_gnn(model, val_graphs)
            rec["val"] = float(np.mean((np.log(pred) - np.log(val_steps)) ** 2))
            if rec["val"] < best:
                best, best_state = rec["val"], copy.deepcopy(model.state_dict())
        fitted.history.append(rec)
        if max_seconds is not None and rec["seconds"] > max_seconds:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    ref, ref_y = (val_graphs, val_steps) if val_graphs else (graphs, measured)
    fitted.p90_factor = float(np.quantile(ref_y / predict_kernel_gnn(model, ref), 0.9))
    fitted.seconds = time.perf_counter() - t0
    return fitted


def scores(measured: np.ndarray, predicted: np.ndarray, p90: np.ndarray | None = None) -> dict[str, float]:
    """MAPE (%), Spearman rank correlation and the share of measured steps at or under ``p90`` (%)."""
    from scipy.stats import spearmanr

    measured, predicted = np.asarray(measured, float), np.asarray(predicted, float)
    out = {"mape": float(np.mean(np.abs(predicted - measured) / measured) * 100.0),
           "spearman": float(spearmanr(measured, predicted).statistic) if len(measured) > 1 else float("nan")}
    out["p90_coverage"] = float(np.mean(measured <= p90) * 100.0) if p90 is not None else float("nan")
    return out


def inner_split(groups: Sequence[str], share: float = 0.15, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, held-out) holding out about ``share`` of the groups (e.g. model families)."""
    names = np.array(sorted(set(groups)))
    rng = np.random.default_rng(seed)
    held = set(rng.choice(names, size=max(1, round(share * len(names))), replace=False)) if len(names) > 1 else set()
    mask = np.array([g in held for g in groups])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def graphs_for(runs: Any, ests: Sequence[Any], coarsen: bool = True) -> list[Data]:
    """One kernel graph per row of ``runs`` (``gpu``, ``precision``; ``ests`` one replay per row), without
    ``y``: rows of one replay on one GPU (several stacks) share one graph object."""
    cache: dict[tuple[int, str, str], Data] = {}
    out = []
    for est, r in zip(ests, runs.itertuples(index=False), strict=True):
        key = (id(est), r.gpu, r.precision)
        if key not in cache:
            cache[key] = kernel_graph(est, r.precision, r.gpu, coarsen=coarsen)
        out.append(cache[key])
    return out


def crossval_kernel_gnn(runs: Any, ests: Sequence[Any], by: str, graphs: Sequence[Data] | None = None,
                        folds: int = 5, epochs: int = 20, max_seconds: float | None = 150.0,
                        verbose: bool = False, **fit_kw: Any) -> dict[str, Any]:
    """Cross-validate the GNN on :func:`~dprobe.profiling.coldstart.timm_infer.cv_folds` of ``runs`` (rows
    ``model, family, gpu, precision, step_time_s``; ``ests`` one replay per row; ``graphs``: theirs, from
    :func:`graphs_for`, if built already). In each fold the GNN is fitted twice, with one fixed recipe: on
    the training rows less a sixth of their families, whose residuals give the p90 factor, then on every
    training row, which predicts the fold left out. Returns ``{"folds": [{name, mape, spearman,
    p90_coverage, seconds, epochs, n}], "pred", "p90"}`` (each row's p50 and p90 from the fold that left it
    out; ``seconds``: both fits)."""
    from dprobe.profiling.coldstart.timm_infer import cv_folds

    if graphs is None:
        graphs = graphs_for(runs, ests)
    y = runs["step_time_s"].to_numpy(float)
    fam = runs["family"].to_numpy()
    pred, p90 = np.full(len(runs), np.nan), np.full(len(runs), np.nan)
    out = []
    for name, train, test in cv_folds(runs, by, folds):
        inner, held = inner_split(list(fam[train]), share=1 / 6)
        calib = fit_kernel_gnn([graphs[i] for i in train[inner]], y[train[inner]],
                               [graphs[i] for i in train[held]], y[train[held]],
                               epochs=epochs, max_seconds=max_seconds, **fit_kw)
        fitted = fit_kernel_gnn([graphs[i] for i in train], y[train], epochs=epochs, max_seconds=max_seconds,
                                **fit_kw)
        fitted.p90_factor = calib.p90_factor
        p = predict_kernel_gnn(fitted, [graphs[i] for i in test])
        pred[test], p90[test] = p, p * fitted.p90_factor
        s = scores(y[test], p, p90[test])
        seconds = calib.seconds + fitted.seconds
        out.append({"name": name, **s, "seconds": seconds, "epochs": len(fitted.history), "n": len(test)})
        if verbose:
            print(f"  gnn {name}: MAPE {s['mape']:.1f} %, Spearman {s['spearman']:.3f}, p90 cover "
                  f"{s['p90_coverage']:.0f} % ({seconds:.0f} s, {len(fitted.history)} epochs)", flush=True)
    return {"folds": out, "pred": pred, "p90": p90}
