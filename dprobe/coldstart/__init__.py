"""Cold-start job profiler: a training job's memory, utilisation and step time from its model alone."""

from dprobe.lazy import lazy_exports

_EXPORTS = {
    "family_of": "dprobe.coldstart.features",
    "predict_job": "dprobe.coldstart.predict",
    "ReplayEstimate": "dprobe.coldstart.replay", "replay_training_step": "dprobe.coldstart.replay",
    "cross_validate": "dprobe.coldstart.train", "train_coldstart": "dprobe.coldstart.train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
