"""``dprobe predict``'s prediction: the cold-start profiler's, and for a job that has started, where job
scale says it is heading from its first second of samples (the one module that reads both profilers)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dprobe.profiling.coldstart.predict import JobPrediction, check_job, predict_job

if TYPE_CHECKING:  # job scale (and PyG with it) is imported only for a started job's --samples
    from dprobe.profiling.jobscale.predict import JobScalePrediction

CHECKED = ("image", "seq", "host_stall_s", "host_factor", "gpu", "stack", "mode")  # what check_job reads besides the batch


@dataclass(kw_only=True)
class StartedJobPrediction(JobPrediction):
    """A started job's prediction: the cold-start one, and where the job is heading (``job_scale``)."""

    job_scale: JobScalePrediction

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "job_scale": self.job_scale.as_dict()}


def predict_with_samples(model: str, batch: int, samples: Any = None, jobscale_checkpoint: str | Path | None = None,
                         **job: Any) -> JobPrediction:
    """:func:`~dprobe.profiling.coldstart.predict.predict_job` of the job (``job``: its other arguments),
    and with ``samples``, the job's first second of GPU samples once it has started
    (:func:`dprobe.data.gpu_samples.read_gpu_samples`), a :class:`StartedJobPrediction` with ``job_scale``:
    where its memory and utilisation are heading over the next ten seconds
    (:func:`~dprobe.profiling.jobscale.predict.predict_next`), from ``jobscale_checkpoint`` (default: the
    one shipped with dprobe). The samples and the checkpoints are checked before the replay (seconds)."""
    check_job(batch, **{k: v for k, v in job.items() if k in CHECKED})
    if samples is not None and job.get("mode", "train") == "inference":
        raise ValueError("--samples forecasts a started training job (the job-scale model learnt from training "
                         "runs); leave it out with --mode inference")
    if samples is None:
        if jobscale_checkpoint is not None:
            raise ValueError("--jobscale-checkpoint is read with --samples (the job's first samples) only")
        return predict_job(model, batch, **job)
    from dprobe.graph.encoder import graph_to_data
    from dprobe.profiling.jobscale.features import ColdStartInputs, first_second
    from dprobe.profiling.jobscale.predict import DEFAULT_CHECKPOINT, load_jobscale, predict_next

    first_second(samples)
    checkpoint = jobscale_checkpoint or DEFAULT_CHECKPOINT
    loaded = load_jobscale(checkpoint)
    cold = predict_job(model, batch, **job)
    if cold.graph is None:
        raise ValueError(f"no model graph of {model} to predict its first second from")
    job_scale = predict_next(checkpoint, samples, cold.batch, cold.precision, cold.optimizer,
                             ColdStartInputs.from_prediction(cold), host_stall_s=cold.host_stall_s,
                             graph=graph_to_data(cold.graph), loaded=loaded)
    return StartedJobPrediction(**{f.name: getattr(cold, f.name) for f in fields(cold)}, job_scale=job_scale)
