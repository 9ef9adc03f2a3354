"""Settings of a long-running service from defaults, a YAML file, environment variables and flags.

A service declares its options as a dataclass whose fields carry a ``help`` (and optional ``choices``,
``check`` and former names) in their metadata (:func:`option`); a field may also hold a group of options,
itself such a dataclass (:func:`group`): ``dcgm: DcgmOptions = group(DcgmOptions, "sources")``. Each option
has one flat name, its group's prefix and its own (``dcgm_url``), from which an :class:`OptionSet` derives one
flag (``--dcgm-url``), one variable (``DPROBE_SIDECAR_DCGM_URL``) and its key in a YAML file, nested or not
(``dcgm: {url: ...}`` or ``dcgm_url: ...``), merged in that order of precedence: defaults < file <
environment < flags. Reading those sources and checking each value's type is pydantic-settings' and pydantic's
work (:mod:`dprobe.core.option_sources`, imported only when settings are loaded, so that ``--help`` stays
quick). ``--help`` lists the config file and a service's main flags; ``--help-all`` every option, in sections,
one per group title.

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
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dprobe.core.option_text import USERINFO as USERINFO  # re-exported: the sources import it from here
from dprobe.core.option_text import deprecated
from dprobe.core.option_text import redact_url as redact_url  # re-exported


def option(default: Any, help: str, *, check: Callable[[str, Any], None] | None = None, name: str | None = None,
           aliases: Sequence[str] = (), secret: bool = False, **kw: Any) -> Any:
    """A dataclass field with its ``--help`` text (and ``choices=...``) in its metadata. ``check``: a checker
    (:class:`Check`) of its value, run by the settings' ``validate()``; ``name``: the option's whole flat name
    where it is not its group's prefix and the field's name (kept as users know it: ``pod_name`` in the
    ``nvml_`` group); ``aliases``: its former names (with the group's prefix, as the field's name), still taken
    from the file, the environment, flags and keyword arguments, each use logging one deprecation warning that
    names the option's name; ``secret``: errors never show its value (a token, a header holding one)."""
    meta = {"help": help, **kw}
    if check is not None:
        meta["check"] = check
    if name is not None:
        meta["name"] = name
    if aliases:
        meta["aliases"] = tuple(aliases)
    if secret:
        meta["secret"] = True
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
    down to its value, its dataclass ``field``, its ``--help`` section, the ``when`` options (paths) that must
    be true for it to be checked and its former flat names (``aliases``)."""

    name: str
    path: tuple[str, ...]
    field: dataclasses.Field
    title: str
    when: tuple[tuple[str, ...], ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def type(self) -> str:
        """The option's type as declared, without spaces: ``int``, ``list[int]``, ``str|None``, ..."""
        return str(self.field.type).replace(" ", "")


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
                former = tuple(a if "name" in meta else prefix + a for a in meta.get("aliases", ()))
                out.append(Leaf(meta.get("name") or prefix + f.name, (*path, f.name), f, title, when, former))

    walk(cls, "", (), "general", ())
    names = [n for leaf in out for n in (leaf.name, *leaf.aliases)]
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
    paths = {name: leaf.path for leaf in leaves(made) for name in (leaf.name, *leaf.aliases)}
    former = {alias: leaf.name for leaf in leaves(made) for alias in leaf.aliases}
    init = made.__init__

    def __init__(self: Any, **kw: Any) -> None:  # noqa: N807
        for key in kw.keys() & former.keys():
            deprecated(f"{made.__name__}({key}=...)", key, former[key])
            if former[key] in kw:
                raise TypeError(f"{made.__name__}() got {former[key]} twice (also as its former name {key})")
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


class OptionSet:
    """The options of settings class ``cls`` (:func:`settings`, or a plain dataclass of options), read from
    ``{env_prefix}<OPTION>`` and files whose options may sit under a top-level ``section`` key; ``flags``: the
    main options, the only ones ``--help`` shows beside ``--config`` (``--help-all`` shows every option, and
    every option's flag is taken)."""

    def __init__(self, cls: type, env_prefix: str, section: str,
                 groups: Mapping[str, tuple[str, ...]] | None = None, flags: Sequence[str] = ()) -> None:
        """``--help-all``'s sections are the option groups' titles (an option outside any titled group:
        "general"); ``groups``, where given, moves options to other sections: title -> the options, by name or
        by a prefix ending in ``_`` (``sharing_``)."""
        self.cls, self.env_prefix, self.section = cls, env_prefix, section
        self.leaves = {leaf.name: leaf for leaf in leaves(cls)}
        self.fields = {name: leaf.field for name, leaf in self.leaves.items()}
        self.aliases = {alias: leaf.name for leaf in self.leaves.values() for alias in leaf.aliases}
        moved = dict(groups or {})
        for title, names in moved.items():
            for n in names:
                if not n.endswith("_") and n not in self.fields:
                    raise ValueError(f"help group {title!r}: no option {n!r}")
        unknown = [n for n in flags if n not in self.fields]
        if unknown:
            raise ValueError(f"main flags: no option(s) {', '.join(unknown)}")
        self.flags = tuple(flags)
        self.titles: dict[str, str] = {}
        for name, leaf in self.leaves.items():
            self.titles[name] = next((t for t, names in moved.items() if any(
                name == n or (n.endswith("_") and name.startswith(n)) for n in names)), leaf.title)
        self.groups: dict[str, tuple[str, ...]] = {}  # title -> its options, in the order of --help-all
        for name, title in self.titles.items():
            if title != "general":
                self.groups[title] = (*self.groups.get(title, ()), name)
        self.settings_model: Any = None  # the pydantic-settings model of the options, made when first loaded

    def group_of(self, name: str) -> str:
        """The ``--help-all`` section of option ``name``."""
        return self.titles[name]

    def flatten(self, doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """Nested YAML sections to flat option names (``dcgm: {url: X}`` -> ``dcgm_url``); former names kept."""
        out: dict[str, Any] = {}
        for key, value in doc.items():
            name = f"{prefix}{str(key).replace('-', '_')}"
            known = name in self.fields or name in self.aliases
            inner = self.flatten(value, f"{name}_") if isinstance(value, Mapping) and not known else {name: value}
            for key in inner:
                if key in out:  # dcgm: {url: ...} beside dcgm_url: one would silently win
                    raise ValueError(f"option {key} is given twice (nested and flat)")
            out.update(inner)
        return out

    def _help(self, name: str, defaults: Any) -> str:
        f = self.fields[name]
        default = _get(defaults, self.leaves[name].path)
        if isinstance(default, dict) or isinstance(default, list) and any(isinstance(v, dict) for v in default):
            shown = json.dumps(default)  # as it would be written in the variable
        else:
            shown = "unset" if default is None else repr(
                ",".join(map(str, default)) if isinstance(default, list) else default)
        return f"{f.metadata['help']} (env {self.env_prefix}{name.upper()}; default: {shown})".replace("%", "%%")

    def add_arguments(self, parser: argparse.ArgumentParser, brief: bool = False) -> None:
        """One flag per option (``--dcgm-url``; a former name's too, never shown), plus ``--config``; defaults are
        applied later. Every option in a ``--help`` section by :meth:`group_of`; ``brief``: only :attr:`flags`
        shown, the others still taken, and ``--help-all`` prints the page with every option."""
        parser.add_argument("--config", metavar="FILE", default=None,
                            help=f"YAML config file: every option, by name (env {self.env_prefix}CONFIG)")
        if brief:
            parser.add_argument("--help-all", action=_HelpAll, options=self,
                                help="show every option, in sections, with its variable and default, and exit")
        defaults = self.cls()
        sections: dict[str, Any] = {title: parser if brief else parser.add_argument_group(f"{title} options")
                                    for title in ("general", *self.groups)}
        shown = self.flags if brief else tuple(self.fields)
        for name in (*shown, *(n for n in self.fields if n not in shown), *self.aliases):
            target = self.aliases.get(name, name)
            f = self.fields[target]
            help_text = self._help(name, defaults) if name in shown else argparse.SUPPRESS
            kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
            if str(f.type) == "bool":
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["metavar"] = target.split("_")[-1].upper()
                if f.metadata.get("choices"):
                    kw["choices"] = f.metadata["choices"]
            sections[self.group_of(target)].add_argument("--" + name.replace("_", "-"), **kw)

    def load(self, args: argparse.Namespace | Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None) -> Any:
        """Merge defaults < YAML file < environment < flags into a validated instance of the dataclass; a
        ValueError of one line naming the option, as the user wrote it, and where its value came from."""
        from dprobe.core.option_sources import read  # pydantic: only where settings are loaded

        env = os.environ if env is None else env
        given = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
        config_file = given.pop("config", None) or env.get(self.env_prefix + "CONFIG")
        flags = {k: v for k, v in given.items() if k in self.fields or k in self.aliases}
        return self.cls(**read(self, config_file, env, flags)).validate()


class _HelpAll(argparse.Action):
    """``--help-all``: the service's page with every option, in sections, then exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, options: OptionSet, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.options = options

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        full = argparse.ArgumentParser(prog=parser.prog, usage="%(prog)s [--config FILE] [--OPTION VALUE ...]",
                                       description=parser.description, formatter_class=parser.formatter_class,
                                       add_help=False)
        self.options.add_arguments(full)
        full.print_help()
        parser.exit()


def add_service_parser(subparsers: argparse._SubParsersAction, name: str, help: str, description: str,
                       options: OptionSet, run: Callable[[Any], int]) -> argparse.ArgumentParser:
    """The subcommand of a long-running service: ``--config``, its main flags in ``--help``, every option's
    flag taken (``--help-all``); its ``func`` loads the config (defaults < file < environment < flags), sets the
    log level, and calls ``run(config)``."""
    epilog = (f"Every other option goes in the YAML file (--config) or a {options.env_prefix}<OPTION> variable\n"
              "(its flag --OPTION is taken too); --help-all lists every option, in sections, with its default.")
    parser = subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_arguments(parser, brief=True)

    def func(args: argparse.Namespace) -> int:
        config = options.load({k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")})
        level = getattr(logging, config.log_level.upper(), logging.INFO)
        if getattr(args, "verbose", 0):
            level = min(level, logging.WARNING - 10 * min(args.verbose, 2))
        logging.getLogger("dprobe").setLevel(level)
        return run(config)

    parser.set_defaults(func=func)
    return parser
