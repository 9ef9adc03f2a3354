"""The training command: ``python train.py [OVERRIDES]`` in a checkout, ``dprobe train [OVERRIDES]`` wherever
dprobe is installed. Both run :func:`main`, the Hydra app over ``conf/train.yaml``
(:data:`dprobe.config.CONFIG_DIR`), which runs :func:`dprobe.training.run`; OVERRIDES are Hydra's
(``+exp=gnn trainer.max_epochs=1``, ``-m`` for a sweep, ``--cfg job``, ``--help``).

This module is imported for ``dprobe --help`` and by the services' slim install, so it imports Hydra, torch and
Lightning only when a run starts. Where the data sets are not there (dprobe installed from the package, run outside
its repository), ``dprobe train`` says in one line where it looks for them (:func:`check_data_dir`), before Hydra;
a run whose data a stage cannot read (:func:`dprobe.training.check_data`) stops with that one line too.
``dprobe train --help`` alone lists the config groups from the config folder (:func:`help_text`), without Hydra;
with overrides, ``--help`` is Hydra's (the config they compose)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

# the command line this process was started with, while dprobe train hands Hydra only its overrides
_STARTED_WITH: list[str] | None = None
# Hydra's flags that print and exit (help, the config, completion): they need no data; and those that compose
# another config, whose data only the composed config says (dprobe.training.check_data checks it)
INFO_FLAGS = frozenset({"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--version",
                        "--shell-completion", "-sc"})
OTHER_CONFIG_FLAGS = frozenset({"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"})


def _override(text: str) -> tuple[str, str] | None:
    """``(key, value)`` of a Hydra override ``[+|++|~]key=value``, None for a flag or a group choice's removal."""
    key, sep, value = text.lstrip("+~").partition("=")
    return (key, value) if sep and not text.startswith("-") else None


def default_data_dir(overrides: Sequence[str]) -> Path | None:
    """The directory ``paths.data_dir`` resolves to for these overrides, as conf/paths/default.yaml says:
    ``paths.data_dir=``, else ``$DPROBE_DATA_DIR``, else ``paths.root_dir`` (the checkout, or where dprobe is
    installed from a wheel the current directory) plus ``datasets``. None where an override names the data of a
    stage itself (``data.datasets=``, ``coldstart.data_dir=``, ...): :func:`dprobe.training.check_data` checks
    those once the config is composed."""
    given = dict(kv for kv in map(_override, overrides) if kv is not None)
    if any(k != "paths.data_dir" and (k.endswith(".data_dir") or k.endswith(".datasets") or k == "data.datasets")
           for k in given):
        return None
    if any("," in given.get(k, "") or "${" in given.get(k, "") for k in ("paths.data_dir", "paths.root_dir")):
        return None  # a sweep over data directories, or an interpolation: the composed config says
    if given.get("paths.data_dir"):
        return Path(given["paths.data_dir"]).expanduser()
    if os.environ.get("DPROBE_DATA_DIR"):
        return Path(os.environ["DPROBE_DATA_DIR"]).expanduser()
    if given.get("paths.root_dir"):
        return Path(given["paths.root_dir"]).expanduser() / "datasets"
    return project_root() / "datasets"


def project_root() -> Path:
    """:func:`dprobe.config.project_root` (``paths.root_dir``), without importing OmegaConf: the checkout dprobe is
    imported from, else (installed from a wheel) the current directory."""
    checkout = Path(__file__).resolve().parent.parent
    return checkout if (checkout / "conf" / "train.yaml").is_file() else Path.cwd()


def check_data_dir(overrides: Sequence[str]) -> None:
    """Refuse, in one line (a :class:`dprobe.data.DatasetError` that ``dprobe`` prints), a run whose data
    directory is not there: before Hydra, torch or any training starts, and in the services' install too. Flags
    that only print (``--help``, ``--cfg``) or compose another config (``--config-name``) pass."""
    if any(word in INFO_FLAGS | OTHER_CONFIG_FLAGS or word.startswith(("--cfg", "--config-")) for word in overrides):
        return
    data_dir = default_data_dir(overrides)
    if data_dir is not None and not data_dir.is_dir():
        from dprobe.data.common import DatasetError
        from dprobe.data.registry import WHERE_DATA_GOES

        raise DatasetError(f"no training data: {data_dir} is not a directory; {WHERE_DATA_GOES}")


def task(cfg: DictConfig) -> float | None:
    """One run: what a sweep minimises, the forecaster's validation pinball loss (``val_pinball`` of
    :func:`dprobe.training.run`). Data a stage cannot read (a :class:`dprobe.data.DatasetError`: a missing
    directory, a malformed file) ends the process with that one line (exit status 2), not Hydra's traceback."""
    from dprobe.data.common import DatasetError
    from dprobe.training import run

    prog = "dprobe train" if _STARTED_WITH is not None else Path(sys.argv[0]).name
    if _STARTED_WITH is not None:  # Lightning's DDP launcher starts the other processes with sys.argv again
        sys.argv = _STARTED_WITH
    try:
        return run(cfg)["val_pinball"]
    except DatasetError as exc:  # Hydra reports an Exception with its traceback; SystemExit passes through it
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


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
    check_data_dir(overrides)
    _STARTED_WITH, sys.argv = sys.argv, [f"{sys.argv[0]} train", *overrides]
    try:
        main()
    finally:
        sys.argv, _STARTED_WITH = _STARTED_WITH, None


HELP_FLAGS = frozenset({"--help", "-h"})


def config_dir() -> Path:
    """:data:`dprobe.config.CONFIG_DIR` without importing OmegaConf: the checkout's ``conf/``, else the one
    the wheel ships inside the package."""
    checkout = Path(__file__).resolve().parent.parent / "conf"
    return checkout if (checkout / "train.yaml").is_file() else Path(__file__).resolve().parent / "conf"


def config_groups(root: Path) -> dict[str, list[str]]:
    """Each config group under ``root`` (a folder of YAML files, ``a/b`` for a nested one) and its options
    (the files' names), sorted, as Hydra's help lists them."""
    groups: dict[str, list[str]] = {}
    for path in root.rglob("*.yaml"):
        if path.parent != root:
            groups.setdefault(path.parent.relative_to(root).as_posix(), []).append(path.stem)
    return {group: sorted(options) for group, options in sorted(groups.items())}


def help_text(root: Path | None = None) -> str:
    """``dprobe train --help``: the config groups, read from the config folder without starting Hydra (which
    takes seconds to compose the config); ``--cfg job`` and ``--hydra-help`` go to Hydra."""
    groups = config_groups(config_dir() if root is None else root)
    lines = ["usage: dprobe train [OVERRIDE ...] [HYDRA FLAG ...]", "",
             "dprobe train is powered by Hydra: python train.py's overrides and flags.", "",
             "== Configuration groups ==", "Compose your configuration from those groups (group=option)", "",
             *(f"{group}: {', '.join(options)}" for group, options in groups.items()), "",
             "== More ==",
             "  dprobe train --cfg job        the composed config (any key can be overridden: foo.bar=value)",
             "  dprobe train OVERRIDES --help Hydra's help with the config those overrides compose",
             "  dprobe train --hydra-help     Hydra's own flags (-m for a sweep, --multirun, ...)"]
    return "\n".join(lines) + "\n"


def _run(args: argparse.Namespace) -> int:
    if args.overrides and all(word in HELP_FLAGS for word in args.overrides):
        sys.stdout.write(help_text())  # the groups alone, in a fraction of a second: no Hydra
        raise SystemExit(0)  # as every other command's --help (argparse's) ends
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
