"""What a run was set to, in the words a reader asks for: the recipe it follows and the settings
beyond it, and which settings differ between runs.

Read from the run's config.toml alone, so it works for every run (started from the command line
or from Python, by this version or an older one): the knobs set away from their defaults are
compared with each recipe's. The recipe the run agrees with on more of its settings than it
departs from (the best such by agreements less departures) names the run; its overrides are the
other changed knobs and the recipe's settings it set otherwise. With no such recipe, the run is
described by its changes from the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reasonrl.config import Config
from reasonrl.config.loading import read_toml
from reasonrl.recipes import recipes

# Differs in every run and says nothing about how it trains.
IGNORED = frozenset({"run.dir"})


@dataclass(frozen=True)
class Settings:
    """`recipe` (None: none matches), its settings, and the run's other changes from the defaults."""

    recipe: str | None
    recipe_settings: Mapping[str, Any]
    overrides: Mapping[str, Any]

    def describe(self) -> str:
        """One line: "recipe gspo + train.lr=2e-06", "defaults + ...", or "defaults"."""
        head = f"recipe {self.recipe}" if self.recipe else "defaults"
        return head + "".join(f" + {key}={format_value(value)}" for key, value in self.overrides.items())


def flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """{"section": {"key": value}} as {"section.key": value}, arrays as lists."""
    return {f"{section}.{key}": list(value) if isinstance(value, (list, tuple)) else value
            for section, values in config.items() if isinstance(values, Mapping) for key, value in values.items()}


def changed_from_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """The dotted keys of `config` (a config.toml's tables) whose values are not the defaults; a key
    this version does not know counts as changed."""
    defaults = flatten(Config().to_dict())
    missing = object()
    return {key: value for key, value in flatten(config).items()
            if key not in IGNORED and defaults.get(key, missing) != value}


def settings_of(config: Mapping[str, Any]) -> Settings:
    """The recipe `config` follows and its settings beyond it (see the module docstring)."""
    changed = changed_from_defaults(config)
    flat = {**flatten(Config().to_dict()), **flatten(config)}
    best: tuple[int, int, str, dict[str, Any]] | None = None
    for recipe in recipes():
        wanted = changed_from_defaults(read_toml(recipe.path))
        kept = sum(flat.get(key) == value for key, value in wanted.items())
        score = (kept - (len(wanted) - kept), kept)
        if kept > len(wanted) - kept and (best is None or score > best[:2]):
            best = (*score, recipe.name, wanted)
    if best is None:
        return Settings(None, {}, changed)
    *_, name, wanted = best
    # Beyond the recipe: the other changes, and the recipe's settings the run set otherwise.
    beyond = {key for key in changed if key not in wanted} | {key for key in wanted if flat.get(key) != wanted[key]}
    overrides = {key: flat.get(key) for key in sorted(beyond)}
    return Settings(name, wanted, overrides)


def differing(configs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The dotted keys whose values differ between `configs`, with each config's value (the default
    where a config leaves the key out), in key order."""
    defaults = flatten(Config().to_dict())
    flat = [flatten(config) for config in configs]
    keys = sorted({key for one in flat for key in one} - IGNORED)
    values = {key: [one.get(key, defaults.get(key)) for one in flat] for key in keys}
    return {key: row for key, row in values.items() if any(value != row[0] for value in row[1:])}


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(map(format_value, value)) + "]"
    return str(value)
