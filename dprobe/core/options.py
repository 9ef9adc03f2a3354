"""Settings of a long-running service from defaults, a YAML file, environment variables and flags.

A service declares its options as a dataclass whose fields carry a ``help`` (and optional ``choices``
and ``check``) in their metadata (:func:`option`); a field may also hold a group of options, itself
such a dataclass (:func:`group`): ``dcgm: DcgmOptions = group(DcgmOptions, "sources")``. Each option
has one flat name, its group's prefix and its own (``dcgm_url``), from which an :class:`OptionSet`
derives one flag (``--dcgm-url``), one variable (``DPROBE_SIDECAR_DCGM_URL``) and its key in a YAML
file, nested or not (``dcgm: {url: ...}`` or ``dcgm_url: ...``), merged in that order of precedence:
defaults < file < environment < flags. ``--help`` lists the options in sections, one per group title.

The settings class itself is made with :func:`settings`: it also takes and gives every option by its
flat name (``SidecarConfig(dcgm_url=...)``, ``config.dcgm_url``), and its ``validate()`` runs the
options' checks (:func:`check_options`: :data:`positive`, :data:`non_negative`, :func:`at_least`, ...),
which name the option as a user writes it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.reader import ReaderError


def option(default: Any, help: str, *, check: Callable[[str, Any], None] | None = None, name: str | None = None,
           **kw: Any) -> Any:
    """A dataclass field with its ``--help`` text (and ``choices=...``) in its metadata. ``check``: a checker
    (:class:`Check`) of its value, run by the settings' ``validate()``; ``name``: the option's whole flat name
    where it is not its group's prefix and the field's name (kept as users know it: ``pod_name`` in the
    ``nvml_`` group)."""
    meta = {"help": help, **kw}
    if check is not None:
        meta["check"] = check
    if name is not None:
        meta["name"] = name
    if isinstance(default, list | dict):
        return field(default_factory=functools.partial(type(default), default), metadata=meta)
    return field(default=default, metadata=meta)


def group(cls: type, title: str | None = None, prefix: str | None = None, when: str | None = None,
          **defaults: Any) -> Any:
    """A dataclass field holding the option group ``cls`` (a dataclass of :func:`option` fields, or of further
    groups). ``title``: its ``--help`` section (default: the section of the group it is in; "general" at the
    top); ``prefix``: what its options' flat names start with (default: the field's name and ``_``; ``""``: none);
    ``when``: the name of a bool option of the group, without which its options are not checked (the settings
    of a feature that is off); ``defaults``: this service's own defaults of some of its options (``port=9478``)."""
    return field(default_factory=functools.partial(cls, **defaults),
                 metadata={"group": cls, "title": title, "prefix": prefix, "when": when})


@dataclass(frozen=True)
class Check:
    """A check of a number option's value: ``check(name, value)`` raises ``ValueError("NAME RULE, got VALUE")``
    when ``test(value)`` is false (None, an unset option, always passes)."""

    rule: str  # what the error says of the option: "must be positive"
    test: Callable[[Any], bool]
    show: Callable[[str], str] | None = None  # how the error shows a text value (hiding a secret in it)

    def __call__(self, name: str, value: Any) -> None:
        if value is not None and not self.test(value):
            if isinstance(value, float):
                raise ValueError(f"{name} {self.rule}, got {value:g}")
            shown = repr(value) if self.show is None or not isinstance(value, str) else repr(self.show(value))
            raise ValueError(f"{name} {self.rule}, got {shown}")

    def or_unset(self, meaning: str) -> Check:
        """The same check, its error saying what the option does when it is not set."""
        return Check(f"{self.rule} (or unset: {meaning})", self.test, self.show)


positive = Check("must be positive (and finite)", lambda v: 0 < v < math.inf)  # NaN and inf fail too
non_negative = Check("must be >= 0", lambda v: 0 <= v < math.inf)
port_number = Check("must be 0-65535 (0: any free port)", lambda v: 0 <= v <= 65535)


def at_least(least: float) -> Check:
    """A whole number (or number) of ``least`` or more."""
    return Check(f"must be at least {least:g}", lambda v: v >= least)


def period(least: float) -> Check:
    """A loop's period in seconds: finite and ``least`` or more (a shorter one would spin)."""
    return Check(f"must be at least {least:g} s (and finite)", lambda v: least <= v < math.inf)


ratio = Check("must be a ratio above 0 and at most 1 (1 = 100 %)", lambda v: 0 < v <= 1)  # NaN fails too


def zero_means(meaning: str) -> Check:
    """A positive number, or 0 for ``meaning`` (``"the data set's default"``)."""
    return Check(f"must be positive, or 0 for {meaning}", lambda v: 0 <= v < math.inf)


def between(low: float, high: float) -> Check:
    """A number from ``low`` to ``high``, both included."""
    return Check(f"must be between {low:g} and {high:g}", lambda v: low <= v <= high)


def one_of(values: tuple[Any, ...], what: str) -> Check:
    """One of ``values`` (``what`` says where they come from: ``"one the sidecars export"``)."""
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
    return Check(f"must be {what} ({shown})", lambda v: v in values)


USERINFO = re.compile(r"//([^/?#\s]*)@")  # the user info of a URL's authority (up to its last @)


def _hide_userinfo(found: re.Match[str]) -> str:
    user, colon, _ = found.group(1).partition(":")
    return f"//{user}:xxxxx@" if colon else "//xxxxx@"


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message quoting URLs) as it may be shown: the password of each URL's user info
    replaced (``https://user:xxxxx@host``), and user info without a password (a token) wholly (``xxxxx@``)."""
    return USERINFO.sub(_hide_userinfo, text)


def _http_url(value: str) -> bool:
    url = urllib.parse.urlsplit(value)
    return url.scheme in ("http", "https") and bool(url.hostname)


def http_url(example: str) -> Check:
    """An http:// or https:// URL with a host (``example``: what the error shows, ``http://HOST:9090``); the
    error shows the value without its password (:func:`redact_url`)."""
    return Check(f"must be an http(s) URL such as {example}", _http_url, show=redact_url)


def comma_list(text: str) -> list[str]:
    """``a, b,,c`` as ``["a", "b", "c"]``: a text option listing names (empty items are left out)."""
    return [item.strip() for item in text.split(",") if item.strip()]


@dataclass(frozen=True)
class Leaf:
    """One option of a settings class: its flat ``name`` (flag, variable, YAML key), the ``path`` of attributes
    down to its value, its dataclass ``field``, its ``--help`` section and the ``when`` options (paths) that must
    be true for it to be checked."""

    name: str
    path: tuple[str, ...]
    field: dataclasses.Field
    title: str
    when: tuple[tuple[str, ...], ...] = ()


_LEAVES: dict[type, tuple[Leaf, ...]] = {}  # leaves() of each settings class met


def leaves(cls: type) -> tuple[Leaf, ...]:
    """Every option of settings class ``cls``, those of its groups in their place (depth first)."""
    found = _LEAVES.get(cls)
    if found is None:
        found = _LEAVES[cls] = _find_leaves(cls)
    return found


def _find_leaves(cls: type) -> tuple[Leaf, ...]:
    out: list[Leaf] = []

    def walk(c: type, prefix: str, path: tuple[str, ...], title: str, when: tuple[tuple[str, ...], ...]) -> None:
        for f in dataclasses.fields(c):
            meta = f.metadata
            if meta.get("group") is not None:
                sub = f"{f.name}_" if meta["prefix"] is None else meta["prefix"]
                inner = when + ((*path, f.name, meta["when"]),) if meta.get("when") else when
                walk(meta["group"], prefix + sub, (*path, f.name), meta.get("title") or title, inner)
            elif "help" in meta:
                out.append(Leaf(meta.get("name") or prefix + f.name, (*path, f.name), f, title, when))

    walk(cls, "", (), "general", ())
    names = [leaf.name for leaf in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{cls.__name__}: option(s) {', '.join(twice)} declared twice")
    return tuple(out)


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for attr in path:
        obj = getattr(obj, attr)
    return obj


def check_options(obj: Any, prefix: str = "") -> None:
    """Run the ``check`` of every option of settings ``obj`` (or of an option group, its options' names starting
    with ``prefix``; those of a group whose ``when`` option is false are skipped); the first that fails raises
    its ValueError, naming the option by its flat name."""
    for leaf in leaves(type(obj)):
        check = leaf.field.metadata.get("check")
        if check is not None and all(_get(obj, w) for w in leaf.when):
            name = leaf.name if "name" in leaf.field.metadata else prefix + leaf.name
            check(name, _get(obj, leaf.path))


def _nest(cls: type, given: Mapping[str, Any], paths: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """Keyword arguments of dataclass ``cls``'s own ``__init__`` from ``given``: its fields, and options by their
    flat names (:data:`paths`), put in (copies of) their groups."""
    own = {f.name: f for f in dataclasses.fields(cls) if f.init}
    out: dict[str, Any] = {}
    deeper: dict[str, dict[tuple[str, ...], Any]] = {}
    for key, value in given.items():
        if key in own:  # a group given whole is copied, as dataclasses.replace() copies the other options
            out[key] = _copy(value) if own[key].metadata.get("group") is not None else value
        elif key in paths and len(paths[key]) > 1:
            deeper.setdefault(paths[key][0], {})[paths[key][1:]] = value
        else:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}")
    for name, values in deeper.items():
        make = own[name].default_factory
        if make is dataclasses.MISSING:  # group() always gives a factory
            raise TypeError(f"{cls.__name__}.{name} is an option group without a default_factory")
        out[name] = _with(make, out.get(name), values)
    return out


def _with(make: Callable[[], Any], obj: Any, values: Mapping[tuple[str, ...], Any]) -> Any:
    """Group ``obj`` (None: a new one, ``make()``), a copy, with ``values`` set at their paths."""
    obj = make() if obj is None else _copy(obj)
    for path, value in values.items():
        setattr(_get(obj, path[:-1]), path[-1], value)
    return obj


def _copy(obj: Any) -> Any:
    """A copy of group ``obj`` and of the groups in it (their values themselves are shared)."""
    new = copy.copy(obj)
    for f in dataclasses.fields(obj):
        if f.metadata.get("group") is not None:
            object.__setattr__(new, f.name, _copy(getattr(obj, f.name)))
    return new


def settings(cls: type) -> type:
    """Class decorator of a service's settings: a dataclass (of options and option groups) that also takes and
    gives its options by their flat names, as flags, variables and files name them: ``SidecarConfig(port=0,
    dcgm_url=...)``, ``config.dcgm_url``, ``config.dcgm_url = ...`` reach ``config.sources.dcgm.url``. Its
    ``validate()``, unless it has its own, runs :func:`check_options`."""
    made: Any = dataclass(cls)  # Any: the methods set on it below are more than its type can say
    paths = {leaf.name: leaf.path for leaf in leaves(made)}
    init = made.__init__

    def __init__(self: Any, **kw: Any) -> None:  # noqa: N807
        init(self, **_nest(made, kw, paths))

    def __getattr__(self: Any, name: str) -> Any:  # noqa: N807 (only for what is not an attribute)
        path = paths.get(name)
        if path is None or len(path) < 2:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _get(self, path)

    def __setattr__(self: Any, name: str, value: Any) -> None:  # noqa: N807
        path = paths.get(name)
        if path is not None and len(path) > 1:
            setattr(_get(self, path[:-1]), path[-1], value)
        else:
            object.__setattr__(self, name, value)

    def validate(self: Any) -> Any:
        """The options' checks (:func:`check_options`); the settings themselves."""
        check_options(self)
        return self

    __init__.__doc__ = init.__doc__
    made.__init__, made.__getattr__, made.__setattr__ = __init__, __getattr__, __setattr__
    if "validate" not in made.__dict__:  # a service's own validate() runs check_options() and its cross checks
        made.validate = validate
    made.OPTION_PATHS = paths
    return made


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
    """The options of settings class ``cls`` (:func:`settings`, or a plain dataclass of options), read from
    ``{env_prefix}<OPTION>`` and files whose options may sit under a top-level ``section`` key."""

    def __init__(self, cls: type, env_prefix: str, section: str,
                 groups: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """``--help``'s sections are the option groups' titles (an option outside any titled group: "general");
        ``groups``, where given, moves options to other sections: title -> the options, by name or by a prefix
        ending in ``_`` (``sharing_``)."""
        self.cls, self.env_prefix, self.section = cls, env_prefix, section
        self.leaves = {leaf.name: leaf for leaf in leaves(cls)}
        self.fields = {name: leaf.field for name, leaf in self.leaves.items()}
        moved = dict(groups or {})
        for title, names in moved.items():
            for n in names:
                if not n.endswith("_") and n not in self.fields:
                    raise ValueError(f"help group {title!r}: no option {n!r}")
        self.titles: dict[str, str] = {}
        for name, leaf in self.leaves.items():
            self.titles[name] = next((t for t, names in moved.items() if any(
                name == n or (n.endswith("_") and name.startswith(n)) for n in names)), leaf.title)
        self.groups: dict[str, tuple[str, ...]] = {}  # title -> its options, in the order of --help
        for name, title in self.titles.items():
            if title != "general":
                self.groups[title] = (*self.groups.get(title, ()), name)

    def group_of(self, name: str) -> str:
        """The ``--help`` section of option ``name``."""
        return self.titles[name]

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
            default = _get(defaults, self.leaves[name].path)
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
