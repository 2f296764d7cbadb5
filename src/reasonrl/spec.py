"""What a registered function takes besides its fixed arguments, declared next to it: the data the
trainer computes for it and the config knobs that set its hyper-parameters.

Every registry of the house (advantage estimators, objectives and their token selections,
aggregations, verifiers, agent environments) holds functions whose extra arguments differ: GAE
needs a critic's values, ReMax a greedy completion's reward, SAPO two gate temperatures. Each
declares them with `@declare(...)`, so that

- the trainer computes exactly the `inputs` a chosen function asks for and passes its `knobs`
  and `context` from the config (`arguments`), without reading signatures;
- a knob set in a config for a function that is not chosen is refused, naming the function that
  would use it (reasonrl.config.applicability reads the declarations);
- `reasonrl explain` lists the knobs that apply to a config.

Fields:
- `inputs`: names of the data it takes (each family documents its own, e.g. `lengths_BG`,
  `values_NT`, `generator`, `sampling_logp_NT`);
- `knobs`: its hyper-parameters, each with the config key that sets it, e.g.
  `{"clip_low": "algo.clip_low"}`; a knob no chosen function declares is refused when set;
- `context`: values it reads from settings of the whole run, e.g.
  `{"max_tokens": "rollout.max_new_tokens"}`: passed, never refused;
- `level` (advantage estimators): "group" (`rewards_BG -> adv_BG`), "token"
  (`token_rewards_NT, mask_NT -> adv_NT`) or "tree" (a group's rewards and its tree -> each
  node's advantage);
- `min_group_size` (advantage estimators): the fewest samples per problem it can tell apart; 2
  for a baseline taken from the group itself (a group of one has an advantage of 0, or none).

A user's function named by 'package.module:function' declares itself the same way; one without a
declaration takes its fixed arguments only (a group estimator, for the advantage family).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

LEVELS = ("group", "token", "tree")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Spec:
    """A function's declared extra arguments (see the module docstring)."""

    inputs: frozenset[str] = frozenset()
    knobs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    context: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    level: str = "group"
    min_group_size: int = 1

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"declare: level {self.level!r} is not one of {', '.join(LEVELS)}")
        if overlap := set(self.knobs) & set(self.context):
            raise ValueError(f"declare: {sorted(overlap)} declared both as knobs and as context")

    @property
    def keys(self) -> frozenset[str]:
        """The config keys this function's knobs come from."""
        return frozenset(self.knobs.values())


_UNDECLARED = Spec()


def declare(*, inputs: Iterable[str] = (), knobs: Mapping[str, str] | None = None,
            context: Mapping[str, str] | None = None, level: str = "group",
            min_group_size: int = 1) -> Callable[[F], F]:
    """Attach a `Spec` to the decorated function (as its `spec` attribute) and return the function."""
    spec = Spec(inputs=frozenset(inputs), knobs=MappingProxyType(dict(knobs or {})),
                context=MappingProxyType(dict(context or {})), level=level, min_group_size=min_group_size)

    def attach(fn: F) -> F:
        fn.spec = spec  # type: ignore[attr-defined]
        return fn

    return attach


def spec_of(fn: Any) -> Spec:
    """The declared spec of `fn`; a function without one takes its fixed arguments only."""
    spec = getattr(fn, "spec", _UNDECLARED)
    if not isinstance(spec, Spec):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} has a `spec` attribute that is not a reasonrl Spec: "
                        "declare it with @reasonrl.spec.declare(...)")
    return spec


def arguments(fn: Any, value_of: Callable[[str], Any]) -> dict[str, Any]:
    """The keyword arguments `fn` declared as knobs and context, each `value_of(config key)`."""
    spec = spec_of(fn)
    return {name: value_of(key) for name, key in (*spec.knobs.items(), *spec.context.items())}
