"""Rolling-origin evaluation of forecasters against the baselines."""

from typing import TYPE_CHECKING

from dprobe.core.lazy import lazy_exports

_EXPORTS = {
    "EvalConfig": "dprobe.evaluation.harness",
    "EvalResult": "dprobe.evaluation.harness",
    "evaluate_dataset": "dprobe.evaluation.harness",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["EvalConfig", "EvalResult", "evaluate_dataset"]

if TYPE_CHECKING:
    from dprobe.evaluation.harness import EvalConfig, EvalResult, evaluate_dataset
