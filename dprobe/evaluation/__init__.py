"""Rolling-origin evaluation of forecasters against the baselines."""

from dprobe.evaluation.harness import EvalConfig, EvalResult, evaluate_dataset

__all__ = ["EvalConfig", "EvalResult", "evaluate_dataset"]
