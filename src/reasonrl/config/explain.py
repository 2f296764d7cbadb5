"""`reasonrl explain`: the knobs a config uses, each with its value and where that value comes from
(the default, the config file or recipe, or a command-line override); the knobs that do not apply
to it (reasonrl.config.applicability) are counted, or listed with why."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import tomli_w

from reasonrl.config.applicability import inapplicable
from reasonrl.config.loading import load_config, read_toml
from reasonrl.config.sections import Config


def explain(path: Path | None, overrides: Sequence[str] = (), *, file_label: str = "file",
            everything: bool = False) -> str:
    """The config of `path` (labelled `file_label` as a source, e.g. "recipe") and `overrides`, section
    by section: each knob that applies, with its value and source; with `everything`, also those
    that do not, with why."""
    cfg = load_config(path, overrides)
    from_file = read_toml(path) if path is not None else {}
    overridden = {override.partition("=")[0].strip() for override in overrides}
    skipped = inapplicable(cfg)
    lines = []
    for section in dataclasses.fields(Config):
        rows = []
        for knob in dataclasses.fields(section.default_factory):  # type: ignore[arg-type]
            key = f"{section.name}.{knob.name}"
            if key in skipped and not everything:
                continue
            source = ("override" if key in overridden else file_label if knob.name in from_file.get(section.name, {})
                      else "default")
            row = f"  {knob.name} = {_toml(cfg.value(key))}  ({source})"
            rows.append(row + (f"  not used: {skipped[key]}" if key in skipped else ""))
        if rows:
            lines += [f"[{section.name}]", *rows]
    if not everything:
        lines.append(f"\n{len(skipped)} knobs do not apply to this config and are not listed (--all lists them, "
                     "with why); setting one away from its default is refused")
    return "\n".join(lines)


def _toml(value: object) -> str:
    """`value` as it would be written in a config file."""
    return tomli_w.dumps({"v": list(value) if isinstance(value, tuple) else value}).strip().removeprefix("v = ")
