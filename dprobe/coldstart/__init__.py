"""Cold-start job profiler: a training job's memory, utilisation and step time from its model alone.

Names are imported on first use, so that ``dprobe --help`` does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "family_of": "dprobe.coldstart.features",
    "predict_job": "dprobe.coldstart.predict",
    "ReplayEstimate": "dprobe.coldstart.replay", "replay_training_step": "dprobe.coldstart.replay",
    "cross_validate": "dprobe.coldstart.train", "train_coldstart": "dprobe.coldstart.train",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dprobe.coldstart' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
