"""Cold-start job profiler: a training job's memory, utilisation and step time from its model alone.

Prediction (``predict``) reads the replay (``replay``, ``memtrack``, ``allocator``, ``autocast``,
``graph_estimate``), the job's features (``features``, ``gpus``: the GPUs' figures and ``--gpu-spec``
files, ``stack``: the software stack, ``job``: a job's replay, features and estimate on its GPU and stack,
as the training sets build them too) and the learned residual model (``model``, ``residual``, ``checkpoint``); training (``dataset``,
``timm_bench``: timm training benchmarks on other GPUs, ``fit``, ``crossval``, ``train``, ``report``)
builds on those and is never imported by prediction."""

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "family_of": "dprobe.profiling.coldstart.features",
    "GPUS": "dprobe.core.gpus", "load_gpu_spec": "dprobe.core.gpus",
    "load_timm_bench": "dprobe.profiling.coldstart.timm_bench",
    "predict_job": "dprobe.profiling.coldstart.predict", "JobPrediction": "dprobe.profiling.coldstart.predict",
    "job_inputs": "dprobe.profiling.coldstart.job", "SoftwareStack": "dprobe.profiling.coldstart.stack",
    "resolve_stack": "dprobe.profiling.coldstart.stack",
    "ReplayEstimate": "dprobe.profiling.coldstart.replay", "replay_training_step": "dprobe.profiling.coldstart.replay",
    "cross_validate": "dprobe.profiling.coldstart.crossval", "train_coldstart": "dprobe.profiling.coldstart.train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
