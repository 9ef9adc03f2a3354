"""Job-scale prediction for a job that has just started: the shipped checkpoint, read back, and where the
job's memory and utilisation are heading from its first second of samples."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dprobe.profiling.jobscale.features import (
    FIRST_SECONDS,
    HORIZON_SECONDS,
    OBS_FEATURES,
    ColdStartInputs,
    JobScaleDataset,
    first_second,
    first_second_features,
    logit,
)
from dprobe.profiling.jobscale.model import LEVELS, JobScaleNet, graph_anchor, predict_quantiles

KIND = "dprobe-jobscale"
FORMAT = 1
DEFAULT_CHECKPOINT = Path(__file__).with_name("default_jobscale.pt")  # shipped: `python train.py +exp=gnn`


@dataclass(frozen=True)
class JobScalePrediction:
    """Where a started job is heading (``job_scale`` in ``dprobe predict``'s JSON: :meth:`as_dict`)."""

    after_seconds: float  # the samples read: the job's first seconds
    horizon_seconds: float  # the span predicted, after them
    variant: str  # the checkpoint's: "no_graph" or "graph"
    samples_used: int
    checkpoint: str
    memory_plateau_bytes: dict[str, int]  # by quantile: "p50", "p90", "p99"
    gpu_utilization: dict[str, float]  # the mean over the horizon, by quantile

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_jobscale(path: str | Path) -> tuple[JobScaleNet, dict[str, Any]]:
    """A ``jobscale.pt`` from :func:`~dprobe.profiling.jobscale.train.train_jobscale` (loaded with
    ``weights_only=True``) and its network."""
    from dprobe.forecaster.loading import load_torch_dict

    ckpt = load_torch_dict(path)
    if ckpt.get("kind") != KIND:
        raise ValueError(f"{path}: not a dprobe job-scale checkpoint (train one with `python train.py +exp=gnn`)")
    if ckpt.get("format") != FORMAT or ckpt.get("obs_features") != OBS_FEATURES:
        raise ValueError(f"{path}: job-scale checkpoint format {ckpt.get('format')} or its features differ "
                         "from this dprobe's; retrain it with `python train.py +exp=gnn`")
    net = JobScaleNet(ckpt["n_features"], graph_dim=ckpt["graph_dim"])
    net.load_state_dict(ckpt["state_dict"])
    return net.eval(), ckpt


def predict_next(checkpoint: str | Path, samples: Any, batch: int, precision: str, optimizer: str,
                 coldstart: ColdStartInputs | None = None, host_stall_s: float = 0.0,
                 graph: Any = None, loaded: tuple[JobScaleNet, dict[str, Any]] | None = None) -> JobScalePrediction:
    """Where a job that has just started is heading over the next ``HORIZON_SECONDS``: its memory
    plateau (bytes) and mean GPU utilisation (0-1), p50 / p90 / p99, from its first second of samples.

    ``samples``: a frame with ``t_rel`` (seconds since the job's first sample), ``mem_used_bytes``,
    ``mem_total_bytes`` and ``gpu_util_pct`` (:func:`dprobe.data.gpu_samples.read_gpu_samples`); rows
    after the first second are not used. ``coldstart``: what the graph variant needs from the cold-start
    profiler's prediction of the job; ``graph``: the model graph as PyG ``Data``, for a checkpoint with a
    GNN embedding. ``loaded``: ``checkpoint`` as :func:`load_jobscale` already read it.
    """
    net, ckpt = loaded or load_jobscale(checkpoint)
    first = first_second(samples)
    ds = JobScaleDataset(obs=np.array([first_second_features(first, batch, precision, optimizer, host_stall_s)]))
    variant = ckpt["variant"]
    if variant == "graph":
        if coldstart is None:
            raise ValueError(f"{checkpoint}: the graph variant needs the cold-start prediction of the job")
        util = np.array([coldstart.gpu_utilization], dtype=np.float64)
        graph_feats = [np.log(max(coldstart.gpu_seconds, 1e-7)), np.log(max(coldstart.host_seconds, 1e-7))]
        ds.coldstart_util, ds.graph_feats, ds.graphs = util, np.array([[*graph_feats, *logit(util)]]), [graph]
        ds.device_estimate = np.array([coldstart.device_memory_bytes], dtype=np.float64)
        if net.encoder is not None and graph is None:
            raise ValueError(f"{checkpoint}: this checkpoint embeds the model graph; give the graph")
    q = predict_quantiles(net, ds, np.arange(1), variant, np.array(ckpt["quantile_shifts"]))[0]  # (2, Q)
    if variant == "graph":  # memory: the graph rule (see train.cross_validate_predictions)
        q[0] = graph_anchor(ds, np.arange(1))[0] * np.exp(np.asarray(ckpt["memory_log_offsets"]))
    names = [f"p{round(100 * level)}" for level in LEVELS]
    return JobScalePrediction(
        after_seconds=FIRST_SECONDS, horizon_seconds=HORIZON_SECONDS, variant=variant, samples_used=int(len(first)),
        checkpoint=str(checkpoint), memory_plateau_bytes={k: int(v) for k, v in zip(names, q[0], strict=True)},
        gpu_utilization={k: round(float(np.clip(v, 0, 1)), 4) for k, v in zip(names, q[1], strict=True)})
