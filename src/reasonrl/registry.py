"""Name -> function lookup shared by every registry: a registered name, or "package.module:attr"
for a user's own code, so that new variants never need an edit to this package."""

import importlib
from collections.abc import Mapping
from typing import Any


def is_import_path(name: str) -> bool:
    return ":" in name


def import_object(path: str) -> Any:
    """Import `package.module:attr` (attr may be dotted)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path: expected 'package.module:name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def lookup(registry: Mapping[str, Any], name: str, kind: str) -> Any:
    """The entry `name` of `registry`, or the object an import path names."""
    if is_import_path(name):
        return import_object(name)
    if name not in registry:
        allowed = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; allowed: {allowed}, or 'package.module:function'")
    return registry[name]
