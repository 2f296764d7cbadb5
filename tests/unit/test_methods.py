"""The methods registry: walked in order, each method seeing what those before it added; the order
the package ships; what a method may not do; and the example of docs/architecture.md, which is the
toy method tests/integration/test_methods_run.py trains with."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import reasonrl.methods
from reasonrl import load_config
from reasonrl.build import build_methods
from reasonrl.methods import METHODS, Added, RunParts, critic, distill, guidance, kl, prime, replay, tree

ROOT = Path(__file__).resolve().parents[2]


def bare_parts(**fields) -> RunParts:
    """RunParts whose objects are stand-ins: only what the methods under test read is real."""
    core = {"task": None, "tokenizer": None, "policy": None, "engine": "engine", "ref_model": None,
            "reward_fn": None, "learner": None, "device": None, "run_dir": Path("."), "update_sizes": {},
            "reference": lambda: None, "estimate": "estimation", "producer_engine": "engine"}
    return RunParts(**{**core, **fields})


def recording(name: str, seen: list[tuple[str, object, tuple]], **added) -> SimpleNamespace:
    """A method that records what it was given and wraps the estimation and the production engine."""

    def build(cfg, parts: RunParts) -> Added:
        seen.append((name, parts.estimate, tuple(parts.participants)))
        return Added(estimate=f"{name}({parts.estimate})", participants=(f"{name}.part",),
                     producer_engine=f"{name}({parts.producer_engine})", **added)

    return SimpleNamespace(build=build)


def test_the_registry_is_walked_in_order_each_method_seeing_what_the_ones_before_added(monkeypatch):
    seen: list[tuple[str, object, tuple]] = []
    monkeypatch.setattr(reasonrl.methods, "METHODS", (recording("a", seen), recording("b", seen, kl="b's kl"),
                                                      recording("c", seen)))
    parts = build_methods(load_config(), bare_parts())
    assert seen == [("a", "estimation", ()), ("b", "a(estimation)", ("a.part",)),
                    ("c", "b(a(estimation))", ("a.part", "b.part"))]
    assert parts.estimate == "c(b(a(estimation)))" and parts.producer_engine == "c(b(a(engine)))"
    assert parts.participants == ("a.part", "b.part", "c.part") and parts.kl == "b's kl"
    assert parts.engine == "engine"  # evaluation and the sync check keep the plain engine


def test_a_method_that_asks_for_nothing_adds_nothing(monkeypatch):
    monkeypatch.setattr(reasonrl.methods, "METHODS", (SimpleNamespace(build=lambda cfg, parts: Added()),))
    parts = bare_parts()
    assert build_methods(load_config(), parts) == parts


def test_one_method_holds_the_kl_coefficient(monkeypatch):
    monkeypatch.setattr(reasonrl.methods, "METHODS", (recording("a", [], kl=1), recording("b", [], kl=2)))
    with pytest.raises(ValueError, match="two methods hold the KL coefficient"):
        build_methods(load_config(), bare_parts())


def test_the_shipped_order():
    # The critic joins the estimation before distillation and PRIME wrap it; guidance sees a group
    # before replay changes it; the KL controller follows them (it adapts after their updates).
    assert METHODS == (critic, distill, prime, guidance, replay, kl, tree)


def test_the_critic_refuses_an_estimation_already_wrapped():
    with pytest.raises(TypeError, match="list reasonrl.methods.critic before the methods that wrap"):
        critic.build(load_config(overrides=["algo.advantage=gae"]), bare_parts(estimate="a wrapper"))


def test_methods_off_in_the_default_config_add_nothing_but_the_kl_coefficient():
    cfg, parts = load_config(), bare_parts()
    for method in (distill, prime, guidance, replay, tree):
        assert method.build(cfg, parts) == Added(), method.__name__
    added = kl.build(cfg, parts)
    assert added.kl is added.participants[0] and added.kl.value == 0.0 and len(added.participants) == 1


def test_the_architecture_page_adds_the_toy_method_with_one_file_and_one_registry_line():
    page = (ROOT / "docs/architecture.md").read_text()
    diff = re.search(r"```diff\n(.*?)```", page, re.DOTALL).group(1)
    files = re.split(r"^--- .*\n\+\+\+ b/(.*)\n", diff, flags=re.MULTILINE)[1:]
    changes = dict(zip(files[::2], files[1::2]))
    assert len(changes) == 2, list(changes)
    new_file = [line[1:] for line in changes["src/reasonrl/methods/clip_advantages.py"].splitlines()
                if not line.startswith("@@")]
    assert "\n".join(new_file) + "\n" == (ROOT / "tests/toy_method.py").read_text()
    registry = (ROOT / "src/reasonrl/methods/__init__.py").read_text().splitlines()
    edit = changes["src/reasonrl/methods/__init__.py"].splitlines()
    removed = [line[1:] for line in edit if line.startswith("-")]
    added = [line[1:] for line in edit if line.startswith("+")]
    assert removed and all(line in registry for line in removed)
    assert [line.replace("clip_advantages, ", "").replace(", clip_advantages", "") for line in added] == removed
