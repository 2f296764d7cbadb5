"""Name -> function lookup shared by every registry: a registered name, "package.module:attr" for a
user's own code, or "path/to/file.py:attr" for code that is not on the import path (verl's
custom_reward_function.path), so that new variants never need an edit to this package."""

import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any


def is_import_path(name: str) -> bool:
    return ":" in name


def is_file_path(module: str) -> bool:
    """Whether the module part of an import path names a file rather than a dotted module."""
    return module.endswith(".py") or "/" in module or "\\" in module


def import_object(path: str) -> Any:
    """Import `package.module:attr` or `path/to/file.py:attr` (attr may be dotted); a relative file
    path is taken from the working directory. Any failure, the module's own errors included, is a
    ValueError naming `path`."""
    module_name, _, attr = path.rpartition(":") if is_file_path(path.partition(":")[0]) else path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path: expected 'package.module:name' or 'path/to/file.py:name'")
    obj: Any = _load_file(module_name, path) if is_file_path(module_name) else _load_module(module_name, path)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def _load_module(module_name: str, path: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {exc} (is its folder on PYTHONPATH? "
                         "or give the file: 'path/to/file.py:name')") from exc
    except Exception as exc:  # the module's own code failed while importing
        raise ValueError(f"importing module {module_name!r} of {path!r} raised {type(exc).__name__}: {exc}") from exc


def _load_file(file_name: str, path: str) -> ModuleType:
    file = Path(file_name).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"{path!r}: no file {file} (a relative path is taken from the working directory, "
                         f"{Path.cwd()})")
    # One module per file, registered so that its functions pickle by reference within this process.
    name = f"reasonrl_user_{file.stem}_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path!r}: {file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the file's own code failed: a syntax error, a missing import, ...
        del sys.modules[name]
        raise ValueError(f"importing {file} (from {path!r}) raised {type(exc).__name__}: {exc}") from exc
    return module


def lookup(registry: Mapping[str, Any], name: str, kind: str) -> Any:
    """The entry `name` of `registry`, or the object an import path names."""
    if is_import_path(name):
        return import_object(name)
    if name not in registry:
        allowed = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; allowed: {allowed}, 'package.module:function' or "
                         "'path/to/file.py:function'")
    return registry[name]


def json_arguments(text: str, key: str) -> dict[str, Any]:
    """Keyword arguments for a named factory, given in the config as a JSON object (`key` names the
    setting in errors); '' for none."""
    if not text:
        return {}
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{key} is not JSON: {exc} (got {text!r})") from None
    if not isinstance(arguments, dict):
        raise TypeError(f"{key} must be a JSON object (of keyword arguments), got {text!r}")
    return arguments
