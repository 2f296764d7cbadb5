"""What every section of the config's schema is made of: `knob`, a field with its default, its
one-line doc and the values it accepts; ConfigError, what a key or value that cannot be used
raises; and the names the sections share (the default model, the alarms' checks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The checks of reasonrl.guards.alarms, by the name each logs (alarm/<name>) and run.stop_on takes.
ALARMS = ("entropy_collapse", "reward_hacking", "length_explosion", "truncation_surge", "clip_outliers", "kl_blowup",
          "no_gradient", "grad_norm")


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and the fix."""


def knob(default: Any, doc: str, *, choices: Sequence[str] | Mapping[str, Any] | None = None,
         low: float | None = None, high: float | None = None, extensible: bool = False,
         aliases: Mapping[Any, Any] | None = None) -> Any:
    """A config field with its one-line doc and the values it accepts.

    `choices` lists the allowed strings (a registry's keys); `extensible` also accepts a
    'package.module:function' import path; `low`/`high` bound numbers (inclusive); `aliases`
    maps values a field used to take (a boolean before it had modes) to today's.
    """
    metadata = {"doc": doc, "choices": tuple(choices) if choices is not None else None,
                "low": low, "high": high, "extensible": extensible, "aliases": dict(aliases or {})}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)
