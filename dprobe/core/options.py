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
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml


def option(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its ``--help`` text (and ``choices=...``) in its metadata."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        low = value.strip().lower()
        if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"expected true/false, got {value!r}")
        return low in ("1", "true", "yes", "on")
    return bool(value)


def _structured(value: Any) -> Any:
    """YAML (or JSON) text as data; data as it is."""
    return (yaml.safe_load(value) if value.strip() else None) if isinstance(value, str) else value


class OptionSet:
    """The options of dataclass ``cls``, read from ``{env_prefix}<OPTION>`` and files whose options
    may sit under a top-level ``section`` key."""

    def __init__(self, cls: type, env_prefix: str, section: str) -> None:
        self.cls, self.env_prefix, self.section = cls, env_prefix, section
        self.fields = {f.name: f for f in dataclasses.fields(cls)}

    def convert(self, name: str, value: Any, origin: str) -> Any:
        """``value`` (from YAML, env or a flag) as the type of option ``name``; clear error naming ``origin``."""
        f = self.fields[name]
        typ = str(f.type)
        try:
            if typ.startswith("list[dict"):
                value = _structured(value) or []
                if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                    raise ValueError("expected a list of mappings")
                value = [dict(v) for v in value]
            elif typ.startswith("list"):
                items = value.split(",") if isinstance(value, str) else list(value)
                value = [int(float(v)) for v in items if str(v).strip()]
            elif typ.startswith("dict"):
                value = _structured(value) or {}
                if not isinstance(value, Mapping):
                    raise ValueError("expected a mapping")
                value = {str(k): str(v) for k, v in value.items()}
            elif typ == "bool":
                value = _bool(value)
            elif typ in ("int", "float"):
                value = (int if typ == "int" else float)(value)
            elif typ in ("int | None", "float | None"):
                value = None if value in (None, "") else (int if typ.startswith("int") else float)(value)
            elif typ.startswith("str | None"):
                value = None if value in (None, "") else str(value)
            else:
                value = "" if value is None else str(value)
        except (TypeError, ValueError, OverflowError, yaml.YAMLError) as exc:  # OverflowError: int("inf")
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
            if isinstance(value, Mapping) and name not in self.fields:
                out.update(self.flatten(value, f"{name}_"))
            else:
                out[name] = value
        return out

    def from_file(self, path: str | Path) -> dict[str, Any]:
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ValueError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from exc
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: the config must be a mapping of options")
        doc = doc.get(self.section, doc) if isinstance(doc.get(self.section), Mapping) else doc
        flat = self.flatten(doc)
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
        """One flag per option (``--dcgm-url``), plus ``--config``; defaults are applied later."""
        parser.add_argument("--config", metavar="FILE", default=None,
                            help=f"YAML config file (env {self.env_prefix}CONFIG)")
        defaults = self.cls()
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
            parser.add_argument(flag, **kw)

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
