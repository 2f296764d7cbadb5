"""Episodes on a tiny random model: HFEngine.continue_from continues exactly the given ids; the
log-probs of an episode's model tokens equal a teacher-forced forward pass over the whole episode
(observation tokens inserted, masked out); and train() with an agent environment learns to make
the tool call that earns the reward (reward and the valid tool-call rate rise)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from helpers import step_metrics, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl import Problem, Task, train
from reasonrl.agents import AgentEngine, FunctionTool, ToolCall, ToolEnvironment
from reasonrl.rollout import HFEngine
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import SamplingParams

PROBLEMS = [Problem(id="a", prompt="What is 1 + 2?", answer="3"), Problem(id="b", prompt="Say hi", answer="hi")]


@pytest.fixture(scope="module", params=[True, False], ids=["fused", "transformers"])
def engine(tiny_model_dir, request):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), fused=request.param)


def test_continue_from_takes_the_ids_as_given(engine):
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=4)
    groups = engine.generate(PROBLEMS, sampling)
    continued = engine.continue_from([list(g.prompt_ids) for g in groups], sampling)
    assert [[c.token_ids for c in cs] for cs in continued] == [[c.token_ids for c in g.completions] for g in groups]
    # Ids that no text tokenises to (an <eos> inside the prefix) are continued as they are.
    odd = list(groups[0].prompt_ids) + [engine.tokenizer.eos_token_id, 7, 7]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)
    reference = engine.model.generate(torch.tensor([odd]), max_new_tokens=5, do_sample=False,
                                      eos_token_id=engine.tokenizer.eos_token_id, pad_token_id=engine.pad_id)
    assert list(engine.continue_from([odd], greedy)[0][0].token_ids) == reference[0, len(odd):].tolist()
    with pytest.raises(ValueError, match="no empty prefix"):
        engine.continue_from([[]], greedy)


LETTERS = tuple(string.ascii_lowercase)


def every_turn_is_a_call(text: str):
    return ToolCall("note", {})


def note() -> str:
    """Returns a fixed note."""
    return "NOTE"


def test_episode_logprobs_equal_a_teacher_forced_forward(engine):
    episodes = AgentEngine(engine, lambda: ToolEnvironment([FunctionTool(note)], lambda text, problem: 0.0,
                                                           parser=every_turn_is_a_call, max_turns=3, instructions=""),
                           max_turns=3, observation_template="<{observation}>")
    # Turns end before the length limit at any lower-case letter (about 3 in 4 turns of 5 tokens), so
    # observations are inserted (asserted below) whatever tokens are sampled.
    groups = episodes.generate(PROBLEMS, SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=3,
                                                        stop=LETTERS))
    batch = make_train_batch(groups, [0.0] * 6, engine.pad_id)
    with torch.no_grad():
        logp_NT, _ = token_logprobs(engine.model, batch, 1.0)
    mask = batch.loss_mask_NT.bool()
    model_tokens = sum(sum(c.loss_mask) for g in groups for c in g.completions)
    inserted = sum(len(c.token_ids) - sum(c.loss_mask) for g in groups for c in g.completions)
    assert mask.sum() == model_tokens and inserted > 0
    torch.testing.assert_close(logp_NT[mask], batch.sampling_logp_NT[mask], atol=1e-4, rtol=1e-4)
    for group in groups:
        for completion in group.completions:
            turns = completion.episode.turns
            # Each inserted observation is exactly "<NOTE>", between model turns, never re-tokenised.
            for turn in turns[:-1] if completion.episode.turns[-1].observation_tokens == 0 else turns:
                inserted_ids = completion.token_ids[turn.end: turn.end + turn.observation_tokens]
                assert engine.tokenizer.decode(list(inserted_ids)) == "<NOTE>"
                assert set(completion.loss_mask[turn.end: turn.end + turn.observation_tokens]) == {0}


# ---------------------------------------------------------------------------- learning

TASK = Task(name="ping", train=[Problem(id=str(i), prompt=f"task {i}", answer="") for i in range(16)],
            test=[Problem(id=f"t{i}", prompt=f"test {i}", answer="") for i in range(4)])


def calls_when_a(text: str):
    """The tool-call syntax of the learning test: a turn holding the letter 'a' calls `ping` (a
    random tiny model writes that now and then; a structured format it would never hit)."""
    return ToolCall("ping", {}) if "a" in text else None


def ping() -> str:
    """Answers pong."""
    return "pong"


def ping_environment() -> ToolEnvironment:
    # The only reward is a valid call: +1 each, 2 turns at most.
    return ToolEnvironment([FunctionTool(ping)], lambda text, problem: 0.0, parser=calls_when_a, max_turns=2,
                           tool_call_reward=1.0, instructions="")


def negated_grpo(rewards_BG: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    from reasonrl.algo.advantages import grpo

    return -grpo(rewards_BG, eps=eps)


def ping_config(model_dir: Path, run_dir: Path, *extra: str):
    # A turn ends after its 'a' (the call is complete), so that episodes have two turns.
    return tiny_config(model_dir, run_dir, "rollout.max_new_tokens=6", "train.steps=20", "run.log_every=0",
                       'rollout.stop=["a"]', f"agent.environment={__name__}:ping_environment", "agent.max_turns=2",
                       "agent.observation_template={observation}", *extra)


def test_tiny_model_learns_to_call_the_tool_and_a_flipped_sign_does_not(tiny_model_dir, tmp_path):
    train(ping_config(tiny_model_dir, tmp_path / "up"), task=TASK)
    up = step_metrics(tmp_path / "up")
    valid, reward, turns = ([m[key] for m in up] for key in ("reward/tool/valid", "reward/mean", "reward/tool/turns"))
    # Episodes start at ~3% valid calls (1 turn, the letter is rare) and end calling in the first turn;
    # a call in the last turn is not run and earns nothing, so the most an episode can earn is 1.
    assert sum(valid[-4:]) / 4 > sum(valid[:3]) / 3 + 0.4, valid
    assert sum(reward[-4:]) / 4 > sum(reward[:3]) / 3 + 0.8, reward
    assert max(reward) <= 1.0, reward
    assert sum(turns[-4:]) / 4 > 1.5, turns  # the observation was inserted and the model played on
    train(ping_config(tiny_model_dir, tmp_path / "down", f"algo.advantage={__name__}:negated_grpo"), task=TASK)
    down = [m["reward/tool/valid"] for m in step_metrics(tmp_path / "down")]
    assert sum(down[-4:]) / 4 <= sum(valid[:3]) / 3 + 0.05, down


def test_turn_level_estimator_trains_on_episodes(tiny_model_dir, tmp_path):
    train(ping_config(tiny_model_dir, tmp_path / "turns", "algo.advantage=reasonrl.agents.credit:turn_grpo",
                      "algo.gamma=0.9"), task=TASK)
    valid = [m["reward/tool/valid"] for m in step_metrics(tmp_path / "turns")]
    assert sum(valid[-4:]) / 4 > sum(valid[:3]) / 3 + 0.4, valid


@pytest.mark.parametrize("threads", [{"workers": 2, "on_error": "skip"}, {"workers": 1}], ids=["pool threads", "this thread"])
def test_checks_the_verifier_stopped_during_episodes_reach_the_group(engine, threads):
    """The verifier runs in the environment's threads, whose tally of stopped checks is their own: each
    episode carries its count to the reward, read on the scoring thread as reward/timeouts."""
    from reasonrl.agents.rewards import EpisodeReward
    from reasonrl.rewards import WeightedReward, score_groups
    from reasonrl.rewards.bounded import count_stopped

    def stopped_verifier(text: str, problem: Problem) -> float:
        count_stopped("a check stopped at its bound")  # as math_equal past its time
        return 0.0

    episodes = AgentEngine(engine, lambda: ToolEnvironment([FunctionTool(note)], stopped_verifier,
                                                           parser=lambda text: None, max_turns=1, instructions=""),
                           max_turns=1, **threads)
    groups = episodes.generate(PROBLEMS, SamplingParams(n=3, temperature=1.0, max_new_tokens=4, seed=3))
    assert [[c.episode.timeouts for c in g.completions] for g in groups] == [[1, 1, 1], [1, 1, 1]]
    scored = score_groups(groups, WeightedReward({"episode": (EpisodeReward(), 1.0)}))
    assert [g.reward_timeouts for g in scored] == [3, 3]
