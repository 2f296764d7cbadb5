"""The recipes: one TOML file per method of the literature, setting only what differs from the
defaults and citing its paper in a leading comment. They ship inside the package, beside this file
(`reasonrl/recipes/*.toml`), so they are found wherever reasonrl is installed; `reasonrl train NAME`
accepts a recipe's name where a config file is expected."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PACKAGED_RECIPES = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    summary: str  # the first line of its leading comment


def recipe_dirs() -> list[Path]:
    """Where recipes are looked for, first match wins: $REASONRL_RECIPES (a directory of your own
    recipes), then the package's."""
    candidates = [Path(os.environ["REASONRL_RECIPES"])] if os.environ.get("REASONRL_RECIPES") else []
    candidates.append(PACKAGED_RECIPES)
    return [path for path in candidates if path.is_dir()]


def recipes() -> list[Recipe]:
    found: dict[str, Recipe] = {}
    for directory in recipe_dirs():
        for path in sorted(directory.glob("*.toml")):
            found.setdefault(path.stem, Recipe(path.stem, path, _summary(path)))
    return sorted(found.values(), key=lambda recipe: recipe.name)


def config_path(name_or_path: str) -> Path:
    """A config file: `name_or_path` itself when it exists, else the recipe of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for recipe in recipes():
        if recipe.name == name_or_path:
            return recipe.path
    known = ", ".join(recipe.name for recipe in recipes()) or "none found"
    raise FileNotFoundError(f"{name_or_path!r} is neither a config file nor a recipe name (recipes: {known})")


def _summary(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""
