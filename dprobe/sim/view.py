"""What a quota policy sees of the simulated cluster at a decision: the state now and its history."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the series recorded per VC (named as helios-earth-vc's target and covariates)
HISTORY_SERIES: tuple[str, ...] = ("gpu_demand", "running_jobs", "pending_jobs", "quota_gpus")


class DemandHistory:
    """Per-VC series sampled every ``step_seconds``: each value the state at that instant (a scrape)."""

    def __init__(self, n_vcs: int, step_seconds: float, capacity: int = 1024) -> None:
        self.step_seconds = float(step_seconds)
        self._data = np.zeros((len(HISTORY_SERIES), n_vcs, capacity))
        self.length = 0

    def append(self, sample: np.ndarray) -> None:
        """One sample of every series, ``(len(HISTORY_SERIES), n_vcs)``."""
        if self.length == self._data.shape[2]:
            self._data = np.concatenate([self._data, np.zeros_like(self._data)], axis=2)
        self._data[:, :, self.length] = sample
        self.length += 1

    def window(self, steps: int) -> dict[str, np.ndarray]:
        """The last ``steps`` steps (fewer at the start) of every series: name -> ``(n_vcs, L)``."""
        lo = max(0, self.length - steps)
        return {name: self._data[k, :, lo:self.length] for k, name in enumerate(HISTORY_SERIES)}


@dataclass
class ClusterView:
    """The cluster at one decision, per VC (arrays of length n_vcs, in GPUs)."""

    now: float
    demand: np.ndarray  # GPUs held by running jobs + GPUs asked by queued jobs
    quota: np.ndarray  # the quota last set (GPUs in service + GPUs still coming up)
    history: DemandHistory | None  # None unless the policy asked for one
    held: np.ndarray | None = None  # GPUs held by the VC's running jobs (the fixed-size cluster sets it)
