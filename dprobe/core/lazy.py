"""Lazy package exports (names imported on first use, so that ``dprobe --help`` does not load torch), and
what to say when an optional part of an installation is missing."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module path) when ``name`` is first used."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__


# the packages that only the full install (`pip install 'dprobe[train]'`, the train extra) brings: the services'
# install (`pip install dprobe`, the base requirements) leaves them out, and the sidecar then forecasts with an
# ONNX model, without job profiles (tests/test_services_install.py checks both lists against pyproject.toml)
FULL_INSTALL = {"torch": "torch", "torchvision": "torchvision", "torch_geometric": "torch-geometric",
                "pytorch_lightning": "pytorch-lightning", "lightning_fabric": "pytorch-lightning",
                "torchmetrics": "torchmetrics", "hydra": "hydra-core", "omegaconf": "hydra-core",
                "transformers": "transformers", "timm": "timm", "statsforecast": "statsforecast", "onnx": "onnx",
                "matplotlib": "matplotlib", "tensorboard": "tensorboard", "scipy": "scipy", "pyarrow": "pyarrow"}


# the packages of the scaler extra (`pip install 'dprobe[scaler]'`): the scaler's Kubernetes client, which the
# base install leaves out (the sidecar and a scaler reading only Prometheus run without it)
SCALER_INSTALL = {"kubernetes": "kubernetes"}
SCALER_EXTRA = "pip install 'dprobe[scaler]'"


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


def missing_package(exc: ModuleNotFoundError) -> str | None:
    """What to tell a user whose command needs a package of the full install (or of the scaler extra) that is
    not installed (None when ``exc`` is about something else)."""
    top = (exc.name or "").split(".")[0]
    if top in SCALER_INSTALL:
        return (f"this needs the Python package {SCALER_INSTALL[top]}, the scaler's Kubernetes client, which is not "
                f"installed here: install it with `{SCALER_EXTRA}` (`pip install '.[scaler]'` in dprobe's "
                "repository), or use one of dprobe's images")
    if top not in FULL_INSTALL:
        return None
    return (f"this needs the Python package {FULL_INSTALL[top]}, which is not installed here (the services-only "
            "install, `pip install dprobe`, leaves the training stack out: it forecasts with ONNX models only, "
            "without job profiles); install the training stack with `pip install 'dprobe[train]'` "
            "(`pip install '.[train]'` in dprobe's repository), or use the full image")
