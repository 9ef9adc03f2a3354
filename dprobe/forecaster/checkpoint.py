"""``dprobe.pt``: the trained forecaster's checkpoint, how it is written, and the forecaster that runs it with torch.

A plain dict (tensors, numbers, strings) that loads with ``torch.load(path, weights_only=True)``
(:func:`dprobe.forecaster.loading.read_checkpoint`)::

    {"kind": "dprobe-forecaster", "format": 1, "dprobe_version": ...,
     "hparams": {...ForecasterModule arguments...}, "tasks": [TaskSpec dicts],
     "point_sources": [per task [per lead [per regime]]],
     "quantile_shifts": [per task [per regime [per lead [per quantile]]]],
     "regimes": ["moved", "recent", "held"], "workloads_trained": bool, "workload_tasks": [per task: bool],
     "short_lead_exponents": [per task],
     "split": {"validation_start": 0.6, "test_start": 0.7},
     "graph_encoder": {"path", "sha256", "mode", "dim", "version"},   # a workload token with a GNN embedding
     "state_dict": {...}}

``split`` (:class:`~dprobe.core.split.Split`) is where each series' validation and test spans started in
training; a checkpoint without it was trained with the default split. The calibration entries are
chosen on the validation windows (:func:`dprobe.forecaster.calibration.build_checkpoint`);
``dprobe.onnx`` is the same network and metadata for ONNX Runtime (:mod:`dprobe.forecaster.onnx_export`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dprobe import __version__
from dprobe.core.split import Split
from dprobe.forecaster.features import REGIMES
from dprobe.forecaster.loading import register_forecaster_loader
from dprobe.forecaster.runtime import FORMAT, KIND, TrainedForecaster
from dprobe.forecaster.tasks import TaskSpec


def checkpoint_dict(module, tasks: list[TaskSpec], point_sources: list[list] | None = None,
                    quantile_shifts: list | None = None, workloads_trained: bool = False,
                    short_lead_exponents: list[float] | None = None, split: Split | None = None,
                    workload_tasks: list[bool] | None = None) -> dict:
    """What inference needs (no optimizer state, no pickled classes), as ``dprobe.pt`` holds it.

    ``point_sources``: per task and lead a name, or a name per regime
    (:func:`~dprobe.forecaster.calibration.select_point_sources`);
    ``quantile_shifts``: per task ``(H, Q)`` or, per regime, ``(R, H, Q)``
    (:func:`~dprobe.forecaster.calibration.conformal_shifts`);
    ``short_lead_exponents``: per task, how the quantiles widen below the first lead
    (:func:`~dprobe.forecaster.calibration.select_short_lead_exponents`; linearly when not given).
    ``workloads_trained``: some training series had a known workload, so the model's
    known-workload path was trained; without it, forecasts ignore any graph they are given.
    ``workload_tasks``: per task, whether its training series had a known workload; a task without (the
    anonymous series') forecasts with the unknown token whatever graph it is given (all, when not given).
    ``split``: the time split the module was fitted with (the default when not given).
    """
    hparams = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(module.hparams).items()}
    obj = {
        "kind": KIND,
        "format": FORMAT,
        "dprobe_version": __version__,
        "hparams": hparams,
        "tasks": [t.to_dict() for t in tasks],
        "point_sources": point_sources or [["model"] * len(t.leads) for t in tasks],
        "quantile_shifts": quantile_shifts or [],
        "regimes": list(REGIMES),  # what the per-regime entries above are of
        "workloads_trained": bool(workloads_trained),
        "workload_tasks": [bool(v) for v in workload_tasks] if workload_tasks is not None
        else [bool(workloads_trained)] * len(tasks),
        "short_lead_exponents": [float(e) for e in short_lead_exponents or [1.0] * len(tasks)],
        "split": (split or Split()).to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
    }
    encoder = encoder_record(hparams)
    if encoder is not None:
        obj["graph_encoder"] = encoder
    return obj


def encoder_record(hparams: dict) -> dict | None:
    """What a checkpoint records of the graph encoder its workload token reads (None for a token without
    one): its path (:data:`~dprobe.graph.embed.DEFAULT_ENCODER` for the shipped one), SHA-256, embedding
    mode and length, so that inference embeds graphs as training did, or refuses another encoder."""
    from dprobe.data.workloads import TOKENS

    mode = TOKENS.get(hparams.get("workload_token") or "vector")
    if not hparams.get("use_graph") or mode is None:
        return None
    from dprobe.graph.embed import CHECKPOINT_VERSION
    from dprobe.graph.identity import DEFAULT_ENCODER, file_digest, resolve_encoder_path

    given = hparams.get("graph_encoder")
    path = resolve_encoder_path(given)
    return {"path": str(given) if given else DEFAULT_ENCODER, "sha256": file_digest(path), "mode": mode,
            "dim": int(hparams["d_graph"]) - _vector_dim(), "version": CHECKPOINT_VERSION}


def _vector_dim() -> int:
    from dprobe.data.workloads import workload_dim

    return workload_dim()


def save_checkpoint(obj: dict, path: str | Path) -> Path:
    """Write a :func:`checkpoint_dict` to ``path`` (its folder created if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


def export_checkpoint(module, tasks: list[TaskSpec], path: str | Path, **choices) -> Path:
    """Write :func:`checkpoint_dict` of the arguments to ``path``."""
    return save_checkpoint(checkpoint_dict(module, tasks, **choices), path)


def network_from_checkpoint(obj: dict):
    """The plain-torch network (no Lightning) of a ``dprobe.pt`` dict, in eval mode."""
    from dprobe.forecaster.network import build_network

    if obj.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {obj.get('format')!r} is not supported (expected {FORMAT})")
    net = build_network(**obj["hparams"])
    prefix = "net."
    net.load_state_dict({k[len(prefix):]: v for k, v in obj["state_dict"].items() if k.startswith(prefix)})
    return net.eval()


class ModelForecaster(TrainedForecaster):
    """A ``dprobe.pt`` checkpoint run with torch (training, evaluation)."""

    def __init__(self, obj: dict, device: str = "cpu") -> None:
        self.module = network_from_checkpoint(obj).to(device)
        self.device = device
        self._setup(obj)

    @torch.no_grad()
    def _network(self, x: np.ndarray, stats: np.ndarray, task: np.ndarray, cond: np.ndarray | None = None,
                 known: np.ndarray | None = None) -> np.ndarray:
        def t(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(a).to(self.device)

        return self.module(t(x), t(stats), t(task), t(cond), t(known)).cpu().numpy()


@register_forecaster_loader(KIND)
def load_model_forecaster(obj: dict) -> ModelForecaster:
    return ModelForecaster(obj)
