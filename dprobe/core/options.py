"""Settings of a long-running service from defaults, a YAML file, environment variables and flags.

A service declares its options as a dataclass whose fields carry a ``help`` (and optional
``choices``) in their metadata (:func:`option`); an :class:`OptionSet` then gives it one flag per
option (``--dcgm-url``), one variable per option (``DPROBE_SIDECAR_DCGM_URL``) and a YAML file
whose keys may be nested (``dcgm: {url: ...}``), merged in that order of precedence:
defaults < file < environment < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml
from yaml.reader import ReaderError


def option(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its ``--help`` text (and ``choices=...``) in its metadata."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
INTEGER = re.compile(r"[+-]?\d+")


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value!r} ({type(value).__name__})"


def _bool(value: Any) -> bool:
    """true/false, yes/no, on/off, 1/0 (text or YAML); anything else is refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    low = value.strip().lower() if isinstance(value, str) else None
    if low not in TRUE + FALSE:
        raise ValueError(f"expected true/false (or yes/no, on/off, 1/0), got {_show(value)}")
    return low in TRUE


def _int(value: Any) -> int:
    """A whole number, written as one: ``90.7``, ``1e3``, ``true`` or ``""`` is refused, never rounded."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    raise ValueError(f"expected a whole number, got {_show(value)}")


def _float(value: Any) -> float:
    """A number (``nan`` and ``inf`` pass: the service's own checks say which options take them)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip():
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {_show(value)}")


def _str(value: Any) -> str:
    """Text; YAML that is not text (``no``, ``5``, a list) is refused rather than turned into ``'False'``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {_show(value)} (quote it in YAML)")
    return value


def _int_list(value: Any) -> list[int]:
    """``60,300`` (a flag or variable; ``[60, 300]`` too) or a YAML list of whole numbers; an empty item is
    refused (``60,,300``), an empty text is the empty list."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = _structured(text)
        else:
            value = [] if not text else [v.strip() for v in text.split(",")]
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a comma-separated list of whole numbers, got {_show(value)}")
    out = []
    for item in value:
        if item == "":
            raise ValueError(f"empty item in {value!r}")
        try:
            out.append(_int(item))
        except ValueError as exc:
            raise ValueError(f"item {item!r} of the list: {exc}") from None
    return out


def _str_dict(value: Any) -> dict[str, str]:
    """A mapping of names to text (numbers are written as text); nested lists or mappings are refused."""
    value = _structured(value) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping, got {_show(value)}")
    for k, v in value.items():
        if isinstance(v, Mapping | list) or v is None:
            raise ValueError(f"the value of {k!r} must be text, got {_show(v)}")
    return {str(k): str(v) for k, v in value.items()}


def _structured(value: Any) -> Any:
    """YAML (or JSON) text as data; data as it is."""
    return (yaml.safe_load(value) if value.strip() else None) if isinstance(value, str) else value


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def yaml_error(exc: yaml.YAMLError, text: str | None = None) -> str:
    """A YAML error on one line, ``line L, column C: not valid YAML: WHAT`` (from 1, without PyYAML's
    excerpt of the text). ``text``: what was parsed, to place an error that only knows its offset."""
    where = None
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = None if mark is None else _where(mark)
        what = _one_line(exc.problem or exc.context or "unexpected text")
        if exc.problem and exc.context:
            started = f" that starts at {_where(exc.context_mark)}" if exc.context_mark is not None else ""
            what += f" ({_one_line(exc.context)}{started})"
    elif isinstance(exc, ReaderError):
        what = _one_line(exc.reason)
        if isinstance(exc.character, int):
            what = f"character U+{exc.character:04X}: {what}"
        if text is not None and 0 <= exc.position <= len(text):
            before = text[:exc.position]
            where = f"line {before.count(chr(10)) + 1}, column {exc.position - before.rfind(chr(10))}"
        else:
            where = f"position {exc.position + 1}"
    else:
        what = _one_line(str(exc))
    return f"{where}: not valid YAML: {what}" if where else f"not valid YAML: {what}"


SERVICE_SECTIONS = ("sidecar", "scaler", "exporter")  # one file may hold the settings of several services
PARSERS: dict[str, Callable[[Any], Any]] = {"bool": _bool, "int": _int, "float": _float, "str": _str}


class OptionSet:
    """The options of dataclass ``cls``, read from ``{env_prefix}<OPTION>`` and files whose options
    may sit under a top-level ``section`` key."""

    def __init__(self, cls: type, env_prefix: str, section: str,
                 groups: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """``groups``: ``--help``'s sections, title -> the options in it, by name or by a prefix ending in
        ``_`` (``sharing_``); an option in none of them is listed under "general"."""
        self.cls, self.env_prefix, self.section = cls, env_prefix, section
        self.fields = {f.name: f for f in dataclasses.fields(cls)}
        self.groups = dict(groups or {})
        for title, names in self.groups.items():
            for n in names:
                if not n.endswith("_") and n not in self.fields:
                    raise ValueError(f"help group {title!r}: no option {n!r}")

    def group_of(self, name: str) -> str:
        """The ``--help`` section of option ``name`` (the first group naming it or a prefix of it)."""
        for title, names in self.groups.items():
            if any(name == n or (n.endswith("_") and name.startswith(n)) for n in names):
                return title
        return "general"

    def convert(self, name: str, value: Any, origin: str) -> Any:
        """``value`` (from YAML, env or a flag) as the type of option ``name``; clear error naming ``origin``."""
        f = self.fields[name]
        typ = str(f.type).replace(" ", "")
        optional = typ.endswith("|None")
        typ = typ.removesuffix("|None")
        try:
            if optional and (value is None or isinstance(value, str) and not value.strip()):
                value = None
            elif typ.startswith("list[dict"):
                value = _structured(value) or []
                if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                    raise ValueError(f"expected a list of mappings, got {_show(value)}")
                value = [dict(v) for v in value]
            elif typ == "list[int]":
                value = _int_list(value)
            elif typ.startswith("dict"):
                value = _str_dict(value)
            elif typ in PARSERS:
                value = PARSERS[typ](value)
            else:
                raise TypeError(f"options of type {typ} are not supported")
        except yaml.YAMLError as exc:
            raise ValueError(f"{origin}: option {name}: {yaml_error(exc, value)}") from exc
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{origin}: option {name}: {exc}") from exc
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{origin}: option {name} must be one of {', '.join(choices)}, got {value!r}")
        return value

    def flatten(self, doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """Nested YAML sections to flat option names (``dcgm: {url: X}`` -> ``dcgm_url``)."""
        out: dict[str, Any] = {}
        for key, value in doc.items():
            name = f"{prefix}{str(key).replace('-', '_')}"
            inner = self.flatten(value, f"{name}_") if isinstance(value, Mapping) and name not in self.fields \
                else {name: value}
            for key in inner:
                if key in out:  # dcgm: {url: ...} beside dcgm_url: one would silently win
                    raise ValueError(f"option {key} is given twice (nested and flat)")
            out.update(inner)
        return out

    def from_file(self, path: str | Path) -> dict[str, Any]:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from exc
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: {yaml_error(exc, text)}") from exc
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: the config must be a mapping of options")
        if isinstance(doc.get(self.section), Mapping):  # under `sidecar:`; beside it only other services' sections
            others = sorted(str(k) for k in doc if k != self.section and k not in SERVICE_SECTIONS)
            if others:
                raise ValueError(f"{path}: unknown key(s) {', '.join(others)} beside the {self.section}: section")
            doc = doc[self.section]
        try:
            flat = self.flatten(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        unknown = sorted(set(flat) - set(self.fields))
        if unknown:
            raise ValueError(f"{path}: unknown option(s) {', '.join(unknown)}")
        return {k: self.convert(k, v, str(path)) for k, v in flat.items()}

    def from_env(self, env: Mapping[str, str]) -> dict[str, Any]:
        out = {}
        for name in self.fields:
            key = self.env_prefix + name.upper()
            if key in env:
                out[name] = self.convert(name, env[key], key)
        return out

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """One flag per option (``--dcgm-url``), in ``--help`` sections by :meth:`group_of`, plus ``--config``;
        defaults are applied later."""
        parser.add_argument("--config", metavar="FILE", default=None,
                            help=f"YAML config file (env {self.env_prefix}CONFIG)")
        defaults = self.cls()
        sections: dict[str, Any] = {title: parser.add_argument_group(f"{title} options")
                                    for title in ("general", *self.groups)}
        for name, f in self.fields.items():
            flag = "--" + name.replace("_", "-")
            env = self.env_prefix + name.upper()
            default = getattr(defaults, name)
            if isinstance(default, dict) or isinstance(default, list) and any(isinstance(v, dict) for v in default):
                shown = json.dumps(default)  # as it would be written in the variable
            else:
                shown = "unset" if default is None else repr(
                    ",".join(map(str, default)) if isinstance(default, list) else default)
            help_text = f"{f.metadata['help']} (env {env}; default: {shown})".replace("%", "%%")
            kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
            if str(f.type) == "bool":
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["metavar"] = name.split("_")[-1].upper()
                if f.metadata.get("choices"):
                    kw["choices"] = f.metadata["choices"]
            sections[self.group_of(name)].add_argument(flag, **kw)

    def load(self, args: argparse.Namespace | Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None) -> Any:
        """Merge defaults < YAML file < environment < flags into a validated instance of the dataclass."""
        env = os.environ if env is None else env
        given = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
        config_file = given.pop("config", None) or env.get(self.env_prefix + "CONFIG")
        values: dict[str, Any] = {}
        if config_file:
            values.update(self.from_file(config_file))
        values.update(self.from_env(env))
        values.update({k: self.convert(k, v, "--" + k.replace("_", "-")) for k, v in given.items()
                       if k in self.fields})
        return self.cls(**values).validate()


def add_service_parser(subparsers: argparse._SubParsersAction, name: str, help: str, description: str,
                       options: OptionSet, run: Callable[[Any], int]) -> argparse.ArgumentParser:
    """The subcommand of a long-running service: one flag per option; its ``func`` loads the config
    (defaults < file < environment < flags), sets the log level, and calls ``run(config)``."""
    parser = subparsers.add_parser(name, help=help, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_arguments(parser)

    def func(args: argparse.Namespace) -> int:
        config = options.load({k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")})
        level = getattr(logging, config.log_level.upper(), logging.INFO)
        if getattr(args, "verbose", 0):
            level = min(level, logging.WARNING - 10 * min(args.verbose, 2))
        logging.getLogger("dprobe").setLevel(level)
        return run(config)

    parser.set_defaults(func=func)
    return parser
