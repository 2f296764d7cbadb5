"""Every registered function declares what it takes (reasonrl.spec), and its declaration is true: the
names it declares are exactly its keyword parameters, so the trainer passes what it takes and a knob
the config refuses as unused is one the function really ignores."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import reasonrl
from reasonrl.agents.builtin import ENVIRONMENTS
from reasonrl.agents.credit import turn_grpo
from reasonrl.algo.advantages import ADVANTAGES, is_token_level, is_tree_level
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.objectives import OBJECTIVES, TOKEN_SELECTIONS
from reasonrl.config import Config
from reasonrl.rewards.unsupervised import MajorityVoteReward
from reasonrl.spec import Spec, arguments, declare, spec_of

# Keyword arguments every function of a family takes, passed by the code that calls it (a tree
# estimator's tree), or left to a caller in Python (an environment's instructions).
FIXED = {"aggregation": {"total_tokens", "total_sequences"}, "tree": {"under_SG", "parent_S"},
         "environment": {"instructions"}}
PYTHON_ONLY = {"environment retrieval_qa": {"verifier"}}  # its default (exact match) unless built in Python
REGISTERED = ([(f"advantage {name}", fn, "advantage") for name, fn in ADVANTAGES.items()]
              + [(f"objective {name}", fn, "objective") for name, fn in OBJECTIVES.items()]
              + [(f"token selection {name}", fn, "selection") for name, fn in TOKEN_SELECTIONS.items()]
              + [(f"aggregation {name}", fn, "aggregation") for name, fn in AGGREGATIONS.items()]
              + [(f"environment {name}", fn, "environment") for name, fn in ENVIRONMENTS.items()]
              + [("advantage turn_grpo", turn_grpo, "advantage")])


def keyword_parameters(fn) -> set[str]:
    return {name for name, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize(("what", "fn", "family"), REGISTERED, ids=[entry[0] for entry in REGISTERED])
def test_each_registered_function_declares_exactly_its_keyword_parameters(what, fn, family):
    assert isinstance(getattr(fn, "spec", None), Spec), f"{what} has no declaration"
    spec = spec_of(fn)
    declared = set(spec.inputs) | set(spec.knobs) | set(spec.context)
    fixed = FIXED.get("tree" if spec.level == "tree" else family, set())
    assert declared == keyword_parameters(fn) - fixed - PYTHON_ONLY.get(what, set()), what


@pytest.mark.parametrize(("what", "fn", "family"), REGISTERED, ids=[entry[0] for entry in REGISTERED])
def test_every_declared_knob_is_a_config_key(what, fn, family):
    cfg = Config()
    for key in (*spec_of(fn).knobs.values(), *spec_of(fn).context.values()):
        cfg.value(key)  # KeyError for a key the config does not have


def test_levels_say_what_an_estimator_works_on():
    token = {name for name, fn in ADVANTAGES.items() if is_token_level(fn)}
    tree = {name for name, fn in ADVANTAGES.items() if is_tree_level(fn)}
    assert token == {"reinforce_pp", "gae"}
    assert tree == {"treerl"}
    assert is_token_level(turn_grpo)


def test_group_relative_estimators_need_two_samples_and_the_others_one():
    needs_two = {name for name, fn in ADVANTAGES.items() if spec_of(fn).min_group_size == 2}
    assert needs_two == set(ADVANTAGES) - {"remax", "reinforce_pp", "gae"}


def test_arguments_are_the_declared_knobs_and_context_from_the_config():
    cfg = Config()
    assert arguments(OBJECTIVES["sapo"], cfg.value) == {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}
    assert arguments(AGGREGATIONS["seq_mean_token_sum_norm"], cfg.value) == {}  # its max_tokens: the batch's budget
    assert spec_of(AGGREGATIONS["seq_mean_token_sum_norm"]).inputs == {"max_tokens"}
    assert arguments(ADVANTAGES["dr_grpo"], cfg.value) == {}
    assert arguments(MajorityVoteReward, cfg.value) == {"extract": "auto"}


def test_an_undeclared_user_function_takes_its_fixed_arguments_only():
    def mine(rewards_BG, *, eps=1.0):
        return rewards_BG

    assert spec_of(mine) == Spec()
    assert arguments(mine, Config().value) == {}
    declared = declare(knobs={"eps": "algo.adv_eps"})(mine)
    assert declared is mine and arguments(mine, Config().value) == {"eps": 1e-6}


def test_a_declaration_is_checked():
    with pytest.raises(ValueError, match="level 'sequence' is not one of"):
        declare(level="sequence")
    with pytest.raises(ValueError, match="both as knobs and as context"):
        declare(knobs={"eps": "algo.adv_eps"}, context={"eps": "algo.adv_eps"})


def test_no_dispatch_on_signatures_in_the_library():
    """Calls are chosen by declarations; reading a signature is left to describing a user's tool to the
    model (agents.tools), to what transformers' model classes accept (rollout.hf, rewards.prm) and to
    whether a verifiers reward function needs a sandbox runtime reasonrl does not give (tasks.verifiers_env)."""
    allowed = {"agents/tools.py", "rollout/hf.py", "rewards/prm.py", "tasks/verifiers_env.py"}
    root = Path(reasonrl.__file__).parent
    reading = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                     if re.search(r"inspect\.signature|\b_accepted\(", path.read_text()))
    assert set(reading) <= allowed, reading
