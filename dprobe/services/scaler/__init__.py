"""The scaler: forecasts -> demand per workload and virtual cluster -> scaling recommendations."""

from dprobe.scaling.policy import Decision, Policy, RatePolicy, Recommender, ScalingRules
from dprobe.services.scaler.config import ScalerConfig, load_config

__all__ = ["Decision", "Policy", "RatePolicy", "Recommender", "ScalerConfig", "ScalingRules", "load_config"]
