"""How long ``dprobe --help`` and every command's and sub-command's ``--help`` take, wall clock, as a user runs
them (a fresh process each time), beside the bare interpreter start (``python -c pass``) measured in the same
run: min and median of ``--repeat`` runs each, and each median over the baseline's.

    .venv/bin/python benchmarks/help_speed.py [--repeat 5] [--check]

Target: every help in 0.5 s or less. The commands are those ``tests/test_help_imports.py`` walks (the same
function lists them); on a busy machine run it under ``nice`` and read the ratios to the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.5
ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], repeat: int) -> list[float]:
    """Seconds each of ``repeat`` runs of ``cmd`` took (it must exit 0)."""
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        out.append(time.perf_counter() - t)
    return out


def help_commands() -> list[tuple[str, ...]]:
    """``()`` for ``dprobe --help``, then every command and sub-command (as :mod:`dprobe.cli` builds them)."""
    sys.path.insert(0, str(ROOT))
    from dprobe.cli import SUBCOMMANDS, build_parser

    out: list[tuple[str, ...]] = [()]
    for name in SUBCOMMANDS:
        out.append((name,))
        command = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        for action in command.choices[name]._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(name, sub) for sub in action.choices]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each command (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when a help takes over {TARGET_S:g} s (median)")
    args = ap.parse_args(argv)
    python = sys.executable
    rows = {"python -c pass (baseline)": wall([python, "-c", "pass"], args.repeat)}
    for words in help_commands():
        rows[" ".join(["dprobe", *words, "--help"])] = wall([python, "-m", "dprobe.cli", *words, "--help"],
                                                            args.repeat)
    base = statistics.median(rows["python -c pass (baseline)"])
    print(f"wall seconds over {args.repeat} runs each (a fresh process each run); target <= {TARGET_S:g} s\n")
    print("| command | min s | median s | median / baseline |")
    print("| --- | ---: | ---: | ---: |")
    over = []
    for name, runs in rows.items():
        median = statistics.median(runs)
        print(f"| `{name}` | {min(runs):.3f} | {median:.3f} | {median / base:.1f}x |")
        if median > TARGET_S:
            over.append(name)
    print(f"\n{'OVER' if over else 'PASS'}  every help <= {TARGET_S:g} s" + (f": over in {', '.join(over)}" if over
                                                                            else ""))
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
