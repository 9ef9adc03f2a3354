"""``dprobe simulate quota|fixed|sharing``: each sub-command has only its own options, and the old spellings
(no sub-command, ``--fixed``, ``--sharing``) still run the same simulation, with a note on stderr."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from dprobe.cli import main


def tiny_log(directory: Path) -> Path:
    """A philly.csv.gz of two VCs over two days: quick to replay under every policy."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for day in range(2):
        for hour in range(0, 24, 3):
            lines.append(f"2017-10-{day + 1:02d} {hour:02d}:00:00,3000.0,{1 + hour % 4},0,vca")
            lines.append(f"2017-10-{day + 1:02d} {hour:02d}:30:00,900.0,2,0,vcb")
    with gzip.open(directory / "philly.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    return directory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict, str]:
    """``dprobe ARGV``'s JSON report, its wall-clock times left out, and its stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err

    def timeless(x):
        if isinstance(x, dict):
            return {k: timeless(v) for k, v in x.items() if k != "wall_seconds"}
        return [timeless(v) for v in x] if isinstance(x, list) else x

    return timeless(json.loads(out)), err


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    return tiny_log(tmp_path_factory.mktemp("tiny-log"))


def test_quota_without_a_sub_command_is_the_quota_sub_command(capsys, log):
    args = ["--data", str(log), "--quiet", "--json", "--per-vc", "--interval", "1200"]
    new, new_err = run(capsys, "simulate", "quota", *args)
    old, old_err = run(capsys, "simulate", *args)
    assert new == old and [p["policy"] for p in new["policies"]] == ["static", "reactive", "forecast"]
    assert new_err == old_err == ""  # the default spelling needs no note


def test_fixed_flag_is_the_fixed_sub_command(capsys, log):
    args = ["--data", str(log), "--quiet", "--json", "--gpus", "16", "--scheduling", "fifo,tiresias,easy"]
    new, new_err = run(capsys, "simulate", "fixed", *args)
    old, old_err = run(capsys, "simulate", *args[:4], "--fixed", *args[4:])  # the flag anywhere, as before
    assert new == old and new["mode"] == "fixed" and len(new["runs"]) == 9
    assert new_err == ""
    assert old_err.count("\n") == 1 and "`dprobe simulate fixed ...` is the new spelling" in old_err


def test_sharing_flag_is_the_sharing_sub_command(capsys, small_alibaba_dir):
    args = ["--data", str(small_alibaba_dir), "--quiet", "--json", "--gpu-memory", "48GB",
            "--sharing-policies", "one-per-gpu,peak,oracle"]
    new, new_err = run(capsys, "simulate", "sharing", *args)
    old, old_err = run(capsys, "simulate", "--sharing", *args)
    assert new == old and [p["policy"] for p in new["policies"]] == ["one-per-gpu", "peak-2h", "oracle"]
    assert new_err == ""
    assert old_err.count("\n") == 1 and "`dprobe simulate sharing ...` is the new spelling" in old_err


def test_the_old_flags_of_both_other_simulators_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--sharing", "--fixed"])
    assert exit_.value.code == 2 and "--sharing and --fixed are two different simulations" in capsys.readouterr().err


def help_flags(capsys, *argv: str) -> set[str]:
    """The options ``dprobe simulate ARGV --help`` lists (in its usage line and option groups, not its prose)."""
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", *argv, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    usage, options = out.split("\n\n", 1)[0], out.split("\noptions:", 1)[1]
    return set(re.findall(r"--[a-z][a-z-]*", usage + options))


QUOTA_ONLY = {"--queue", "--provision-delay", "--static-gpus", "--static-percentile"}
FIXED_ONLY = {"--gpus", "--gpus-percentile", "--gpus-per-node", "--scheduling", "--las-thresholds",
              "--starve-limit", "--lend-delay", "--restart-cost", "--preempt"}
JOB_LOG = {"--vc", "--days", "--start-day", "--policies", "--interval", "--horizon-seconds", "--quantile",
           "--scaler-config", "--margin", "--tolerance", "--max-gpus", "--static-warmup", "--per-vc"}
SHARING_ONLY = {"--gpu-memory", "--repack-steps", "--sharing-policies", "--packing", "--rule", "--guard-mode",
                "--burst-combine", "--fresh-repack", "--span"}
OLD = {"--fixed", "--sharing"}


@pytest.mark.parametrize(("simulator", "own", "foreign"), [
    ("quota", QUOTA_ONLY | JOB_LOG, FIXED_ONLY | SHARING_ONLY | OLD),
    ("fixed", FIXED_ONLY | JOB_LOG, QUOTA_ONLY | SHARING_ONLY | OLD),
    ("sharing", SHARING_ONLY, QUOTA_ONLY | FIXED_ONLY | JOB_LOG | OLD),
])
def test_each_sub_commands_help_lists_only_its_own_options(capsys, simulator, own, foreign):
    flags = help_flags(capsys, simulator)
    assert own | {"--data", "--json", "--plot", "--quiet"} <= flags
    assert not flags & foreign, f"dprobe simulate {simulator} --help shows {sorted(flags & foreign)}"


def test_simulate_help_lists_the_sub_commands_and_the_old_spellings(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    assert all(re.search(rf"^\s+{name}\s", out, re.M) for name in ("quota", "fixed", "sharing"))
    assert "dprobe simulate --fixed ..." in out and "dprobe simulate --sharing ..." in out
    options = out.split("\noptions:")[1].split("\nsimulators:")[0]
    assert re.findall(r"--[a-z][a-z-]*", options) == ["--help"]  # no simulator's options at this level


def test_the_old_help_spelling_shows_the_sub_commands_help(capsys):
    assert "--gpus-per-node" in help_flags(capsys, "--fixed")
    assert "--gpu-memory" in help_flags(capsys, "--sharing")
    assert "--static-percentile" in help_flags(capsys, "--days", "1")


@pytest.mark.parametrize("simulator", ["quota", "fixed"])
def test_the_horizon_is_horizon_seconds_and_its_former_name_is_still_read(capsys, simulator):
    """`--horizon-seconds S` (docs/architecture.md's names and units); `--horizon S` still read, not shown."""
    from dprobe.cli import build_parser

    flags = help_flags(capsys, simulator)
    assert "--horizon-seconds" in flags and "--horizon" not in flags
    parser = build_parser("simulate")
    for flag in ("--horizon-seconds", "--horizon"):
        assert parser.parse_args(["simulate", simulator, flag, "1200"]).horizon == 1200.0
