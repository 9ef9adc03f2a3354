"""Load the forecaster the services run: a trained checkpoint, the one shipped with dprobe, or a baseline.

A path ending in ``.onnx`` is a trained forecaster exported to ONNX (``python
train.py`` writes ``dprobe.onnx`` beside ``dprobe.pt``), run with ONNX Runtime.
:data:`SHIPPED_FORECASTER` is such an export, of ``python train.py +exp=gnn`` on the
bundled data, installed with the package: the model named :data:`SHIPPED`.

A checkpoint is a ``torch.save``-d dict with at least ``"kind"`` (which loader
in :data:`FORECASTER_LOADERS` rebuilds it) and ``"dprobe_version"``; it is
read with ``weights_only=True`` (no code runs from the file).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dprobe.forecaster.base import Forecaster

log = logging.getLogger(__name__)

# kind -> function(checkpoint dict) -> Forecaster; trained models register here
FORECASTER_LOADERS: dict[str, Callable[[dict], Forecaster]] = {}
REQUIRED_KEYS = ("kind", "dprobe_version")
# modules whose import registers the trained models' loaders (imported on first use)
BUILTIN_LOADER_MODULES = ("dprobe.forecaster.checkpoint",)
SHIPPED = "dprobe"  # the shipped forecaster, where a model is named (beside the baselines' names)
SHIPPED_FORECASTER = Path(__file__).resolve().parent.parent / "default_forecaster.onnx"


def checkpoint_path(value: str | Path | None) -> str | Path | None:
    """A ``--checkpoint`` value as the commands take it: :data:`SHIPPED` names the shipped forecaster's
    file; anything else is a path (None or "" for none)."""
    return SHIPPED_FORECASTER if str(value or "") == SHIPPED else (value or None)


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: missing, corrupt, truncated or incompatible."""


def register_forecaster_loader(kind: str) -> Callable[[Callable[[dict], Forecaster]], Callable[[dict], Forecaster]]:
    """Decorator: ``@register_forecaster_loader("dprobe-gnn")`` on ``def load(ckpt: dict) -> Forecaster``."""

    def deco(fn: Callable[[dict], Forecaster]) -> Callable[[dict], Forecaster]:
        FORECASTER_LOADERS[kind] = fn
        return fn

    return deco


@dataclass
class LoadedModel:
    """The forecaster and what ``dprobe_model_info`` reports about it."""

    forecaster: Forecaster
    kind: str
    version: str
    checkpoint: str  # "" for a baseline
    fallback_reason: str = ""


def _import_loader_modules() -> None:
    for name in BUILTIN_LOADER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            log.warning("forecaster loaders of %s unavailable: %s", name, exc)


def _major(version: str) -> str:
    return str(version).split(".")[0]


def _load_failure(exc: Exception) -> str:
    """The part of a ``torch.load`` error that says what is wrong with the file.

    A weights-only load that meets bytes it does not accept (random bytes, a pickle of arbitrary
    objects) opens with advice to load with ``weights_only=False``; dprobe never does that, so only
    the unpickler's own finding is kept ("Unsupported operand 149", "Unsupported global: ...").
    """
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        detail = [ln.strip() for ln in text.split("WeightsUnpickler error:", 1)[1].splitlines() if ln.strip()]
        return f"a weights-only load refuses it ({detail[0] if detail else type(exc).__name__})"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def load_torch_dict(path: str | Path) -> dict:
    """``torch.load(path, weights_only=True)`` of a checkpoint dict (any dprobe model's), with a
    :class:`CheckpointError` naming the file when it is missing, damaged or holds something else."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file (RuntimeError, EOFError, pickle errors)
        raise CheckpointError(f"checkpoint {path}: cannot be read (corrupt, truncated or not a torch file): "
                              f"{_load_failure(exc)}".rstrip(": ")) from exc
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path}: holds a {type(ckpt).__name__}, not a dprobe checkpoint dict")
    return ckpt


def read_checkpoint(path: str | Path) -> dict:
    """The forecaster checkpoint dict at ``path``, checked for the keys every checkpoint carries."""
    ckpt = load_torch_dict(path)
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path}: not a dprobe checkpoint (missing key(s) {', '.join(missing)})")
    return ckpt


def _load_onnx(path: Path) -> LoadedModel:
    """A ``dprobe.onnx`` export, run with ONNX Runtime (torch is not imported)."""
    from dprobe import __version__
    from dprobe.forecaster.runtime import OnnxForecaster

    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        forecaster = OnnxForecaster(path)
    except Exception as exc:  # onnxruntime raises its own types for damaged files
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(f"checkpoint {path}: not a usable dprobe ONNX export "
                              f"({type(exc).__name__}: {first})") from exc
    if _major(forecaster.version) != _major(__version__):
        raise CheckpointError(f"checkpoint {path}: written by dprobe {forecaster.version}, "
                              f"incompatible with {__version__}")
    return LoadedModel(forecaster, kind="dprobe-forecaster (onnx)", version=forecaster.version,
                       checkpoint=str(path))


def _load_checked(path: str | Path) -> LoadedModel:
    from dprobe import __version__

    if Path(path).suffix == ".onnx":
        return _load_onnx(Path(path))
    ckpt = read_checkpoint(path)
    kind, version = str(ckpt["kind"]), str(ckpt["dprobe_version"])
    if _major(version) != _major(__version__):
        raise CheckpointError(f"checkpoint {path}: written by dprobe {version}, incompatible with {__version__}")
    if kind not in FORECASTER_LOADERS:
        _import_loader_modules()
    loader = FORECASTER_LOADERS.get(kind)
    if loader is None:
        known = ", ".join(sorted(FORECASTER_LOADERS)) or "none registered"
        raise CheckpointError(f"checkpoint {path}: unknown model kind {kind!r} (known: {known})")
    try:
        forecaster = loader(ckpt)
    except CheckpointError:
        raise
    except Exception as exc:  # shape mismatch, missing tensors: the file does not fit this code
        raise CheckpointError(f"checkpoint {path}: incompatible with this dprobe ({type(exc).__name__}: {exc})") from exc
    return LoadedModel(forecaster, kind=kind, version=version, checkpoint=str(path))


def serves(forecaster: Forecaster, metric: str) -> bool:
    """Whether ``forecaster`` forecasts ``metric``: a trained one only the metrics it learnt (or their
    aliases), a baseline any."""
    task_for = getattr(forecaster, "task_for", None)
    if task_for is None:
        return True
    try:
        task_for(metric)
    except ValueError:
        return False
    return True


def open_forecaster(checkpoint: str | Path | None, fallback: str = "ewma",
                    fallback_on_error: bool = False, metrics: tuple[str, ...] = ()) -> LoadedModel:
    """A checkpoint's forecaster, or the ``fallback`` model when there is none: a baseline's name, or
    :data:`SHIPPED` for the forecaster shipped with dprobe.

    A bad checkpoint raises :class:`CheckpointError` naming the file and the
    reason, unless ``fallback_on_error``: then the ``fallback`` model is used and the
    reason is logged and kept in ``fallback_reason`` (should the shipped forecaster fail too, the
    EWMA baseline). With ``metrics``, a checkpoint that forecasts none of them is a bad one.
    """
    if not checkpoint and fallback == SHIPPED:
        checkpoint, fallback = SHIPPED_FORECASTER, "ewma"
    if checkpoint:
        try:
            loaded = _load_checked(checkpoint)
            if metrics and not any(serves(loaded.forecaster, m) for m in metrics):
                learnt = sorted({t.name for t in getattr(loaded.forecaster, "tasks", [])})
                raise CheckpointError(f"checkpoint {checkpoint}: forecasts {', '.join(learnt) or 'nothing'}, none "
                                      f"of {', '.join(metrics)} (train it on series of GPU memory or utilisation, "
                                      "e.g. +exp=alibaba)")
            return loaded
        except CheckpointError as exc:
            if not fallback_on_error:
                raise
            log.warning("%s; using the %s instead", exc,
                        "forecaster shipped with dprobe" if fallback == SHIPPED else f"{fallback} baseline")
            loaded = open_forecaster(None, fallback, True, metrics)
            loaded.fallback_reason = str(exc)
            return loaded
    return _baseline(fallback)


def _baseline(name: str) -> LoadedModel:
    from dprobe import __version__
    from dprobe.forecaster.baselines import make_baseline

    return LoadedModel(make_baseline(name), kind=f"baseline:{name}", version=__version__, checkpoint="")


def load_forecaster(checkpoint: str | Path | None, fallback: str = "ewma",
                    fallback_on_error: bool = False) -> Forecaster:
    """``None`` -> the ``fallback`` baseline; a path -> the checkpoint's forecaster (see :func:`open_forecaster`)."""
    return open_forecaster(checkpoint, fallback, fallback_on_error).forecaster
