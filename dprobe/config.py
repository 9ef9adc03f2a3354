"""Hydra / OmegaConf helpers: the ``project_root`` resolver and config composition for code and tests."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT_ROOT / "conf"


def register_resolvers() -> None:
    """``${project_root:}`` is the checkout's root (where ``conf/`` and ``datasets/`` live)."""
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))


def compose(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose the real configs (as ``python train.py OVERRIDES`` would) without running Hydra's app."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [])
