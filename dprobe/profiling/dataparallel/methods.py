"""Which sync model a data-parallel prediction runs (``dprobe predict --sync-model``), and its sync seconds.

- ``buckets``: DDP's bucketed all-reduce overlapped with the backward that remains (:mod:`.buckets`), on
  the cluster's fitted links, or a never-measured cluster's nominal links times the measured efficiency;
- ``baseline``: the visible-median baseline (:mod:`.baseline`): the measured models' sync per gradient
  byte at the placement, times the job's gradient bytes; only on a measured cluster;
- ``exponential``: the earlier smooth model (:mod:`.model`), kept for comparison;
- ``auto`` (default): on a measured cluster and side (one node, several nodes), the one
  :func:`~.bucket_fit.choose_methods` shipped there (the bucket model only where it beat the baseline on
  every left-out model); on a cluster never measured, the bucket model (no baseline exists there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dprobe.profiling.dataparallel._buckets_fitted import BUCKETS_FITTED
from dprobe.profiling.dataparallel.baseline import baseline_sync, has_cluster
from dprobe.profiling.dataparallel.buckets import LinkParams, exposed_seconds
from dprobe.profiling.dataparallel.interconnect import Interconnect
from dprobe.profiling.dataparallel.placement import Placement
from dprobe.profiling.dataparallel.timeline import UNIFORM_WINDOW

SYNC_MODELS = ("auto", "buckets", "baseline", "exponential")
DEFAULT_SYNC_MODEL = "auto"


def shipped_buckets() -> dict[str, Any]:
    """The shipped bucket-model fit, baseline tables and per-cluster defaults (``_buckets_fitted.py``)."""
    return BUCKETS_FITTED


def side(where: Placement) -> str:
    """``"one node"`` or ``"several nodes"``."""
    return "several nodes" if where.nodes > 1 else "one node"


def bucket_links(interconnect: Interconnect, values: dict[str, Any]) -> LinkParams:
    """The bucket model's links: a measured cluster's fitted ones, else the nominal bandwidths times the
    median efficiency of the measured clusters (and their median latency and overlap)."""
    if interconnect.measured is not None and interconnect.measured in values["links"]:
        return LinkParams(**values["links"][interconnect.measured])
    if not (interconnect.intra.bandwidth > 0 and interconnect.inter.bandwidth > 0):
        raise ValueError(f"--interconnect {interconnect.measured or interconnect.intra.name}: no fitted links "
                         f"and no nominal bandwidth for it")
    unseen = values["unseen"]
    if "intra_efficiency" not in unseen:  # fitted on clusters of unknown nominal links: what they reach
        return LinkParams(**unseen)
    return LinkParams(intra_bandwidth=interconnect.intra.bandwidth * unseen["intra_efficiency"],
                      inter_bandwidth=interconnect.inter.bandwidth * unseen["inter_efficiency"],
                      latency=unseen["latency"], overlap=unseen["overlap"])


def resolve_sync_model(model: str, interconnect: Interconnect, where: Placement,
                       values: dict[str, Any]) -> tuple[str, str]:
    """(the sync model that runs, why) for ``--sync-model MODEL``; a ValueError for one that cannot run."""
    if model not in SYNC_MODELS:
        raise ValueError(f"--sync-model must be one of {', '.join(SYNC_MODELS)}, not {model!r}")
    cluster = interconnect.measured
    measured = cluster is not None and has_cluster(values["baseline"], cluster)
    if model == "baseline" and not measured:
        raise ValueError(f"--sync-model baseline needs a measured cluster (--interconnect "
                         f"{', '.join(sorted(values['links']))}): no measured steps of this one")
    if model != "auto":
        return model, f"--sync-model {model}"
    key = f"{cluster}|{side(where)}"
    if key in values["methods"]:
        return values["methods"][key]["method"], f"{cluster}, {side(where)}: {values['methods'][key]['why']}"
    if measured:
        return "baseline", f"{cluster}, {side(where)}: no left-out model measured here, the baseline runs"
    return "buckets", ("a cluster never measured: no visible-median baseline exists; the bucket model on the "
                       "links' nominal bandwidths x the efficiency measured clusters reach")


def sync_function(model: str, interconnect: Interconnect, grad_bytes: float, window: float | None,
                  values: dict[str, Any]) -> Callable[[float, Placement], float]:
    """``sync(single_step, placement)`` seconds of ``model`` (``buckets`` or ``baseline``) for one job."""
    if model == "buckets":
        links = bucket_links(interconnect, values)
        w = UNIFORM_WINDOW if window is None else float(window)

        def buckets(single: float, where: Placement) -> float:
            return float(exposed_seconds(links, np.array([single]), np.array([grad_bytes]),
                                         np.array([where.gpus]), np.array([where.nodes]), w)[0])
        return buckets
    if model == "baseline":
        tables, cluster = values["baseline"], str(interconnect.measured)

        def baseline(single: float, where: Placement) -> float:
            value = baseline_sync(tables, cluster, str(where), where.gpus, where.nodes, grad_bytes)
            if value is None:
                raise ValueError(f"no visible-median baseline for {cluster}, {side(where)}")
            return value
        return baseline
    raise ValueError(f"no sync function for {model!r}")
