"""What the learned model reads of a training job: its step replayed under the software stack, the features
and the analytical estimate. The one path from a job to them: ``dprobe predict``, the training sets, the
cross-validation and the benchmarks all build a job's features here, so that a figure scored on the
training runs is a figure of what ``dprobe predict`` prints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dprobe.core.gpus import GPUSpec
from dprobe.profiling.coldstart.features import analytical_for, job_features, with_host_factor
from dprobe.profiling.coldstart.replay import ReplayEstimate
from dprobe.profiling.coldstart.residual import baseline
from dprobe.profiling.coldstart.stack import SoftwareStack


@dataclass(frozen=True)
class JobInputs:
    """A job as the learned model sees it."""

    est: ReplayEstimate  # the replay (or an ONNX graph's estimate)
    feats: np.ndarray  # [len(FEATURES)], on the host factor given
    base: np.ndarray  # [4] the analytical estimate of each target (utilisation: the busy share, no stalls)
    gpu: GPUSpec
    stack: SoftwareStack


def job_inputs(model: str, batch: int, precision: str = "fp32", optimizer: str = "adamw", *, gpu: GPUSpec,
               stack: SoftwareStack, image: int | None = None, seq: int | None = None,
               config_kwargs: dict | str | None = None, host_factor: float = 1.0, grad_checkpointing: bool = False,
               cache_dir: str | Path | None = None, est: ReplayEstimate | None = None,
               roofline: str = "plain") -> JobInputs:
    """The job's replay under ``stack`` (its attention kernels; cached under ``cache_dir``; ``est``: one
    already made, e.g. a benchmark's cached replay or an ONNX graph's estimate), its features on ``gpu``'s
    roofline with the stack's ``cudnn.benchmark``, on a host ``host_factor`` times as slow as the typical
    one, and the analytical estimate. The memory format is replayed (channels-last: the model and its images
    in ``torch.channels_last``), not a feature (the corrections know NCHW).
    ``roofline``: the replay roofline of the features and the estimate
    (:func:`~dprobe.profiling.coldstart.features.op_seconds`; the shipped profiler learnt on ``plain``)."""
    if est is None:
        est = analytical_for(model, batch, precision, optimizer, image=image, seq=seq, config_kwargs=config_kwargs,
                             cache_dir=cache_dir, grad_checkpointing=grad_checkpointing, attention=stack.attention,
                             memory_format=stack.memory_format)
    row = job_features(est, batch, precision, optimizer, gpu, cudnn_benchmark=stack.cudnn_benchmark,
                       roofline=roofline)
    feats = with_host_factor(np.array(row), math.log(host_factor))
    return JobInputs(est=est, feats=feats, base=baseline(est, feats), gpu=gpu, stack=stack)
