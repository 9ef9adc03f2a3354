"""``dprobe simulate``: one sub-command per simulator (``quota``, ``fixed``, ``sharing``), each with only its own
options; the old spellings (no sub-command, ``--fixed``, ``--sharing``) still read as the sub-commands."""

from __future__ import annotations

import argparse
import sys

from dprobe.sim.fixed import cli as fixed_cli
from dprobe.sim.quota import cli as quota_cli
from dprobe.sim.sharing import cli as sharing_cli

SIMULATORS = {"quota": quota_cli, "fixed": fixed_cli, "sharing": sharing_cli}
DEFAULT = "quota"  # `dprobe simulate [options]` with no sub-command
OLD_FLAGS = {"--fixed": "fixed", "--sharing": "sharing"}  # the old spellings of the other two
HELP_FLAGS = ("-h", "--help")

DESCRIPTION = """Simulate GPU clusters on traces, one simulator per sub-command (below); `dprobe simulate
SIMULATOR --help` lists a simulator's options. The old spellings still work:
`dprobe simulate [options]` is `dprobe simulate quota [options]`, and `dprobe simulate --fixed ...` and
`dprobe simulate --sharing ...` are `dprobe simulate fixed ...` and `dprobe simulate sharing ...`.

example:
  dprobe simulate quota --start-day 30 --days 14 --per-vc
  dprobe simulate fixed --scheduling fifo,tiresias --json
  dprobe simulate sharing --gpu-memory 80 --plot sharing.png"""


class SimulateParser(argparse.ArgumentParser):
    """``dprobe simulate``'s parser: reads the old spellings as the sub-commands before it parses, and names
    the sub-command an option given to another belongs to."""

    simulators: dict[str, argparse.ArgumentParser]

    def parse_known_args(self, args=None, namespace=None):
        args = self.new_spelling(list(sys.argv[1:] if args is None else args))
        parsed, extras = super().parse_known_args(args, namespace)
        name: str = parsed.simulator  # a required sub-command: argparse exits without one
        for extra in extras:
            option = extra.split("=", 1)[0]
            if option in OLD_FLAGS:
                self.simulators[name].error(f"{option} is the old spelling of `dprobe simulate "
                                            f"{OLD_FLAGS[option]}`: give one simulator")
            owners = [other for other, p in self.simulators.items()  # argparse keeps a parser's flags there
                      if other != name and option in p._option_string_actions]
            if owners:
                where = " or ".join(f"`dprobe simulate {other}`" for other in owners)
                self.simulators[name].error(f"{option} is an option of {where}, not of `dprobe simulate {name}`")
        return parsed, extras

    def new_spelling(self, args: list[str]) -> list[str]:
        """``args`` with a sub-command first: no sub-command is ``quota``, ``--fixed`` / ``--sharing`` anywhere
        the sub-command of that name (with a note on stderr); ``--help`` alone lists the sub-commands."""
        if args[:1] and (args[0] in SIMULATORS or args[0] in HELP_FLAGS):
            return args
        old = [flag for flag in OLD_FLAGS if flag in args]
        if len(old) > 1:
            self.error("--sharing and --fixed are two different simulations: choose one")
        if not old:
            return [DEFAULT, *args]
        name = OLD_FLAGS[old[0]]
        print(f"dprobe simulate: note: `dprobe simulate {name} ...` is the new spelling of `dprobe simulate "
              f"{old[0]} ...`, which still works", file=sys.stderr)
        return [name, *(a for a in args if a != old[0])]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="simulate GPU clusters on traces: quotas, a fixed-size cluster, "
                              "GPU sharing", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.__class__ = SimulateParser  # argparse makes a sub-parser of its parent's class: this one reads old spellings
    simulators = p.add_subparsers(title="simulators", dest="simulator", metavar="SIMULATOR", required=True,
                                  parser_class=argparse.ArgumentParser)
    p.simulators = {name: module.register(simulators) for name, module in SIMULATORS.items()}
