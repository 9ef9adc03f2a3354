"""What a trained forecaster knows about each of its tasks (one metric of one data set)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TaskSpec:
    """What a checkpoint must know about a task to forecast it."""

    name: str  # the metric, e.g. gpu_memory_bytes
    dataset: str
    leads: tuple[int, ...]
    step_seconds: float
    covariates: tuple[str, ...]
    scale_floor: float

    def to_dict(self) -> dict:
        return {"name": self.name, "dataset": self.dataset, "leads": list(self.leads),
                "step_seconds": self.step_seconds, "covariates": list(self.covariates),
                "scale_floor": self.scale_floor}

    @classmethod
    def from_dict(cls, d: dict) -> TaskSpec:
        return cls(name=d["name"], dataset=d["dataset"], leads=tuple(d["leads"]),
                   step_seconds=float(d["step_seconds"]), covariates=tuple(d["covariates"]),
                   scale_floor=float(d["scale_floor"]))
