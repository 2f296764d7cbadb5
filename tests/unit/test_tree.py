"""Tree rollouts (rollout.tree): TreeRL's segment advantages by hand on a small tree, the tree
sampler on a scripted engine (shape, budgets, seeds, early ends, stop strings across a segment
boundary, segments adapted to the completions' length) and on a tiny model (sampling log-probs
equal the learner's teacher-forced ones), the advantages laid on every copy of a segment's
tokens, and the settings a tree is refused with."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl import load_config
from reasonrl.algo.tree import flat_tree, membership_SG, treerl
from reasonrl.config import ConfigError, tree_branching
from reasonrl.rollout.tree import TreeSampler
from reasonrl.seeds import problem_seed
from reasonrl.training.estimation import AdvantageEstimation
from reasonrl.types import Completion, Group, Problem, SamplingParams, TreeShape

# root -> node 0 -> {node 2 (completion 0), node 3 (completion 1)}; root -> node 1 (completion 2,
# it ended in the first segment).
SMALL_TREE = TreeShape(parents=(-1, -1, 0, 0), sizes=(2, 3, 1, 2), paths=((0, 2), (0, 3), (1,)))


def treerl_of(tree: TreeShape, rewards: list[float]) -> torch.Tensor:
    return treerl(torch.tensor(rewards), under_SG=membership_SG(tree), parent_S=torch.tensor(tree.parents))


def test_treerl_by_hand_on_a_small_tree():
    # Rewards [1, 0, 0]: V(root) = 1/3, V(0) = 1/2, V(1) = 0, V(2) = 1, V(3) = 0.
    # A(0) = (1/2 - 1/3 + 1/2 - 1/3) / sqrt(2) = (1/3) / sqrt(2); A(1) = 2 (0 - 1/3) / 1 = -2/3;
    # A(2) = (1 - 1/3) + (1 - 1/2) = 7/6; A(3) = (0 - 1/3) + (0 - 1/2) = -5/6.
    expected = torch.tensor([1 / 3 / math.sqrt(2), -2 / 3, 7 / 6, -5 / 6])
    torch.testing.assert_close(treerl_of(SMALL_TREE, [1.0, 0.0, 0.0]), expected)


def test_a_flat_group_is_twice_dr_grpo_and_a_reward_shift_changes_nothing():
    rewards = [1.0, 0.0, 0.5, 0.0]
    flat = flat_tree([3, 2, 4, 1])
    torch.testing.assert_close(treerl_of(flat, rewards), 2 * (torch.tensor(rewards) - 0.375))
    torch.testing.assert_close(treerl_of(SMALL_TREE, [3.0, 2.0, 2.0]), treerl_of(SMALL_TREE, [1.0, 0.0, 0.0]))


def test_node_order_does_not_matter():
    # The same tree with nodes 0 and 1 swapped.
    swapped = TreeShape(parents=(-1, -1, 1, 1), sizes=(3, 2, 1, 2), paths=((1, 2), (1, 3), (0,)))
    same = treerl_of(swapped, [1.0, 0.0, 0.0])
    torch.testing.assert_close(same[[1, 0, 2, 3]], treerl_of(SMALL_TREE, [1.0, 0.0, 0.0]))


def test_a_node_without_completions_is_an_error():
    orphan = TreeShape(parents=(-1, -1), sizes=(1, 1), paths=((0,),))
    with pytest.raises(ValueError, match="at least one completion"):
        treerl_of(orphan, [1.0])


def test_node_advantages_reach_every_copy_of_their_tokens():
    completions = tuple(Completion(token_ids=tuple(range(5, 5 + n)), text="", logprobs=(-1.0,) * n,
                                   finish_reason="stop") for n in (3, 4, 3))
    group = Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=(3,), completions=completions,
                  rewards=(1.0, 0.0, 0.0), tree=SMALL_TREE)
    estimate = AdvantageEstimation(treerl, learner=None, micro_batch_size=8, knobs={}, kl_estimator=None)
    batch, _ = estimate([group], pad_id=0, kl_coef=0.0)
    a0, a1, a2, a3 = treerl_of(SMALL_TREE, [1.0, 0.0, 0.0]).tolist()
    # Position t predicts token t + 1: after the 1-token prompt, position k holds completion token k.
    rows = batch.advantages_NT
    assert rows[0, :3].tolist() == pytest.approx([a0, a0, a2])
    assert rows[1, :4].tolist() == pytest.approx([a0, a0, a3, a3])
    assert rows[2, :3].tolist() == pytest.approx([a1, a1, a1])
    assert rows[0, 3:].abs().sum() == rows[2, 3:].abs().sum() == 0  # padding


class ScriptedEngine:
    """Continues a prefix with tokens that say where they come from: continuation i of a prefix of
    length p writes token 10 * (p + 1) + i, `budget` times, unless the prefix is listed in `ends`
    (then it writes one token and stops). Log-prob of each token: -token / 1000."""

    def __init__(self, ends=()):
        self.ends, self.calls = set(ends), []

        class Tokenizer:
            def decode(self, ids, skip_special_tokens=True):
                return "".join(chr(65 + i % 26) for i in ids)

        self.tokenizer = Tokenizer()

    def prompt_ids(self, problem):
        return [1, 2]

    def continue_from(self, prefixes, sampling, seeds):
        self.calls.append(([tuple(p) for p in prefixes], sampling.n, sampling.max_new_tokens, list(seeds)))
        out = []
        for prefix in prefixes:
            rows = []
            for i in range(sampling.n):
                token = 10 * (len(prefix) + 1) + i
                stop = (tuple(prefix), i) in self.ends
                tokens = (token,) if stop else (token,) * sampling.max_new_tokens
                rows.append(Completion(token_ids=tokens, text="", logprobs=tuple(-t / 1000 for t in tokens),
                                       finish_reason="stop" if stop else "length"))
            out.append(rows)
        return out

    def load_weights(self, named):
        pass


PROBLEM = Problem(id="p", prompt="x", answer="1")


def test_the_sampler_grows_a_tree_level_by_level():
    # 2x2 tree, segments of 2, 5 new tokens at most: the prompt [1, 2] continued twice for 2 tokens
    # (30, 30) and (31, 31); the second of those ends at once when its prefix is the prompt
    # ((1, 2), 1) -> a leaf (31,) finished "stop". The first is continued twice with the 3 tokens left.
    engine = ScriptedEngine(ends={((1, 2), 1)})
    sampler = TreeSampler(engine, (2, 2), segment_tokens=2)
    (group,) = sampler.generate([PROBLEM], SamplingParams(n=4, max_new_tokens=5, seed=7))
    assert [c.token_ids for c in group.completions] == [(30, 30, 50, 50, 50), (30, 30, 51, 51, 51), (31,)]
    assert [c.finish_reason for c in group.completions] == ["length", "length", "stop"]
    assert group.completions[0].logprobs == (-0.03, -0.03, -0.05, -0.05, -0.05)
    assert group.tree == TreeShape(parents=(-1, -1, 0, 0), sizes=(2, 1, 3, 3), paths=((0, 2), (0, 3), (1,)),
                                   segment_tokens=2)
    assert group.generated_tokens == 9 < sum(len(c.token_ids) for c in group.completions) == 11
    assert [call[1:3] for call in engine.calls] == [(2, 2), (2, 3)]
    assert engine.calls[1][0] == [(1, 2, 30, 30)]
    # each node's continuations have their own seed, derived from the problem's
    assert len({seed for call in engine.calls for seed in call[3]}) == 2
    again = TreeSampler(ScriptedEngine(ends={((1, 2), 1)}), (2, 2), 2)
    assert again.generate([PROBLEM], SamplingParams(n=4, max_new_tokens=5, seed=7)) == [group]


def test_a_stop_string_across_a_segment_boundary_ends_the_branch():
    # Tokens decode to letters: 30 -> 'E', 31 -> 'F'. Stop "EE" lies inside the first segment (30, 30).
    engine = ScriptedEngine()
    (group,) = TreeSampler(engine, (2, 2), 2).generate([PROBLEM], SamplingParams(n=4, max_new_tokens=5, stop=("EE",)))
    assert [c.finish_reason for c in group.completions] == ["stop", "length", "length"]
    assert group.completions[0].text == ""
    assert len(engine.calls) == 2 and engine.calls[1][0] == [(1, 2, 31, 31)]  # only the other branch grew


def test_adaptive_segments_follow_the_mean_completion_length():
    # A 2x2x2 tree, 30 new tokens: the first call knows nothing and takes 30 / 3 = 10 tokens per segment.
    # Prefix (1, 2) continuation 1 ends at once: completions (31,) and four of 10 + 10 + 10 tokens,
    # mean (1 + 4 * 30) / 5 = 24.2 -> the next call's segments: round(24.2 / 3) = 8, third level 30 - 16.
    engine = ScriptedEngine(ends={((1, 2), 1)})
    sampler = TreeSampler(engine, (2, 2, 2), segment_tokens=0)
    sampling = SamplingParams(n=8, max_new_tokens=30)
    (first,) = sampler.generate([PROBLEM], sampling)
    assert [call[2] for call in engine.calls] == [10, 10, 10]
    assert first.size == 5 and first.tree.segment_tokens == 10
    assert sampler.mean_length == pytest.approx(24.2)
    engine.calls.clear()
    (second,) = sampler.generate([PROBLEM], sampling)
    assert [call[2] for call in engine.calls] == [8, 8, 14] and second.tree.segment_tokens == 8
    # very short answers: never below 1 token; a long mean: at most what leaves the last level a token
    resumed = TreeSampler(ScriptedEngine(), (2, 2, 2), 0)
    resumed.load_state_dict({"mean_length": 1.0})
    assert resumed.segment_for(30) == 1
    resumed.load_state_dict(sampler.state_dict() | {"mean_length": 600.0})
    assert resumed.segment_for(30) == 14
    assert TreeSampler(ScriptedEngine(), (2, 2, 2), 6).segment_for(30) == 6  # a fixed length stays


def test_the_sampler_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="continues token-id prefixes"):
        TreeSampler(object(), (2, 2), 2)
    sampler = TreeSampler(ScriptedEngine(), (2, 2), 4)
    with pytest.raises(ValueError, match="samples 4 completions"):
        sampler.generate([PROBLEM], SamplingParams(n=8, max_new_tokens=16))
    with pytest.raises(ValueError, match="no room"):
        sampler.generate([PROBLEM], SamplingParams(n=4, max_new_tokens=4))


def test_tree_log_probs_are_the_learners_on_a_tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.rollout.hf import HFEngine
    from reasonrl.training.learner import make_train_batch
    from reasonrl.training.token_stats import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampler = TreeSampler(HFEngine(model, tokenizer), (2, 2, 2), segment_tokens=3)
    problems = [Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(2)]
    sampling = SamplingParams(n=8, max_new_tokens=9, temperature=1.0, seed=3)
    groups = sampler.generate(problems, sampling)
    # a problem's tree does not depend on the rest of the batch
    (alone,) = sampler.generate(problems[1:], sampling, seeds=[problem_seed(3, 1)])
    assert [c.token_ids for c in alone.completions] == [c.token_ids for c in groups[1].completions]
    assert alone.tree == groups[1].tree
    for group in groups:
        tree = group.tree
        for g, completion in enumerate(group.completions):
            assert len(tree.node_of_tokens(g)) == len(completion.token_ids)
        # siblings share their parent's tokens exactly: completions through the same first d nodes
        # (3 tokens each) have the same first 3 d tokens
        first = {tree.paths[g][0] for g in range(group.size)}
        assert len(first) <= 2
        for depth in (1, 2):
            for g in range(group.size):
                for h in range(group.size):
                    if tree.paths[g][:depth] == tree.paths[h][:depth]:
                        tokens = 3 * depth
                        assert group.completions[g].token_ids[:tokens] == group.completions[h].token_ids[:tokens]
    batch = make_train_batch(groups, [0.0] * sum(g.size for g in groups), tokenizer.pad_token_id)
    with torch.no_grad():
        learner_NT, _ = token_logprobs(model, batch, temperature=1.0)
    mask = batch.loss_mask_NT.bool()
    torch.testing.assert_close(learner_NT[mask], batch.sampling_logp_NT[mask], atol=2e-4, rtol=0)


@pytest.mark.parametrize(("setting", "message"), [
    ("rollout.group_size=4", "rollout.group_size=8"),
    ("rollout.max_new_tokens=32", "no room"),
    ("sampling.adaptive_budget=true", "adaptive_budget=false"),
    ("sampling.replay=2", "replay=0"),
    ("run.backend=ray", "run.backend=local"),
])
def test_a_tree_is_refused_with_what_it_cannot_be_combined_with(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=["rollout.tree=2x2x2", "rollout.group_size=8", "rollout.tree_segment_tokens=16",
                               setting])


def test_adaptive_segments_need_a_token_per_level():
    with pytest.raises(ConfigError, match="a token per level"):
        load_config(overrides=["rollout.tree=2x2x2", "rollout.group_size=8", "rollout.max_new_tokens=2"])
    assert load_config(overrides=["rollout.tree=2x2x2", "rollout.group_size=8", "rollout.max_new_tokens=3"])


@pytest.mark.parametrize("tree", ["2x", "x2", "0x4", "1", "two"])
def test_malformed_branching_is_refused(tree):
    with pytest.raises(ConfigError, match="branching factors"):
        tree_branching(tree)
    assert tree_branching("2x2x2") == (2, 2, 2) and tree_branching("") == ()
