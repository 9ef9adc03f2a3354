"""The cold-start checkpoint: what :func:`dprobe.profiling.coldstart.train.train_coldstart` saves, read back
for prediction (with ``weights_only=True``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dprobe.profiling.coldstart.features import FEATURES
from dprobe.profiling.coldstart.model import ColdStartEnsemble, build_member

KIND = "dprobe-coldstart"
VERSION = 5  # 4: the memory head sees the op-mix shares; 5: no GPU-name features, fp16 and bf16 one "half"


def load_checkpoint(path: str | Path) -> tuple[ColdStartEnsemble, dict[str, Any]]:
    """The ensemble saved at ``path`` (in eval mode) and the checkpoint's dict; a ValueError for another
    kind of file or another version."""
    from dprobe.forecaster.loading import load_torch_dict

    ckpt = load_torch_dict(path)
    if ckpt.get("kind") != KIND:
        raise ValueError(f"{path}: not a dprobe cold-start checkpoint")
    if ckpt.get("version") != VERSION or ckpt.get("features") != FEATURES:
        raise ValueError(f"{path}: cold-start checkpoint version {ckpt.get('version')} (this dprobe reads "
                         f"version {VERSION}) or its features differ; retrain it with `python train.py +exp=coldstart`")
    hp = ckpt["hparams"]
    model = ColdStartEnsemble([build_member(hp, ckpt["n_features"]) for _ in range(hp["ensemble"])])
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt
