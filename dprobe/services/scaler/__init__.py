"""The scaler: forecasts -> demand per workload and virtual cluster -> scaling recommendations."""

from dprobe.services.scaler.config import ScalerConfig, load_config
from dprobe.services.scaler.policy import Decision, Policy, RatePolicy, Recommender, ScalingRules

__all__ = ["Decision", "Policy", "RatePolicy", "Recommender", "ScalerConfig", "ScalingRules", "load_config"]
