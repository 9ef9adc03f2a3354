"""A data-parallel job's step time, throughput and scaling efficiency (p50 and p90), from its one-GPU step
time at the per-GPU batch, its gradient bytes, its backward window and the links its all-reduce crosses,
with the shipped parameters (:mod:`.fit`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dprobe.profiling.dataparallel._fitted import FITTED
from dprobe.profiling.dataparallel.buckets import LinkParams
from dprobe.profiling.dataparallel.interconnect import (
    Interconnect,
    fitted_link,
    measured_links,
    resolve_interconnect,
)
from dprobe.profiling.dataparallel.methods import (
    DEFAULT_SYNC_MODEL,
    bucket_links,
    resolve_sync_model,
    shipped_buckets,
    sync_function,
)
from dprobe.profiling.dataparallel.model import ClusterParams, Fitted, step_seconds, unseen_cluster
from dprobe.profiling.dataparallel.placement import Placement, packed
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW, check_window

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_MIN_EFFICIENCY = 0.8
MAX_SEARCH_GPUS = 1024


def shipped() -> Fitted:
    """The shipped fit (pollux-placements and Gavel's data-parallel rows)."""
    return Fitted.from_dict(FITTED)


def cluster_params(interconnect: Interconnect, fitted: Fitted | None = None,
                   unseen: dict[str, float] | None = None) -> ClusterParams:
    """The model's parameters on ``interconnect``: a measured cluster's own, else its nominal link bandwidths
    times the efficiency measured clusters reach (``unseen``, default the shipped :func:`~.model.unseen_cluster`)
    with their median stragglers and two-node penalty."""
    fitted = fitted or shipped()
    if interconnect.measured is not None and interconnect.measured in fitted.clusters:
        return fitted.params(interconnect.measured)
    if not (interconnect.intra.bandwidth > 0 and interconnect.inter.bandwidth > 0):
        raise ValueError(f"--interconnect {interconnect.measured or interconnect.intra.name}: no fitted parameters "
                         f"and no nominal bandwidth for it")
    if unseen is None:
        unseen = FITTED["unseen"] if fitted.clusters == FITTED["clusters"] else unseen_cluster(fitted)
    return ClusterParams(**fitted.shared, intra_bandwidth=interconnect.intra.bandwidth * unseen["intra_efficiency"],
                         inter_bandwidth=interconnect.inter.bandwidth * unseen["inter_efficiency"],
                         two_node_penalty=unseen["two_node_penalty"], straggler=unseen["straggler"],
                         straggler_intra=unseen["straggler_intra"])


def shipped_params(interconnect: Interconnect | None = None) -> ClusterParams:
    """The shipped parameters on ``interconnect`` (default: the Pollux T4 cluster the fit measured)."""
    return cluster_params(interconnect or resolve_interconnect(None, "t4"))


@dataclass(frozen=True)
class DataParallelPrediction:
    """``dprobe predict --gpus``'s ``data_parallel`` object."""

    placement: Placement
    global_batch: int
    local_batch: int
    grad_bytes: float
    grad_bytes_from: str  # "graph" or "--params"
    single_step_from: str  # "cold start" or "--step-time"
    single_step_seconds: tuple[float, float]  # one GPU at the local batch, p50 and p90
    step_time_seconds: tuple[float, float]
    sync_time_seconds: tuple[float, float]
    min_efficiency: float
    scaling_limit_gpus: int | None  # most GPUs (packed) with efficiency >= min_efficiency; None: beyond the search
    gpus_per_node: int
    backward_window: float = UNIFORM_WINDOW  # share of backward left to hide a gradient byte (.timeline)
    backward_window_from: str = "uniform"  # "graph", or "uniform" (no graph: gradients spread evenly)
    window_used: float = UNIFORM_WINDOW  # the window the model uses (blended towards 0.5, .model.WINDOW_BLEND)
    interconnect: Interconnect | None = None
    params: ClusterParams | None = None
    sync_model: str = "exponential"  # the sync model that ran (.methods): buckets, baseline or exponential
    sync_model_why: str = ""  # why it ran (the --sync-model default: where it beat the baseline, .bucket_fit)
    bucket_links: LinkParams | None = None  # the bucket model's links, when it ran

    @property
    def throughput(self) -> tuple[float, float]:
        """Samples per second, p50 and the low end (at the step time's p90)."""
        return self.global_batch / self.step_time_seconds[0], self.global_batch / self.step_time_seconds[1]

    @property
    def scaling_efficiency(self) -> float:
        """Throughput over ``N`` times one GPU's at the same per-GPU batch (p50s)."""
        return self.single_step_seconds[0] / self.step_time_seconds[0]

    def as_dict(self) -> dict[str, Any]:
        band = lambda v: {"p50": v[0], "p90": v[1]}  # noqa: E731
        tp = self.throughput
        links = self.interconnect.as_dict() if self.interconnect is not None else {}
        if self.bucket_links is not None:
            links["effective_bytes_per_second"] = {"intra": self.bucket_links.intra_bandwidth,
                                                   "inter": self.bucket_links.inter_bandwidth}
            links["hop_latency_seconds"] = self.bucket_links.latency
            links["overlap"] = self.bucket_links.overlap
        elif self.params is not None:
            links["effective_bytes_per_second"] = {"intra": self.params.intra_bandwidth,
                                                   "inter": self.params.inter_bandwidth}
        return {"gpus": self.placement.gpus, "nodes": self.placement.nodes, "placement": str(self.placement),
                "global_batch": self.global_batch, "local_batch": self.local_batch,
                "grad_bytes": int(self.grad_bytes), "grad_bytes_from": self.grad_bytes_from,
                "backward_window": round(self.backward_window, 4), "backward_window_from": self.backward_window_from,
                "backward_window_used": round(self.window_used, 4),
                "single_gpu_step_time_seconds": band(self.single_step_seconds),
                "single_gpu_step_time_from": self.single_step_from,
                "step_time_seconds": band(self.step_time_seconds),
                "sync_time_seconds": band(self.sync_time_seconds),
                "throughput_samples_per_second": {"p50": tp[0], "p90": tp[1]},
                "scaling_efficiency": round(self.scaling_efficiency, 4),
                "scaling_limit": {"min_efficiency": self.min_efficiency, "gpus_per_node": self.gpus_per_node,
                                  "max_gpus": self.scaling_limit_gpus},
                "interconnect": links, "sync_model": {"model": self.sync_model, "why": self.sync_model_why}}


def scaling_limit(single_step: float, grad_bytes: float, gpus_per_node: int, min_efficiency: float,
                  params: ClusterParams | None = None, max_gpus: int = MAX_SEARCH_GPUS,
                  window: float = UNIFORM_WINDOW,
                  sync: Callable[[float, Placement], float] | None = None) -> int | None:
    """The number of GPUs (packed onto nodes of ``gpus_per_node``, per-GPU batch held) beyond which the
    throughput per GPU first drops under ``min_efficiency`` of one GPU's; None when it never does up to
    ``max_gpus``. ``window``: the window the model uses; ``sync``: a sync model's seconds of a single step at
    a placement (:func:`~.methods.sync_function`) in place of ``params``'."""
    params = params or shipped_params()
    for n in range(2, max_gpus + 1):
        where = packed(n, gpus_per_node)
        step = (single_step + sync(single_step, where) if sync is not None else
                step_seconds(params, single_step, grad_bytes, where, window)[0])
        if single_step / step < min_efficiency:
            return n - 1
    return None


def _widen(p50: float, factor: float, spread: float) -> float:
    """``p50`` times the model's p90 factor and the one-GPU step's spread (log ratios added in quadrature)."""
    return p50 * math.exp(math.hypot(math.log(max(factor, 1.0)), math.log(max(spread, 1.0))))


def predict_data_parallel(single_step: tuple[float, float], grad_bytes: float, global_batch: int, where: Placement,
                          gpus_per_node: int, single_step_from: str, grad_bytes_from: str,
                          min_efficiency: float = DEFAULT_MIN_EFFICIENCY, params: ClusterParams | None = None,
                          window: float | None = None, interconnect: Interconnect | None = None,
                          fitted: Fitted | None = None, limit: bool = True, sync_model: str = DEFAULT_SYNC_MODEL,
                          buckets: dict[str, Any] | None = None) -> DataParallelPrediction:
    """The job's data-parallel prediction (what ``dprobe predict --gpus``, benchmarks/dataparallel.py and the
    leave-one-model-out of :mod:`.fit` all call). ``single_step``: one GPU's step at the local batch (p50,
    p90); ``window``: the model's traced backward window (None: no graph, 0.5); ``interconnect``: its links
    (default: the T4 cluster's); ``fitted``: the parameters (default the shipped ones); ``params``: a
    cluster's parameters outright instead; ``limit``: search the scaling limit. The p90 widens the p50 by the
    leave-one-model-out factor and by the one-GPU step's own p90 / p50 (added in quadrature, log scale); the
    sync's one-GPU spread is its larger change at a step that much shorter or longer. ``sync_model``: which
    sync model runs (:mod:`.methods`; ``auto``: the shipped choice per cluster and side); ``buckets``: the
    bucket model's fit and the baseline's tables (default the shipped ones, :func:`~.methods.shipped_buckets`)."""
    if not 0 < min_efficiency <= 1:
        raise ValueError(f"--min-efficiency must be in (0, 1], not {min_efficiency}")
    if not (single_step[0] > 0 and single_step[1] >= single_step[0]):
        raise ValueError(f"--step-time must be a positive number of seconds, not {single_step[0]}")
    if not grad_bytes > 0:
        raise ValueError(f"--params must be >= 1 (gradient bytes {grad_bytes})")
    window_from = "uniform" if window is None else "graph"
    window = UNIFORM_WINDOW if window is None else check_window(window, "backward window of the graph")
    interconnect = interconnect or resolve_interconnect(None, "t4")
    fitted = fitted or shipped()
    outright = params is not None and sync_model == DEFAULT_SYNC_MODEL  # the exponential model's, given
    params = params or cluster_params(interconnect, fitted)
    used = float(fitted.window(window))
    values = buckets if buckets is not None else shipped_buckets()
    chosen, why = (("exponential", "the exponential model's parameters given outright") if outright else
                   resolve_sync_model(sync_model, interconnect, where, values))
    if chosen != "exponential":
        return _predict_with(chosen, why, values, single_step, grad_bytes, global_batch, where, gpus_per_node,
                             single_step_from, grad_bytes_from, min_efficiency, window, window_from,
                             interconnect, params, limit)
    s50, s90 = single_step
    step50, sync50 = step_seconds(params, s50, grad_bytes, where, used)
    step_hi, sync_hi = step_seconds(params, s90, grad_bytes, where, used)
    _, sync_lo = step_seconds(params, s50 * s50 / s90, grad_bytes, where, used)
    if where.gpus > 1:
        step90 = _widen(step50, FITTED["p90_step_factor"], step_hi / step50)
        sync90 = _widen(sync50, FITTED["p90_sync_factor"], max(sync_hi, sync_lo) / sync50 if sync50 > 0 else 1.0)
    else:
        step90, sync90 = step_hi, 0.0
    return DataParallelPrediction(
        placement=where, global_batch=global_batch, local_batch=global_batch // where.gpus, grad_bytes=grad_bytes,
        grad_bytes_from=grad_bytes_from, single_step_from=single_step_from, single_step_seconds=single_step,
        step_time_seconds=(step50, step90), sync_time_seconds=(sync50, sync90), min_efficiency=min_efficiency,
        scaling_limit_gpus=scaling_limit(s50, grad_bytes, gpus_per_node, min_efficiency, params, window=used)
        if limit else None,
        gpus_per_node=gpus_per_node, backward_window=window, backward_window_from=window_from, window_used=used,
        interconnect=interconnect, params=params, sync_model="exponential",
        sync_model_why=why)


def _predict_with(model: str, why: str, values: dict[str, Any], single_step: tuple[float, float],
                  grad_bytes: float, global_batch: int, where: Placement, gpus_per_node: int, single_step_from: str,
                  grad_bytes_from: str, min_efficiency: float, window: float, window_from: str,
                  interconnect: Interconnect, params: ClusterParams, limit: bool) -> DataParallelPrediction:
    """:func:`predict_data_parallel` with the ``buckets`` or ``baseline`` sync model (:mod:`.methods`): the
    traced window as it is, the p90 from that model's left-out-model residuals."""
    sync = sync_function(model, interconnect, grad_bytes, window if window_from == "graph" else None, values)
    s50, s90 = single_step
    sync50, sync_hi, sync_lo = sync(s50, where), sync(s90, where), sync(s50 * s50 / s90, where)
    step50 = s50 + sync50
    if not math.isfinite(step50):
        raise ValueError("data-parallel step time is not finite: check --step-time and --params")
    factors = values["p90"][model]
    if where.gpus > 1:
        step90 = _widen(step50, factors["step"], (s90 + sync_hi) / step50)
        sync90 = _widen(sync50, factors["sync"], max(sync_hi, sync_lo) / sync50 if sync50 > 0 else 1.0)
    else:
        step90, sync90 = s90, 0.0
    return DataParallelPrediction(
        placement=where, global_batch=global_batch, local_batch=global_batch // where.gpus, grad_bytes=grad_bytes,
        grad_bytes_from=grad_bytes_from, single_step_from=single_step_from, single_step_seconds=single_step,
        step_time_seconds=(step50, step90), sync_time_seconds=(sync50, sync90), min_efficiency=min_efficiency,
        scaling_limit_gpus=scaling_limit(s50, grad_bytes, gpus_per_node, min_efficiency, sync=sync)
        if limit else None,
        gpus_per_node=gpus_per_node, backward_window=window, backward_window_from=window_from, window_used=window,
        interconnect=interconnect, params=params, sync_model=model, sync_model_why=why,
        bucket_links=bucket_links(interconnect, values) if model == "buckets" else None)


def measured_interconnect(cluster: str) -> Interconnect:
    """The links of a measured cluster (a key of :data:`~.interconnect.MEASURED`; any other fitted cluster
    gets placeholder links named after it), as its own fitted parameters apply."""
    try:
        intra, inter = measured_links(cluster)
    except KeyError:
        intra = inter = fitted_link(cluster)
    return Interconnect(intra, inter, "measured", cluster)


def predict_rows(steps: pd.DataFrame, fitted: Fitted) -> np.ndarray:
    """Predicted sync seconds (p50) of the exponential model (``--sync-model exponential``) of each row of
    :func:`~.data.load_all`, one :func:`predict_data_parallel` call a row, on the row's measured cluster and
    with its measured one-GPU step (``--step-time``)."""
    from dprobe.profiling.dataparallel.placement import parse_placement

    out = np.empty(len(steps))
    links = {c: measured_interconnect(c) for c in steps.cluster.unique()}
    for i, row in enumerate(steps.itertuples(index=False)):
        where = parse_placement(row.placement)
        dp = predict_data_parallel((row.single_step, row.single_step), row.grad_bytes, where.gpus, where,
                                   max(where.per_node), "--step-time", "--params", window=row.window,
                                   interconnect=links[row.cluster], fitted=fitted, limit=False,
                                   sync_model="exponential")
        out[i] = dp.sync_time_seconds[0]
    return out
