"""Every ``--help`` of ``dprobe`` (each command and each sub-command, ``dprobe train`` included) is built without
importing the heavy packages a run needs: so that it comes in a fraction of a second (benchmarks/help_speed.py
times them; the target is 0.5 s)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dprobe.cli import SUBCOMMANDS, build_parser

# what a help page must not import: seconds of start-up between them on a small machine
HEAVY = ("torch", "lightning", "pytorch_lightning", "hydra", "omegaconf", "pandas", "pydantic", "pydantic_settings")


def help_commands() -> list[tuple[str, ...]]:
    """``()`` (``dprobe --help``), every command and every sub-command of those that have them."""
    out: list[tuple[str, ...]] = [()]
    for name in SUBCOMMANDS:
        out.append((name,))
        command = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        parser = command.choices[name]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(name, sub) for sub in action.choices]
    return out


def imported_by_help(*words: str) -> tuple[int, list[str], str]:
    """Exit status, the heavy packages imported and the text printed by ``dprobe WORDS --help``, in a fresh
    process."""
    code = (f"import sys, json, contextlib, io\nfrom dprobe.cli import main\nout = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out):\n    try:\n        status = main({[*words, '--help']!r})\n"
            "    except SystemExit as exc:\n        status = exc.code\n"
            f"print(json.dumps([status, sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), "
            "out.getvalue()]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    status, heavy, text = json.loads(proc.stdout.strip().splitlines()[-1])
    return status, heavy, text


def test_every_command_and_sub_command_is_listed():
    commands = help_commands()
    assert {("train",), ("simulate", "sharing"), ("simulate", "quota"), ("gpu", "calibrate"),
            ("profiles", "add")} <= set(commands)


@pytest.mark.parametrize("words", help_commands(), ids=lambda w: " ".join(w) or "dprobe")
def test_help_imports_no_heavy_package(words):
    status, heavy, text = imported_by_help(*words)
    assert status in (0, None) and "usage:" in text
    assert heavy == [], f"dprobe {' '.join(words)} --help imported {heavy}"


def test_train_help_lists_the_config_groups_without_hydra():
    from dprobe.train import config_dir, config_groups

    status, heavy, text = imported_by_help("train")
    assert status == 0 and heavy == []
    groups = config_groups(config_dir())
    assert {"exp", "data", "trainer", "model"} <= set(groups) and "gnn" in groups["exp"]
    for group, options in groups.items():
        assert f"{group}: {', '.join(options)}" in text
    assert "--cfg job" in text and "--hydra-help" in text
