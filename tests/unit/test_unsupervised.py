"""Label-free rewards: majority vote, self-certainty / token entropy, sequence log-probability."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from reasonrl.rewards import WeightedReward
from reasonrl.rewards.unsupervised import (
    MajorityVoteReward,
    SelfCertaintyReward,
    SequenceLogProbReward,
    answer_clusters,
    token_certainty,
)
from reasonrl.types import Completion, Problem

# The gold answer is deliberately not the majority: these rewards must never read it.
PROBLEM = Problem(id="q", prompt="What is 1/2?", answer="99")
LOG4 = math.log(4)


def texts(*contents: str) -> list[Completion]:
    return [Completion(token_ids=(1,), text=t, logprobs=(0.0,), finish_reason="stop") for t in contents]


def tokens(*ids: tuple[int, ...]) -> list[Completion]:
    return [Completion(token_ids=i, text="x", logprobs=(0.0,) * len(i), finish_reason="stop") for i in ids]


# --- TTRL majority vote ----------------------------------------------------------------------------

def test_majority_vote_groups_equivalent_answers():
    group = texts("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{3}", "I give up", "\\boxed{1/2}")
    # answers: 0.5, \frac{1}{2}, 3, None, 1/2 -> clusters {0, 1, 4} (one half, three votes) and {2}; 3 does not vote
    assert answer_clusters(["0.5", "\\frac{1}{2}", "3", None, "1/2"]) == [[0, 1, 4], [2]]
    assert MajorityVoteReward().score_group(PROBLEM, group) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_the_symbolic_checks_of_a_group_share_one_time_budget(monkeypatch):
    # Every check runs to its time bound (a hostile answer), on a clock that advances by what each
    # check was allowed. 6 distinct answers would take 15 checks x 5 s; within a 12 s budget the checks
    # get 5, 5, then the 2 s left, and after that answers are compared as strings: "a" still joins "a".
    from reasonrl.rewards import unsupervised

    clock, allowed = [0.0], []

    def slow_equal(prediction, gold, *, timeout_s):
        allowed.append(timeout_s)
        clock[0] += timeout_s
        return False

    monkeypatch.setattr(unsupervised.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(unsupervised, "math_equal", slow_equal)
    from reasonrl.rewards.bounded import timeouts_on_this_thread

    before = timeouts_on_this_thread()
    clusters = answer_clusters(["a", "b", "c", "d", "a", "e"], budget_s=12.0)
    assert allowed == [5.0, 5.0, 2.0] and clock[0] == 12.0
    assert clusters == [[0, 4], [1], [2], [3], [5]]
    assert timeouts_on_this_thread() == before + 1  # the group, once: its later answers compared as text
    assert answer_clusters(["a", "a"], budget_s=12.0) == [[0, 1]] and timeouts_on_this_thread() == before + 1


def test_majority_vote_ties_go_to_the_answer_seen_first():
    # 3 and 4 have two votes each: the first-appearing answer wins, as Counter.most_common does in TTRL
    assert MajorityVoteReward().score_group(PROBLEM, texts(*(f"\\boxed{{{a}}}" for a in "3443"))) == [
        1.0, 0.0, 0.0, 1.0]
    assert MajorityVoteReward().score_group(PROBLEM, texts(*(f"\\boxed{{{a}}}" for a in "4334"))) == [
        1.0, 0.0, 0.0, 1.0]
    # a tie between answers written in different forms: {0.5, \frac{1}{2}} vs {2, 2.0}, one half seen first
    group = texts("\\boxed{0.5}", "\\boxed{2}", "\\boxed{\\frac{1}{2}}", "\\boxed{2.0}")
    assert MajorityVoteReward().score_group(PROBLEM, group) == [1.0, 0.0, 1.0, 0.0]
    # one vote each: the first answer is the label
    assert MajorityVoteReward().score_group(PROBLEM, texts("\\boxed{5}", "\\boxed{6}")) == [1.0, 0.0]


def test_majority_vote_without_any_answer_scores_zero():
    assert MajorityVoteReward(extract="boxed").score_group(PROBLEM, texts("the answer is 3", "3")) == [0.0, 0.0]
    assert MajorityVoteReward().score_group(PROBLEM, texts("", "no idea")) == [0.0, 0.0]


def test_majority_vote_min_agreement():
    group = texts("\\boxed{1}", "\\boxed{1}", "\\boxed{2}", "none", "nothing")
    # majority 1 holds 2 of the 5 completions (non-voters count): 0.4
    assert MajorityVoteReward(min_agreement=0.4).score_group(PROBLEM, group) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert MajorityVoteReward(min_agreement=0.5).score_group(PROBLEM, group) == [0.0] * 5
    with pytest.raises(ValueError, match="min_agreement"):
        MajorityVoteReward(min_agreement=1.5)
    with pytest.raises(ValueError, match="extract"):
        MajorityVoteReward(extract="first")


def test_majority_vote_as_a_weighted_component():
    reward = WeightedReward({"vote": (MajorityVoteReward(), 1.0)})
    scores = reward.score_group(PROBLEM, texts("\\boxed{7}", "\\boxed{7.0}", "\\boxed{8}"))
    assert scores.totals == (1.0, 1.0, 0.0)


# --- Sampled-token log-probability (EM-RL-sequence) ---------------------------------------------

def test_sequence_logprob_reward_mean_and_sum():
    group = [Completion(token_ids=(4, 5, 6), text="abc", logprobs=(-0.5, -1.5, -1.0), finish_reason="stop"),
             Completion(token_ids=(4,), text="a", logprobs=(-0.25,), finish_reason="length")]
    # mean: (-0.5 - 1.5 - 1.0) / 3 = -1.0 and -0.25; sum: -3.0 and -0.25
    assert SequenceLogProbReward().score_group(PROBLEM, group) == pytest.approx([-1.0, -0.25])
    assert SequenceLogProbReward(reduction="sum").score_group(PROBLEM, group) == pytest.approx([-3.0, -0.25])


def test_sequence_logprob_reward_needs_one_logprob_per_token():
    text_only = Completion(token_ids=(), text="abc", logprobs=(), finish_reason="stop")
    with pytest.raises(ValueError, match="one sampling log-probability per completion token"):
        SequenceLogProbReward().score_group(PROBLEM, [text_only])
    short = Completion(token_ids=(1, 2), text="ab", logprobs=(-1.0,), finish_reason="stop")
    with pytest.raises(ValueError, match="got 1 for 2 tokens"):
        SequenceLogProbReward().score_group(PROBLEM, [short])
    with pytest.raises(ValueError, match="reduction"):
        SequenceLogProbReward(reduction="max")


# --- Self-certainty and token entropy -----------------------------------------------------------

def test_token_certainty_by_hand():
    p = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.25, 0.25, 0.25, 0.25]])
    self_certainty_T, entropy_T = token_certainty(p.log())
    # row 0: KL(U || p) = 1/4 * [log(1/4 / 0.5) + log(1) + 2 log(1/4 / 0.125)] = 1/4 * (-log 2 + 2 log 2) = log(2)/4
    #        H(p) = 0.5 log 2 + 0.25 log 4 + 2 * 0.125 log 8 = 1.75 log 2
    # row 1: uniform -> KL(U || U) = 0 and H = log 4
    assert self_certainty_T.tolist() == pytest.approx([math.log(2) / 4, 0.0], abs=1e-6)
    assert entropy_T.tolist() == pytest.approx([1.75 * math.log(2), LOG4], abs=1e-6)
    # shifting all logits of a position changes nothing
    assert token_certainty(p.log() + 3.0)[0].tolist() == pytest.approx(self_certainty_T.tolist(), abs=1e-6)


class StubLM(torch.nn.Module):
    """A causal LM stand-in: the same logits at every position."""

    def __init__(self, logits_V: torch.Tensor):
        super().__init__()
        self.logits_V = torch.nn.Parameter(logits_V, requires_grad=False)

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.logits_V.expand(*input_ids.shape, -1))


def prompt_ids(problem: Problem) -> list[int]:
    return [2, 10, 11, 12]


def test_self_certainty_of_uniform_and_peaked_distributions():
    group = tokens((1, 2, 3), (3,))
    uniform = StubLM(torch.zeros(4))
    # KL(U || U) = 0; neg_entropy = -log 4 per token, mean -log 4, sum over three tokens -3 log 4
    assert SelfCertaintyReward(uniform, prompt_ids).score_group(PROBLEM, group) == pytest.approx([0.0, 0.0], abs=1e-6)
    assert SelfCertaintyReward(uniform, prompt_ids, measure="neg_entropy").score_group(PROBLEM, group) == \
        pytest.approx([-LOG4, -LOG4])
    assert SelfCertaintyReward(uniform, prompt_ids, measure="neg_entropy", reduction="sum").score_group(
        PROBLEM, group) == pytest.approx([-3 * LOG4, -LOG4])
    peaked = StubLM(torch.tensor([50.0, 0.0, 0.0, 0.0]))
    # log p = (0, -50, -50, -50) up to e^-50: KL(U || p) = -log 4 - (0 - 150) / 4 = 37.5 - log 4 = 36.1137056; H ~ 0
    assert SelfCertaintyReward(peaked, prompt_ids).score_group(PROBLEM, group) == pytest.approx([36.1137056] * 2)
    assert SelfCertaintyReward(peaked, prompt_ids, measure="neg_entropy").score_group(PROBLEM, group) == \
        pytest.approx([0.0, 0.0], abs=1e-6)


def test_self_certainty_divides_logits_by_the_temperature():
    p = torch.tensor([0.5, 0.25, 0.125, 0.125])
    reward = SelfCertaintyReward(StubLM(p.log()), prompt_ids, temperature=2.0)
    # logits / 2 -> q_j = sqrt(p_j) / S with S = sum_j sqrt(p_j) = 1.9142136;
    # KL(U || q) = -log 4 - 1/4 sum_j log q_j = -log 4 + log S - (1/8) log(1/512) = 0.0428031
    assert reward.score_group(PROBLEM, tokens((1, 2))) == pytest.approx([0.0428031], abs=1e-6)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from helpers import build_tiny_model
    from transformers import AutoModelForCausalLM

    # a large initialisation makes the next-token distributions far from uniform
    directory = build_tiny_model(tmp_path_factory.mktemp("peaked-lm"), seed=3, initializer_range=0.5)
    return AutoModelForCausalLM.from_pretrained(directory).eval()


def direct(model, prompt: list[int], completion: tuple[int, ...], temperature: float) -> tuple[float, float]:
    """Self-certainty and entropy from an unpadded forward of one sequence, in float64, through
    torch's own KL and entropy: the logits at position i are the distribution of token i + 1."""
    with torch.no_grad():
        logits_LV = model(input_ids=torch.tensor([prompt + list(completion)])).logits[0].double()
    logits_TV = logits_LV[len(prompt) - 1 : len(prompt) - 1 + len(completion)] / temperature
    logp_TV = torch.log_softmax(logits_TV, dim=-1)
    uniform_TV = torch.full_like(logp_TV, 1.0 / logp_TV.shape[-1])
    kl_T = torch.nn.functional.kl_div(logp_TV, uniform_TV, reduction="none").sum(-1)   # sum_j U_j (log U_j - log p_j)
    entropy_T = torch.distributions.Categorical(logits=logits_TV).entropy()
    return float(kl_T.mean()), float(entropy_T.mean())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_self_certainty_on_a_tiny_model_matches_a_direct_computation(tiny_lm, temperature):
    prompt = prompt_ids(PROBLEM)
    group = tokens((20, 30, 40, 50, 60), (21,), (70, 71, 72))   # different lengths: padded in one forward
    expected = [direct(tiny_lm, prompt, c.token_ids, temperature) for c in group]
    certainty = SelfCertaintyReward(tiny_lm, prompt_ids, temperature=temperature).score_group(PROBLEM, group)
    entropy = SelfCertaintyReward(tiny_lm, prompt_ids, measure="neg_entropy", temperature=temperature)
    assert certainty == pytest.approx([kl for kl, _ in expected], rel=1e-4)
    assert entropy.score_group(PROBLEM, group) == pytest.approx([-h for _, h in expected], rel=1e-4)
    # the distributions are far enough from uniform for the check to mean something
    assert min(certainty) > 0.05


def test_self_certainty_restores_the_model_mode(tiny_lm):
    tiny_lm.train()
    try:
        SelfCertaintyReward(tiny_lm, prompt_ids).score_group(PROBLEM, tokens((20, 21)))
        assert tiny_lm.training
    finally:
        tiny_lm.eval()
    SelfCertaintyReward(tiny_lm, prompt_ids).score_group(PROBLEM, tokens((20, 21)))
    assert not tiny_lm.training


def test_self_certainty_fails_loudly():
    model = StubLM(torch.zeros(4))
    with pytest.raises(ValueError, match="no token ids for problem 'q'"):
        SelfCertaintyReward(model, lambda problem: []).score_group(PROBLEM, tokens((1,)))
    text_only = Completion(token_ids=(), text="abc", logprobs=(), finish_reason="stop")
    with pytest.raises(ValueError, match="no token ids"):
        SelfCertaintyReward(model, prompt_ids).score_group(PROBLEM, [text_only])
    empty = Completion(token_ids=(), text="", logprobs=(), finish_reason="stop")
    with pytest.raises(ValueError, match="no tokens"):
        SelfCertaintyReward(model, prompt_ids).score_group(PROBLEM, [empty])
    for options, message in [({"measure": "entropy"}, "measure"), ({"reduction": "max"}, "reduction"),
                             ({"temperature": 0.0}, "temperature")]:
        with pytest.raises(ValueError, match=message):
            SelfCertaintyReward(model, prompt_ids, **options)
