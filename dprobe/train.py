"""The training command: ``python train.py [OVERRIDES]`` in a checkout, ``dprobe train [OVERRIDES]`` wherever
dprobe is installed. Both run :func:`main`, the Hydra app over ``conf/train.yaml``
(:data:`dprobe.config.CONFIG_DIR`), which runs :func:`dprobe.training.run`; OVERRIDES are Hydra's
(``+exp=gnn trainer.max_epochs=1``, ``-m`` for a sweep, ``--cfg job``, ``--help``).

This module is imported for ``dprobe --help`` and by the services' slim install, so it imports Hydra, torch and
Lightning only when a run starts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

# the command line this process was started with, while dprobe train hands Hydra only its overrides
_STARTED_WITH: list[str] | None = None


def task(cfg: DictConfig) -> float | None:
    """One run: what a sweep minimises, the forecaster's validation pinball loss (``val_pinball`` of
    :func:`dprobe.training.run`)."""
    from dprobe.training import run

    if _STARTED_WITH is not None:  # Lightning's DDP launcher starts the other processes with sys.argv again
        sys.argv = _STARTED_WITH
    return run(cfg)["val_pinball"]


def hydra_app() -> Callable[..., Any]:
    """:func:`task` as a Hydra app (``hydra.main``) over the configs; its job name is ``train`` (this module's
    name: the run directory's ``train.log``)."""
    import hydra

    from dprobe.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    return hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")(task)


def main(cfg: DictConfig | None = None) -> float | None:
    """The Hydra app: with no argument it reads its overrides from the command line (``sys.argv``) and runs
    (a sweep: once per job); with a composed ``cfg`` (:func:`dprobe.config.compose`) it runs that one."""
    return hydra_app()(cfg)


def command(overrides: Sequence[str]) -> None:
    """``dprobe train OVERRIDES``: :func:`main` with Hydra's command line made of OVERRIDES alone."""
    global _STARTED_WITH
    _STARTED_WITH, sys.argv = sys.argv, [f"{sys.argv[0]} train", *overrides]
    try:
        main()
    finally:
        sys.argv, _STARTED_WITH = _STARTED_WITH, None


def _run(args: argparse.Namespace) -> int:
    command(args.overrides)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    # every argument is Hydra's, -m, --cfg and --help included: the parser treats none of them as its own
    # option (no '-' among its prefix characters) and hands them all on
    p = sub.add_parser("train", add_help=False, prefix_chars="\0",
                       help="train and score the forecaster and the profilers, as python train.py "
                            "(Hydra overrides: +exp=gnn key=value ...; --help: the config groups)",
                       description="Hydra overrides, as for python train.py")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="Hydra overrides and flags (--help: Hydra's help)")
    p.set_defaults(func=_run)
