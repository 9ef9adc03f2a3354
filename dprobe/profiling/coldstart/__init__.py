"""Cold-start job profiler: a training job's memory, utilisation and step time from its model alone."""

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "family_of": "dprobe.profiling.coldstart.features",
    "predict_job": "dprobe.profiling.coldstart.predict",
    "ReplayEstimate": "dprobe.profiling.coldstart.replay", "replay_training_step": "dprobe.profiling.coldstart.replay",
    "cross_validate": "dprobe.profiling.coldstart.train", "train_coldstart": "dprobe.profiling.coldstart.train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
