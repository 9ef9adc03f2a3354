"""Cold-start job profiler: a training job's memory, utilisation and step time from its model alone."""

from dprobe.coldstart.features import family_of
from dprobe.coldstart.predict import predict_job
from dprobe.coldstart.replay import ReplayEstimate, replay_training_step
from dprobe.coldstart.train import cross_validate, train_coldstart

__all__ = ["ReplayEstimate", "cross_validate", "family_of", "predict_job", "replay_training_step",
           "train_coldstart"]
