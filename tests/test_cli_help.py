"""``dprobe --help`` and each command's ``--help`` import only what that command's parser needs: the command's
own module, not the others', and not pandas, torch, the training stack (seconds on a small machine) or pydantic
(the services' settings library, a tenth of a second)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dprobe.cli import SUBCOMMANDS, build_parser, command_of

HEAVY = ("pandas", "torch", "torch_geometric", "lightning", "pytorch_lightning", "hydra", "scipy", "timm",
         "transformers", "kubernetes", "onnxruntime",
         # the services' settings are read with pydantic-settings only once they are loaded, never for --help
         "pydantic", "pydantic_core", "pydantic_settings")


def _imported_by_help(*args: str) -> list[str]:
    """The heavy packages and dprobe command modules imported by ``dprobe ARGS --help``, in a fresh process."""
    code = (f"import sys, json\nfrom dprobe.cli import main\ntry:\n    main({[*args, '--help']!r})\n"
            "except SystemExit:\n    pass\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
            f"or m in {sorted(p for p, _ in SUBCOMMANDS.values())!r})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_listed_helps_are_the_commands_own():
    parser = build_parser()  # every command's own parser
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    own = {a.dest: a.help for a in sub._choices_actions}
    assert own == {name: help_ for name, (_, help_) in SUBCOMMANDS.items()}


def test_the_command_is_the_first_word_that_is_not_an_option():
    assert command_of(["-v", "predict", "resnet", "--batch", "8"]) == "predict"
    assert command_of(["--help"]) == "" and command_of([]) == "" and command_of(["nope", "predict"]) == ""


@pytest.mark.slow
@pytest.mark.parametrize("command", [(), ("predict",), ("graph",), ("evaluate",), ("simulate",), ("profiles",), ("sidecar",),
                                     ("scaler",)])
def test_help_imports_only_its_command(command):
    modules = _imported_by_help(*command)
    assert not [m for m in modules if m.split(".")[0] in HEAVY], modules
    commands = {m for m in modules if m.startswith("dprobe.")}
    if command:  # its own module (and what its parser builds on: predict takes graph's model options)
        assert SUBCOMMANDS[command[0]][0] in commands and len(commands) <= 2, commands
    else:  # the list of commands: none of their modules
        assert not commands


def test_an_unknown_command_is_refused_with_the_list(capsys):
    from dprobe.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
