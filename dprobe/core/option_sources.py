"""The options of an :class:`~dprobe.core.options.OptionSet` read from their sources with pydantic-settings and
their types checked by pydantic: one flat settings model per options set (a field per option, and per former
name), a YAML file source (:class:`YamlFile`: a top-level section of the service's, nested or flat keys,
unknown keys refused), the environment (``DPROBE_<SERVICE>_<OPTION>``) and flags (init keyword arguments),
merged defaults < file < environment < flags. Errors are one line naming the option as it was written, where
its value came from, and what was expected (``DPROBE_SIDECAR_PORT: option port: expected a whole number, got
'http'``), never a secret (:func:`~dprobe.core.options.redact_url`; an option declared ``secret``).

Values given as text (a variable, a flag) are parsed as the file's would be: a list of whole numbers from
``60,300`` or ``[60, 300]``, a mapping from YAML or JSON (``{X-Scope-OrgID: team-a}``); pydantic-settings'
own JSON decoding of variables is off, so that a flag and a variable read alike. Imported only when settings
are loaded: pydantic takes a tenth of a second to import, ``--help`` none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import AfterValidator, BeforeValidator, ValidationError, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, SettingsConfigDict
from pydantic_settings.sources import PydanticBaseSettingsSource, YamlConfigSettingsSource
from pydantic_settings.sources.utils import parse_env_vars
from yaml.reader import ReaderError

from dprobe.core.option_text import SERVICE_SECTIONS, deprecated, redact_url

if TYPE_CHECKING:
    from dprobe.core.options import OptionSet

SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML was built with it


class FlatSettings(BaseSettings):
    """The base of each options set's model: every option a field by its flat name, only what is given
    validated (defaults are the dataclass's), nothing else taken."""

    model_config = SettingsConfigDict(extra="forbid", case_sensitive=False, enable_decoding=False,
                                      validate_default=False, env_ignore_empty=False)


# what is expected, by pydantic's error type; the value given follows ("got ...")
EXPECTED = {
    "int_parsing": "expected a whole number", "int_from_float": "expected a whole number",
    "int_type": "expected a whole number", "float_parsing": "expected a number", "float_type": "expected a number",
    "bool_parsing": "expected true/false (or yes/no, on/off, 1/0)",
    "bool_type": "expected true/false (or yes/no, on/off, 1/0)", "string_type": "expected text",
    "dict_type": "expected a mapping", "list_type": "expected a list",
}


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value!r} ({type(value).__name__})"


def _no_bool(expected: str) -> BeforeValidator:
    """``true`` is no number (pydantic would take it as 1)."""
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{expected}, got {_show(value)}")
        return value
    return BeforeValidator(check)


def _none_as_empty(value: Any) -> Any:
    """A text option set to nothing (``graph_file:``) is the empty text."""
    return "" if value is None else value


def _blank_as_none(value: Any) -> Any:
    """An option that may be unset is unset by nothing, or empty text (``DPROBE_SCALER_FALLBACK_REPLICAS=``)."""
    return None if isinstance(value, str) and not value.strip() else value


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


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _structured(value: Any) -> Any:
    """YAML (or JSON) text as data (empty text: nothing); data as it is."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as exc:
        raise ValueError(yaml_error(exc, value)) from None


def _mapping(value: Any) -> Any:
    value = _structured(value)
    return {} if value is None else value


def _mappings(value: Any) -> Any:
    value = _structured(value)
    return [] if value is None else value


def _number_as_text(value: Any) -> Any:
    """A mapping's value: text, or a number or boolean written as text (``{X-Scope-OrgID: 42}``)."""
    return str(value) if isinstance(value, int | float) else value


def _int_items(value: Any) -> Any:
    """``60,300`` (or ``[60, 300]``) as a list; an empty item is refused, empty text is the empty list."""
    if isinstance(value, str):
        text = value.strip()
        value = _structured(text) if text.startswith("[") else [v.strip() for v in text.split(",")] if text else []
    if isinstance(value, list | tuple) and any(item == "" for item in value):
        raise ValueError(f"empty item in {value!r}")
    return value


def _choice(choices: tuple[Any, ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    return check


INT = Annotated[int, _no_bool(EXPECTED["int_type"])]
FLOAT = Annotated[float, _no_bool(EXPECTED["float_type"])]
TEXT = Annotated[str, BeforeValidator(_none_as_empty)]
TYPES: dict[str, Any] = {  # an option's declared type (without spaces) -> what pydantic checks it as
    "bool": bool, "int": INT, "float": FLOAT, "str": TEXT,
    "list[int]": Annotated[list[INT], BeforeValidator(_int_items)],
    "dict[str,str]": Annotated[dict[str, Annotated[str, BeforeValidator(_number_as_text)]], BeforeValidator(_mapping)],
    "list[dict[str,Any]]": Annotated[list[dict[str, Any]], BeforeValidator(_mappings)],
}


def _annotation(declared: str, choices: tuple[Any, ...] | None) -> Any:
    optional = declared.endswith("|None")
    base = declared.removesuffix("|None")
    if base not in TYPES:
        raise TypeError(f"options of type {declared} are not supported")
    typ = TYPES[base]
    if choices:
        typ = Annotated[typ, AfterValidator(_choice(tuple(choices)))]
    return Annotated[typ | None, BeforeValidator(_blank_as_none)] if optional else typ


def model_of(options: OptionSet) -> type[BaseSettings]:
    """The flat pydantic-settings model of ``options`` (made once): a field per option and per former name."""
    if options.settings_model is None:
        fields: dict[str, Any] = {}
        for name, leaf in options.leaves.items():
            typ = _annotation(leaf.type, leaf.field.metadata.get("choices"))
            for n in (name, *leaf.aliases):
                fields[n] = (typ, None)
        options.settings_model = create_model(f"{options.cls.__name__}Settings", __base__=FlatSettings, **fields)
    return options.settings_model


class YamlFile(YamlConfigSettingsSource):
    """The options of a YAML file: under a top-level key named after the service (beside it only other services'
    sections) or at the top; nested sections flattened (``dcgm: {url: ...}`` is ``dcgm_url``); an unknown key,
    a key given both nested and flat, text that is not UTF-8 or YAML: a one-line ValueError naming the file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, options: OptionSet) -> None:
        self.options = options
        super().__init__(settings_cls, yaml_file=path, yaml_file_encoding="utf-8")

    def _read_files(self, files: Any, deep_merge: bool = False) -> dict[str, Any]:
        return self._read_file(Path(files))  # the one file given, which must exist

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        path = Path(file_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{path}: cannot read config ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from exc
        try:
            # libyaml's loader where PyYAML has it: a scaler's file of 20,000 workloads parses in a fraction of
            # the time and about 35 MB less memory than with the pure-Python one
            doc = yaml.load(text, Loader=SAFE_LOADER) or {}
        except yaml.YAMLError:
            try:  # the error as the pure-Python loader words it (the one the docs quote)
                yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"{path}: {yaml_error(exc, text)}") from exc
            raise
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: the config must be a mapping of options")
        section = self.options.section
        if isinstance(doc.get(section), Mapping):  # under `sidecar:`; beside it only other services' sections
            others = sorted(str(k) for k in doc if k != section and k not in SERVICE_SECTIONS)
            if others:
                raise ValueError(f"{path}: unknown key(s) {', '.join(others)} beside the {section}: section")
            doc = doc[section]
        try:
            flat = self.options.flatten(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        unknown = sorted(set(flat) - set(self.options.fields) - set(self.options.aliases))
        if unknown:
            raise ValueError(f"{path}: unknown option(s) {', '.join(unknown)}")
        return flat


class Environment(EnvSettingsSource):
    """The ``{prefix}<OPTION>`` variables of ``environ`` (the process's, or a mapping given to
    :meth:`~dprobe.core.options.OptionSet.load`), names in any case."""

    def __init__(self, settings_cls: type[BaseSettings], prefix: str, environ: Mapping[str, str]) -> None:
        self.environ = environ
        super().__init__(settings_cls, env_prefix=prefix, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self.environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def read(options: OptionSet, config_file: str | Path | None, environ: Mapping[str, str],
         flags: Mapping[str, Any]) -> dict[str, Any]:
    """The options given, by flat name, each validated as its type: the file's, overridden by the environment's,
    overridden by the flags' (a former name read as the option's name, with a deprecation warning)."""
    model = model_of(options)
    prefix = options.env_prefix
    layers: list[tuple[Callable[[str], str], PydanticBaseSettingsSource]] = []
    if config_file:
        layers.append((lambda _: str(config_file), YamlFile(model, Path(config_file), options)))
    layers.append((lambda n: prefix + n.upper(), Environment(model, prefix, environ)))
    layers.append((lambda n: "--" + n.replace("_", "-"), InitSettingsSource(model, dict(flags))))
    values: dict[str, Any] = {}
    origin: dict[str, tuple[str, str]] = {}  # option -> (where its value came from, the name it was given by)
    for where, source in layers:
        given = source()
        for key, value in given.items():
            name = options.aliases.get(key, key)
            if name != key:
                if name in given:
                    raise ValueError(f"{where(key)}: option {name} is given twice (also as its former name {key})")
                deprecated(where(key), key, name)
            values[name], origin[name] = value, (where(key), key)
    try:
        checked = model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(_message(exc, options, origin)) from None
    return {name: getattr(checked, name) for name in values}


def _message(exc: ValidationError, options: OptionSet, origin: Mapping[str, tuple[str, str]]) -> str:
    """pydantic's first error as one line: ``WHERE: option NAME: [item ... of the list: ]WHAT, got VALUE``."""
    error = exc.errors(include_url=False)[0]
    name, *inner = error["loc"]
    where, written = origin.get(str(name), ("", str(name)))
    leaf = options.leaves[options.aliases.get(str(name), str(name))]
    value = error.get("input")
    secret = leaf.field.metadata.get("secret", False)
    at = ""
    if inner and isinstance(inner[0], int):
        at = f"item {'?' if secret else _show(value).split(' (')[0]} of the list: "
    elif inner:
        at = f"the value of {inner[0]!r}: "
    if error["type"] in EXPECTED:
        shown = f"a {type(value).__name__}" if secret else _show(value)
        what = f"{EXPECTED[error['type']]}, got {shown}"
        if error["type"] == "string_type" and not isinstance(value, list | dict):
            what += " (quote it in YAML)"
    else:
        what = str(error["msg"]).removeprefix("Value error, ")
    said = f"option {written} {what}" if what.startswith("must be") and not at else f"option {written}: {at}{what}"
    text = f"{where}: {said}" if where else said
    return redact_url(_one_line(text))
