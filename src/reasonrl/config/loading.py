"""A Config from defaults, a TOML file and `section.key=value` overrides: each value coerced to its
field's type and checked against its knob, then the sections checked against each other."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reasonrl.config.consistency import check_consistency
from reasonrl.config.knobs import ConfigError
from reasonrl.config.sections import Config
from reasonrl.registry import is_import_path


def _section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """`value` as the type `annotation` asks for, or a ConfigError naming `key`."""
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if value in ("True", "False"):  # Python's spelling on a command line, where TOML's is true/false
            return value == "True"
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(annotation) is tuple:
        if isinstance(value, str):
            value = [value] if value else []
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    else:
        raise TypeError(f"config field {key} has an unsupported type {annotation}")
    name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(f"{key}: expected {name}, got {value!r}")


def _check(key: str, value: Any, spec: dataclasses.Field) -> None:
    meta = spec.metadata
    choices = meta["choices"]
    if choices is not None and value not in choices and not (meta["extensible"] and is_import_path(value)):
        extra = ", or 'package.module:function'" if meta["extensible"] else ""
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed: {', '.join(choices)}{extra}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    if meta["low"] is not None and value < meta["low"]:
        raise ConfigError(f"{key}: {value!r} is below its minimum {meta['low']}")
    if meta["high"] is not None and value > meta["high"]:
        raise ConfigError(f"{key}: {value!r} is above its maximum {meta['high']}")


def _parse_cli_value(text: str) -> Any:
    """A command-line value as TOML (numbers, booleans, arrays); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # RecursionError: arrays nested too deep for tomllib
        return text


def build_config(values: Mapping[str, Mapping[str, Any]]) -> Config:
    """A validated Config from nested {section: {key: value}}; missing keys keep defaults."""
    section_types = _section_types()
    sections = {}
    for section_name, section_values in values.items():
        if section_name not in section_types:
            raise ConfigError(f"unknown config section {section_name!r}; sections: {', '.join(section_types)}")
        if not isinstance(section_values, Mapping):
            raise ConfigError(f"{section_name}: expected a table of keys, got {section_values!r}")
    for section_name, section_cls in section_types.items():
        specs = {f.name: f for f in dataclasses.fields(section_cls)}
        hints = typing.get_type_hints(section_cls)
        kwargs = {}
        for key, value in values.get(section_name, {}).items():
            dotted = f"{section_name}.{key}"
            if key not in specs:
                raise ConfigError(f"unknown config key {dotted!r}; keys of [{section_name}]: {', '.join(specs)}")
            aliases = specs[key].metadata["aliases"]
            if isinstance(value, bool) and value in aliases:  # hashable, and True is not taken for 1
                value = aliases[value]
            kwargs[key] = _coerce(dotted, value, hints[key])
            _check(dotted, kwargs[key], specs[key])
        sections[section_name] = section_cls(**kwargs)
    return check_consistency(Config(**sections))


def read_toml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """The TOML file at `path` (a `what` file) as nested dicts; a ConfigError naming the file when it
    is missing, unreadable, not UTF-8 or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (line {line}); a {what} file is TOML, which is UTF-8: "
                          "save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{path}: arrays or inline tables nested too deep to read; a {what} file holds "
                          "tables of plain keys: flatten the nesting") from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the TOML file at `path`, then `section.key=value` overrides."""
    values: dict[str, dict[str, Any]] = read_toml(path) if path is not None else {}
    for override in overrides:
        dotted, sep, text = override.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(f"bad override {override!r}: expected section.key=value, e.g. train.lr=1e-5")
        if not isinstance(values.setdefault(section, {}), dict):
            raise ConfigError(f"{section}: expected a table of keys in the config file, got {values[section]!r}")
        values[section][key] = _parse_cli_value(text.strip())
    return build_config(values)


def describe_knobs() -> str:
    """Every knob with its type, default and doc, grouped by section, for --help."""
    lines = []
    for section_name, section_cls in _section_types().items():
        lines.append(f"[{section_name}]")
        hints = typing.get_type_hints(section_cls)
        defaults = section_cls()
        for spec in dataclasses.fields(section_cls):
            default = getattr(defaults, spec.name)
            type_name = getattr(hints[spec.name], "__name__", "list")
            choices = spec.metadata["choices"]
            allowed = f" {{{'|'.join(choices)}}}" if choices else ""
            lines.append(f"  {section_name}.{spec.name} ({type_name}, default {default!r}){allowed}\n"
                         f"      {spec.metadata['doc']}")
    return "\n".join(lines)

