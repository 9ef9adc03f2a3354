"""Hydra / OmegaConf helpers: where the configs are, the ``project_root`` resolver and config composition for
code and tests.

The configs are ``conf/`` at the repository's root, where a checkout's ``python train.py`` and the docs find
them; a built wheel ships the same files inside the package, as ``dprobe/conf`` (``setup.py`` copies them),
which ``dprobe train`` reads wherever dprobe is installed."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parent
# the source checkout this package is imported from (an editable install's too), or None when it is installed
CHECKOUT: Path | None = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "conf" / "train.yaml").is_file() else None
CONFIG_DIR = CHECKOUT / "conf" if CHECKOUT is not None else PACKAGE_DIR / "conf"


def project_root() -> Path:
    """The checkout's root (where ``conf/``, ``datasets/`` and ``outputs/`` are), or, where dprobe is installed
    from a wheel, the current directory (its ``datasets/``, and ``outputs/`` written there)."""
    return CHECKOUT if CHECKOUT is not None else Path.cwd()


def register_resolvers() -> None:
    """``${project_root:}``: :func:`project_root` (``paths.root_dir``)."""
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(project_root()))


def compose(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose the real configs (as ``python train.py OVERRIDES`` would) without running Hydra's app."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [])
