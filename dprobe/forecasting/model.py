"""The trained DProbe forecaster behind the :class:`Forecaster` interface, and its checkpoint format.

A checkpoint is a plain dict (tensors, numbers, strings) that loads with
``torch.load(path, weights_only=True)``::

    {"kind": "dprobe-forecaster", "format": 1, "dprobe_version": ...,
     "hparams": {...ForecasterModule arguments...}, "tasks": [TaskSpec dicts],
     "state_dict": {...}}
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dprobe import __version__
from dprobe.data.windows import TaskSpec
from dprobe.forecasting.base import Forecast, ForecastInput
from dprobe.forecasting.loading import register_forecaster_loader
from dprobe.models.features import make_features

KIND = "dprobe-forecaster"
FORMAT = 1


def export_checkpoint(module, tasks: list[TaskSpec], path: str | Path) -> Path:
    """Write what inference needs (no optimizer state, no pickled classes)."""
    hparams = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(module.hparams).items()}
    obj = {
        "kind": KIND,
        "format": FORMAT,
        "dprobe_version": __version__,
        "hparams": hparams,
        "tasks": [t.to_dict() for t in tasks],
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


class ModelForecaster:
    """Forecasts with a trained :class:`ForecasterModule`; one task per metric it was trained on."""

    name = "dprobe"

    def __init__(self, obj: dict, device: str = "cpu") -> None:
        from dprobe.models.lightning_module import ForecasterModule

        if obj.get("format") != FORMAT:
            raise ValueError(f"checkpoint format {obj.get('format')!r} is not supported (expected {FORMAT})")
        hp = dict(obj["hparams"])
        hp["quantiles"] = tuple(hp.get("quantiles", (0.5, 0.9, 0.99)))
        self.module = ForecasterModule(**hp)
        self.module.load_state_dict(obj["state_dict"])
        self.module.eval().to(device)
        self.device = device
        self.tasks = [TaskSpec.from_dict(t) for t in obj["tasks"]]
        self.context_length = int(hp["context_length"])
        self.quantile_levels = hp["quantiles"]
        self.version = obj.get("dprobe_version", "?")

    def task_for(self, metric: str, step_seconds: float | None = None) -> tuple[int, TaskSpec]:
        """The task trained on ``metric`` (closest step if several)."""
        matches = [(k, t) for k, t in enumerate(self.tasks) if t.name == metric]
        if not matches:
            raise ValueError(f"this checkpoint forecasts {sorted({t.name for t in self.tasks})}, not {metric!r}")
        if step_seconds is None:
            return matches[0]
        return min(matches, key=lambda kt: abs(np.log(kt[1].step_seconds / step_seconds)))

    @torch.no_grad()
    def predict(self, batch: ForecastInput) -> Forecast:
        k, spec = self.task_for(batch.metric, batch.step_seconds)
        missing = [h for h in batch.leads if h not in spec.leads]
        if missing:
            raise ValueError(f"{batch.metric}: trained for leads {spec.leads} steps, asked for {missing}")
        values = batch.values
        length = values.shape[1]
        if length < self.context_length:  # pad the left with gaps
            values = np.concatenate([np.full((len(values), self.context_length - length), np.nan), values], 1)
        values = values[:, -self.context_length :]
        cov = batch.covariates
        if cov is not None:
            if cov.shape[1] < self.context_length:
                pad = np.full((len(cov), self.context_length - cov.shape[1], cov.shape[2]), np.nan)
                cov = np.concatenate([pad, cov], 1)
            cov = cov[:, -self.context_length :]
        x, last, scale = make_features(values, cov, spec.scale_floor)
        task = torch.full((len(x),), k, dtype=torch.long, device=self.device)
        q = self.module(torch.from_numpy(x).to(self.device), task).cpu().numpy().astype(np.float64)
        q = last[:, None, None] + scale[:, None, None] * q  # back to the metric's units
        cols = [spec.leads.index(h) for h in batch.leads]
        q = q[:, cols]
        return Forecast(point=q[..., 0], quantiles=q, leads=batch.leads, quantile_levels=self.quantile_levels)


@register_forecaster_loader(KIND)
def load_model_forecaster(obj: dict) -> ModelForecaster:
    return ModelForecaster(obj)
