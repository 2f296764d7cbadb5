"""Which model an evaluation's completions come from, so that `reasonrl eval`'s cache never serves
one model's completions as another's.

A local model directory (or a training checkpoint, which stands for its `policy/`) is its resolved
path and the name, size and modification time of each of its files: a checkpoint rewritten by
another run at the same path is another model. A hub id is the id and the commit its files were
loaded from (when the local hub cache knows it). A served model (`--engine openai`) is the server's
URL and the model's name there: its weights cannot be seen from here.

`ModelIdentity.source` is what an output directory records and refuses to mix; `engine` holds how
the model decodes (weights' dtype, fused decoder, device type), which changes the completions
too and so is part of the cache key, but evaluating the same model differently is not refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelIdentity:
    """The model an evaluation samples from: its `name` as given, its `source` (what it is: files,
    hub commit or server), the `engine` settings it decodes with, and for beam search the `prm`'s
    source (the process reward model that chooses which partial solutions continue)."""

    name: str
    source: Mapping[str, Any]
    engine: Mapping[str, Any] = field(default_factory=dict)
    prm: Mapping[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """What the cached completions depend on besides the sampling settings."""
        return _digest([self.source, self.engine])

    def beam_key(self) -> str:
        """What the cached beam searches depend on besides the search settings."""
        return _digest([self.source, self.engine, self.prm])

    def describe(self) -> str:
        """The source in a few words, for messages."""
        if "path" in self.source:
            return f"the model directory {self.source['path']}"
        if "hub_id" in self.source:
            return f"the hub model {self.source['hub_id']} at revision {self.source.get('revision') or 'unknown'}"
        return f"the served model {self.source.get('served_model')!r} at {self.source.get('url')}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def local_source(directory: str | Path) -> dict[str, Any]:
    """A model directory as its resolved path and each file's [size, modification time in ns]."""
    directory = Path(directory).resolve()
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            stat = path.stat()
            files[path.name] = [stat.st_size, stat.st_mtime_ns]
    return {"path": str(directory), "files": files}


def hub_source(hub_id: str) -> dict[str, Any]:
    """A hub model as its id and the commit of the copy in the local hub cache (None when not found)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub_id, "config.json")
    snapshot = Path(cached).parent if isinstance(cached, str) else None  # .../snapshots/<commit>/config.json
    revision = snapshot.name if snapshot is not None and snapshot.parent.name == "snapshots" else None
    return {"hub_id": hub_id, "revision": revision}


def model_source(name: str) -> dict[str, Any]:
    """The source of a model as `load_model` finds it: a local directory (a checkpoint's policy/,
    the converted built-in default) or a hub id."""
    from reasonrl.models import resolve_model_path

    resolved = resolve_model_path(name)
    return local_source(resolved) if Path(resolved).is_dir() else hub_source(resolved)


def served_source(url: str, served_model: str) -> dict[str, Any]:
    return {"url": url.rstrip("/"), "served_model": served_model}
