"""Job scale: from a run's model graph and its first second of NVML samples, where its memory and
utilisation are heading over the next ten seconds (the allocator's ramp to its plateau).

Targets per run of h200-profiles: the memory plateau (90th percentile of NVML used memory over
the horizon) and the mean GPU utilisation over the horizon. Predictions are p50 / p90 / p99 of
residuals to an anchor (:func:`~dprobe.profiling.jobscale.model.anchors`: what the first second shows,
or for the graph variant's utilisation the cold-start prediction; log-ratio for memory, logit difference
for utilisation). Three ways to predict are compared, leave-model-family-out:

- ``persist``: the plateau is the largest memory seen so far, utilisation stays at its mean;
- ``no_graph``: a learned model of the first second and the job's static features
  (batch, precision, optimizer);
- ``graph``: memory from the model graph: the plateau is the larger of what the first second
  showed and the cold-start profiler's device-memory estimate (the training step replayed on
  the graph, plus the CUDA context; :mod:`dprobe.profiling.coldstart`), with quantiles from the same
  rule's errors on the training runs; utilisation as a learned correction to the cold-start
  profiler's prediction of the job's utilisation while it trains (most runs are past their first,
  slow step after a second, so that is where they are heading), given the graph-derived
  features too (the roofline's GPU and host time of a step, the cold-start prediction;
  optionally a GNN embedding of the graph). The cold-start predictions the model learns from are
  leave-family-out ones, as it will meet them for a new architecture.

Modules: ``features`` (the first second as features, the jobs' record), ``model`` (the network, residuals
and anchors), ``predict`` (the shipped checkpoint, prediction for a started job); for training ``data``
(the bundled runs), ``train`` (fitting, calibration, cross-validation, the checkpoint) and ``report``.
Job scale imports the cold-start profiler, never the other way round.
"""

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "load_jobscale": "dprobe.profiling.jobscale.predict", "predict_next": "dprobe.profiling.jobscale.predict",
    "train_jobscale": "dprobe.profiling.jobscale.train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
