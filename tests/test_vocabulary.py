"""One name and one unit a concept (docs/architecture.md, "Names and units"): the services' options (flags, DPROBE_*
variables, YAML keys) and the metrics and labels they export. A horizon is in seconds (``horizon_seconds``), GPU
memory in bytes (``*_bytes``); no option or label is called ``horizons``, ``leads`` or ``*_gb`` / ``*_gib``.

Options named before this rule are listed in ``NAMED_BEFORE`` with their unit: none may be added there, and a
new option must follow the rule."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from dprobe.core.options import leaves
from dprobe.services.scaler.config import ScalerConfig
from dprobe.services.sidecar.config import SidecarConfig

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"sidecar": SidecarConfig, "scaler": ScalerConfig}

# words that make an option or a label a duration, a memory size, or a ratio (quantiles, margins, shares)
TIME_WORDS = ("timeout", "interval", "after", "backoff", "skew", "delay", "period", "window", "duration", "age",
              "lease", "renew", "retry", "stabilization", "horizon", "lead", "restore", "seconds", "latency")
MEMORY_WORDS = ("memory", "bytes", "mib", "gib", "gb", "mb", "kib", "rss")
RATIO_ENDINGS = ("quantile", "margin", "ratio", "fraction", "target", "tolerance", "threshold", "share",
                 "coverage", "speed")
FORBIDDEN = re.compile(r"^(horizons|leads|n_leads|lead_steps|max_lead)$|_(gb|gib|mb|mib|kb|kib)$|^horizon$")

# options of the services that were named before the rule, with what their unit is: none may be added, and a
# name leaves the list when the option is renamed (with its old name as an alias)
NAMED_BEFORE = {
    "sidecar": {
        "web_header_timeout": "s", "web_request_timeout": "s", "forecast_interval": "s", "stale_after": "s",
        "drop_after": "s", "sample_interval": "s", "http_timeout": "s", "max_backoff": "s", "max_clock_skew": "s",
        "job_timeout": "s", "graph_max_mib": "MiB", "job_memory_limit": "GiB", "job_rss_limit_mib": "MiB",
        "memory_limit_mib": "MiB",
    },
    "scaler": {
        "interval": "s", "http_timeout": "s", "web_header_timeout": "s", "web_request_timeout": "s",
    },
}


def _words(name: str) -> list[str]:
    return name.lower().split("_")


def _about_time(name: str) -> bool:
    return any(w.startswith(TIME_WORDS) for w in _words(name))


def _about_memory(name: str) -> bool:
    return any(w in MEMORY_WORDS for w in _words(name))


def _is_ratio(name: str) -> bool:
    return name.endswith(RATIO_ENDINGS)


def breaks_the_rule(name: str, numeric: bool) -> str | None:
    """Why an option or label ``name`` breaks the rule (None where it keeps it); ``numeric``: it holds a number
    (or numbers) — a query, a path or a switch about time or memory is named freely."""
    if FORBIDDEN.search(name):
        return "a forbidden name: a horizon is horizon_seconds, memory is *_bytes"
    if not numeric or _is_ratio(name):
        return None
    if _about_memory(name) and not name.endswith("_bytes"):
        return "a memory size not in bytes (*_bytes)"
    if _about_time(name) and not name.endswith("_seconds"):
        return "a duration not in seconds (*_seconds)"
    return None


def _numeric(type_: str) -> bool:
    return any(t in type_ for t in ("int", "float")) and not type_.startswith("dict")


def option_names(service: str) -> dict[str, str]:
    """Each option of ``service`` (its flat name, that of flags, variables and YAML keys) and its declared type."""
    return {leaf.name: str(leaf.field.type).replace(" ", "") for leaf in leaves(SERVICES[service])}


def violations(service: str) -> dict[str, str]:
    found = {name: breaks_the_rule(name, _numeric(type_)) for name, type_ in option_names(service).items()}
    return {name: why for name, why in found.items() if why}


@pytest.mark.parametrize("name, numeric, broken", [
    ("horizons", True, True), ("leads", True, True), ("gpu_memory_gb", True, True), ("memory_gib", True, True),
    ("horizon_seconds", True, False), ("gpu_memory_bytes", True, False), ("sharing_memory_quantile", True, False),
    ("stale_after", True, True), ("job_memory_limit", True, True), ("prometheus_memory_query", False, False),
    ("leader_election", False, False), ("min_points", True, False), ("scale_up_stabilization_seconds", True, False),
])
def test_the_rule_itself(name: str, numeric: bool, broken: bool) -> None:
    assert (breaks_the_rule(name, numeric) is not None) is broken


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_option_is_named_against_the_rule_beyond_those_named_before_it(service: str) -> None:
    new = {name: why for name, why in violations(service).items() if name not in NAMED_BEFORE[service]}
    assert not new, f"{service} options against docs/architecture.md's 'Names and units': {new}"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_the_options_named_before_the_rule_still_break_it(service: str) -> None:
    """A name leaves NAMED_BEFORE when it is renamed: the list holds only options that exist and break the rule."""
    gone = set(NAMED_BEFORE[service]) - set(violations(service))
    assert not gone, f"renamed or removed: take {sorted(gone)} out of NAMED_BEFORE['{service}']"


def test_the_sidecar_horizon_is_horizon_seconds() -> None:
    """The sidecar's horizons, in seconds, are horizon_seconds (the label's name); horizons is its former name."""
    names = option_names("sidecar")
    assert "horizons" not in names and "horizon_seconds" in names
    assert "horizons" not in violations("sidecar")
    assert "horizons" in next(leaf.aliases for leaf in leaves(SidecarConfig) if leaf.name == "horizon_seconds")


def test_the_scaler_horizon_is_horizon_seconds() -> None:
    assert "horizon_seconds" in option_names("scaler") and "horizons" not in option_names("scaler")


def _service_sources() -> list[Path]:
    return [ROOT / "dprobe" / "core" / "names.py", *sorted((ROOT / "dprobe" / "services").rglob("*.py"))]


def exported_metric_names() -> set[str]:
    """Every metric name the services write (``dprobe_...`` string literals in their code and dprobe.core.names)."""
    return {m for path in _service_sources() for m in re.findall(r"[\"'](dprobe_[a-z0-9_]+)[\"']", path.read_text())}


def exported_label_names() -> set[str]:
    """Every label name the services' collectors declare: ``labels=[...]``, the ``*_LABELS`` lists and the labels
    written by hand in the exposition text (``name="{value}"``)."""
    found: set[str] = set()
    for path in _service_sources():
        text = path.read_text()
        for block in re.findall(r"(?:labels=|_LABELS\s*=\s*)[\[(]([^\])]*)[\])]", text):
            found.update(re.findall(r"[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']", block))
        found.update(re.findall(r"[,{]([a-z_][a-z0-9_]*)=\\?\"\{", text))
    return found


def test_the_metrics_and_labels_were_found() -> None:
    metrics, labels = exported_metric_names(), exported_label_names()
    assert {"dprobe_predicted_gpu_memory_bytes", "dprobe_recommended_gpu_memory_bytes",
            "dprobe_last_sample_age_seconds"} <= metrics
    assert {"horizon_seconds", "quantile", "pod", "vc"} <= labels


def test_exported_metrics_say_their_unit() -> None:
    """Memory in bytes, time in seconds, utilisation as a 0-1 ratio; none in GB, GiB, MiB or percent."""
    wrong = {}
    for name in exported_metric_names():
        words = _words(name)
        if any(w in ("gb", "gib", "mib", "mb", "pct", "percent") for w in words):
            wrong[name] = "a unit other than bytes, seconds or a ratio"
        elif "memory" in words and not any(w in ("bytes", "fraction", "profile", "errors") for w in words):
            wrong[name] = "memory not in bytes"
        elif "utilization" in words and "ratio" not in words:
            wrong[name] = "utilisation not a 0-1 ratio"
        elif any(w in ("age", "duration", "latency", "cycle") for w in words) and "seconds" not in words:
            wrong[name] = "a duration not in seconds"
    assert not wrong, wrong


def test_exported_labels_keep_the_rule() -> None:
    wrong = {name: why for name in exported_label_names() if (why := breaks_the_rule(name, numeric=True))}
    assert not wrong, wrong


def command_flags() -> dict[str, argparse.Action]:
    """Every flag ``dprobe`` shows in a ``--help`` (hidden former names left out), as ``"COMMAND --flag"``."""
    from dprobe.cli import SUBCOMMANDS, build_parser

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))
            elif action.help != argparse.SUPPRESS:
                for flag in action.option_strings:
                    yield " ".join((*path, flag)), action

    return {key: action for name in SUBCOMMANDS for key, action in walk(build_parser(name), ())}


def test_command_flags_keep_the_rule():
    """Flags of every command: a horizon is --horizon-seconds (no --horizons, --leads), memory a size with its
    unit (read by dprobe.core.units.size_arg) or --*-bytes, never --*-gb; the services' flags named before the
    rule aside. (Other durations of the simulators, --interval, --provision-delay, are seconds by their help.)"""
    from dprobe.core.units import size_arg

    before = {name.replace("_", "-") for names in NAMED_BEFORE.values() for name in names}
    wrong = {}
    for key, action in command_flags().items():
        flag = key.rsplit(" ", 1)[-1]
        name = flag.lstrip("-").replace("-", "_")
        if flag.lstrip("-") in before or action.type is size_arg:
            continue
        numeric = not isinstance(action.default, bool) and (action.type in (int, float)
                                                             or isinstance(action.default, int | float))
        if FORBIDDEN.search(name):
            wrong[key] = "a forbidden name"
        elif numeric and _about_memory(name) and not (name.endswith("_bytes") or _is_ratio(name)):
            wrong[key] = "a memory size neither in bytes nor a size with its unit (size_arg)"
        elif any(w.startswith(("horizon", "lead")) for w in _words(name)) and numeric \
                and not name.endswith("_seconds"):
            wrong[key] = "a horizon not in seconds (--horizon-seconds)"
    flags = command_flags()
    assert "simulate sharing --gpu-memory" in flags and "simulate quota --horizon-seconds" in flags
    assert "simulate quota --horizon" not in flags  # the former name: read, not shown
    assert not wrong, wrong
