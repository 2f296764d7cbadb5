"""Multi-turn tool use without a model: tool-call parsing, tools, the tool environment, episode
rewards, turn-level credit assignment (numbers derived by hand), and the episode engine driven by a
scripted engine (loss mask, token ids, limits)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from reasonrl.agents import (
    AgentEngine,
    CalculatorTool,
    Document,
    EpisodeReward,
    EpisodeStatistic,
    FunctionTool,
    Malformed,
    PythonTool,
    RetrievalTool,
    ToolCall,
    ToolEnvironment,
    ToolError,
    TurnRewards,
    evaluate_expression,
    exact_match,
    turn_grpo,
    turn_level_advantages,
    turn_returns,
    turn_spans,
)
from reasonrl.agents.parsing import parse_auto, parse_json, parse_python, parse_tags
from reasonrl.config import ConfigError, load_config
from reasonrl.training.learner import make_train_batch
from reasonrl.types import Completion, Problem, SamplingParams

PROBLEM = Problem(id="p", prompt="What is 2 + 3?", answer="5")


# --------------------------------------------------------------------------- parsing

def test_parses_the_common_tool_call_formats():
    call = ToolCall("calculator", {"expression": "2+3"})
    assert parse_tags('I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}'
                      '</tool_call>') == call
    assert parse_json('{"name": "calculator", "parameters": {"expression": "2+3"}}') == call
    assert parse_json('{"name": "calculator", "arguments": "{\\"expression\\": \\"2+3\\"}"}') == call
    assert parse_python("Let me run\n```python\nprint(2+3)\n```\nok") == ToolCall("python", {"code": "print(2+3)\n"})
    python_first = '```python\nx=1\n```\n<tool_call>{"name": "a"}</tool_call>'
    assert parse_auto(python_first) == ToolCall("python", {"code": "x=1\n"})
    assert parse_auto('<tool_call>{"name": "a"}</tool_call> ```python\nx=1\n```') == ToolCall("a", {})
    for parser in (parse_tags, parse_json, parse_python, parse_auto):
        assert parser("The answer is \\boxed{5}.") is None


@pytest.mark.parametrize("text, reason", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}', "not closed"),
    ("<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no \"name\""),
    ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>["calc"]</tool_call>', "a tool call is a JSON object"),
    ("```python\nprint(1)", "not closed"),
    ("```python\n```", "empty"),
    ('{"name": "calc", "arguments": {"x": }', "not valid JSON"),
])
def test_malformed_calls_say_what_is_wrong(text, reason):
    parsed = parse_auto(text)
    assert isinstance(parsed, Malformed) and reason in parsed.reason, parsed


# --------------------------------------------------------------------------- tools

def test_calculator_evaluates_arithmetic_and_refuses_the_rest():
    assert evaluate_expression("3 * (17 + 4) ** 2") == 1323
    assert evaluate_expression("7 // 2 + 7 % 2 - -1") == 5
    assert evaluate_expression("sqrt(16) + factorial(4)") == 28.0
    assert CalculatorTool()({"expression": "10 / 4"}, {}).output == "2.5"
    for bad, message in [("__import__('os')", "not allowed"), ("(1).__class__", "not allowed"),
                         ("2 **", "cannot parse"), ("9 ** 9 ** 9", "too large"), ("1 / 0", "ZeroDivisionError"),
                         ("factorial(10**6)", "too large")]:
        with pytest.raises(ToolError, match=message):
            evaluate_expression(bad)
    with pytest.raises(ToolError, match="missing argument"):
        CalculatorTool()({}, {})


def test_function_tool_schema_validation_and_errors():
    def lookup(city: str, days: int = 1) -> dict:
        """Weather forecast."""
        if city == "Atlantis":
            raise KeyError("no such city")
        return {"city": city, "days": days}

    tool = FunctionTool(lookup)
    assert tool.name == "lookup" and tool.description == "Weather forecast."
    assert tool.parameters == {"type": "object", "required": ["city"],
                               "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    assert tool({"city": "Oslo"}, {}).output == '{"city": "Oslo", "days": 1}'
    with pytest.raises(ToolError, match="missing argument"):
        tool({"days": 2}, {})
    with pytest.raises(ToolError, match="unknown argument"):
        tool({"city": "Oslo", "when": "now"}, {})
    with pytest.raises(ToolError, match="'days' must be of type integer"):
        tool({"city": "Oslo", "days": "2"}, {})
    enum = FunctionTool(lookup, parameters={"type": "object", "properties": {"city": {"enum": ["Oslo"]}}})
    with pytest.raises(ToolError, match="'city' must be one of 'Oslo'"):
        enum({"city": "Bergen"}, {})
    failed = tool({"city": "Atlantis"}, {})
    assert not failed.ok and failed.output == "Error: KeyError: 'no such city'"
    with pytest.raises(TypeError, match="cannot derive a JSON schema"):
        FunctionTool(lambda x: x)


def test_retrieval_ranks_by_bm25():
    docs = [Document("1", "Paris", "Paris is the capital of France."),
            Document("2", "Oslo", "Oslo is the capital of Norway and sits on a fjord."),
            Document("3", "Cheese", "Brie is a soft cheese from France.")]
    tool = RetrievalTool(docs, top_k=2)
    assert tool.search("capital of Norway")[0].id == "2"
    assert [d.id for d in tool.search("cheese")] == ["3"]  # documents without a query word are left out
    assert tool({"query": "zebra"}, {}).output == "No document matches the query."
    assert tool({"query": "Norway fjord"}, {}).output.startswith("[Oslo] Oslo is the capital of Norway")
    # A query counts its first 64 words (each is scored against every document): the cheese after
    # 64 others finds nothing.
    filler = "zebra " * RetrievalTool.MAX_QUERY_WORDS
    assert tool.search(f"cheese {filler}")[0].id == "3" and tool.search(f"{filler} cheese") == []


def test_python_keeps_state_across_turns_and_reports_errors_and_timeouts():
    tool, session = PythonTool(timeout_s=2.0), {}
    assert tool({"code": "import math\nx = 40\nprint('set')"}, session).output == "set"
    assert tool({"code": "x + math.floor(2.5)"}, session).output == "42"  # earlier output is not repeated
    error = tool({"code": "y = 1\nundefined_name"}, session)
    assert error.status == "error" and "NameError: name 'undefined_name' is not defined" in error.output
    assert '"<cell>", line 2' in error.output and "<program>" not in error.output
    assert tool({"code": "print('y' in dir())"}, session).output == "False"  # the failed cell was not kept
    timeout = tool({"code": "while True:\n    pass"}, session)
    assert timeout.status == "timeout" and "did not finish within 2 s" in timeout.output
    assert session["cells"] == ["import math\nx = 40\nprint('set')", "x + math.floor(2.5)", "print('y' in dir())"]


# --------------------------------------------------------------------------- environment

def boxed_five(text: str, problem: Problem) -> float:
    return float("\\boxed{5}" in text)


def calculator_env(**options) -> ToolEnvironment:
    return ToolEnvironment([CalculatorTool()], boxed_five, tool_format="tags", **options)


def test_environment_answers_calls_errors_and_final_answers():
    env = calculator_env(tool_call_reward=-0.1, invalid_call_reward=-0.5, tool_bonus=0.2, max_turns=5)
    first = env.reset(PROBLEM)
    assert first.endswith("\n\nWhat is 2 + 3?") and '"name": "calculator"' in first
    broken = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}')
    assert broken.observation.startswith("Error: malformed tool call: <tool_call> is not closed")
    assert (broken.reward, broken.done, broken.info["tool_call"]) == (-0.5, False, "invalid")
    unknown = env.step('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert unknown.observation == "Error: there is no tool 'search'; tools: calculator"
    bad_args = env.step('<tool_call>{"name": "calculator", "arguments": {"expr": "2+3"}}</tool_call>')
    assert bad_args.observation.startswith("Error: calculator: missing argument(s): expression")
    assert bad_args.info["tool_call"] == "invalid"
    good = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
    assert (good.observation, good.reward, good.done, good.info["tool_call"]) == ("5", -0.1, False, "valid")
    final = env.step("So \\boxed{5}.")
    # 1 (correct) + 0.2 (bonus: correct and a valid call was made); no call this turn.
    assert (final.reward, final.done, final.info) == (pytest.approx(1.2), True, {"tool_call": "none", "correct": 1.0})


def test_bonus_is_gated_by_correctness_and_max_turns_ends_the_episode():
    env = calculator_env(tool_bonus=0.2, max_turns=2)
    env.reset(PROBLEM)
    env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>')
    wrong = env.step("\\boxed{4}")
    assert (wrong.reward, wrong.done) == (0.0, True)  # wrong: no bonus despite the valid call
    env.reset(PROBLEM)
    env.step("thinking")  # a turn without a call is the final answer
    assert env.turns == 1
    env.reset(PROBLEM)
    env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
    last = env.step('\\boxed{5} <tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>')
    # the 2nd of max_turns=2: a call there has no turn left to use it, the text is scored as the answer
    assert (last.done, last.reward, last.info["correct"]) == (True, pytest.approx(1.2), 1.0)
    assert last.info["tool_call"] == "unused"


def test_a_call_in_the_last_turn_is_not_run_and_earns_no_call_reward():
    env = calculator_env(tool_call_reward=0.1, invalid_call_reward=-0.5, max_turns=2)
    env.reset(PROBLEM)
    first = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
    assert (first.reward, first.done, first.info["tool_call"]) == (pytest.approx(0.1), False, "valid")
    last = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "9"}}</tool_call>')
    assert (last.reward, last.done, last.info["tool_call"], last.info["correct"]) == (0.0, True, "unused", 0.0)
    assert env.valid_calls == 1  # the late call was not run
    env.reset(PROBLEM)
    env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
    malformed_last = env.step("<tool_call>{not json</tool_call>")
    assert (malformed_last.reward, malformed_last.info["tool_call"]) == (0.0, "unused")  # no penalty either


def test_exact_match_normalises():
    problem = Problem(id="q", prompt="?", answer="The Eiffel Tower", metadata={"aliases": ["Tour Eiffel"]})
    assert exact_match("It is \\boxed{eiffel tower.}", problem) == 1.0
    assert exact_match("<answer>Tour Eiffel</answer>", problem) == 1.0
    assert exact_match("\\boxed{Louvre}", problem) == 0.0
    assert exact_match("no idea", problem) == 0.0


# --------------------------------------------------------------------------- credit assignment

def test_turn_spans_and_returns():
    assert turn_spans(torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1])) == [(1, 3), (5, 6), (7, 9)]
    assert turn_spans(torch.tensor([0, 0])) == []
    # G_2 = 1; G_1 = 0 + 0.5 * 1 = 0.5; G_0 = -0.1 + 0.5 * 0.5 = 0.15
    assert turn_returns([-0.1, 0.0, 1.0], gamma=0.5) == pytest.approx([0.15, 0.5, 1.0])


def test_turn_level_advantages_by_hand():
    # Episode returns with gamma = 1: A: [0.5, 1] -> G = [1.5, 1.0]; B: [0] -> G = [0]; C: [1] -> G = [1].
    # Group statistics of G_0 = (1.5, 0, 1): mean 2.5/3 = 0.8333..., unbiased variance
    # ((2/3)^2 + (5/6)^2 + (1/6)^2) / 2 = (16/36 + 25/36 + 1/36) / 2 = 42/72 = 7/12, std = 0.763763...
    advantages = turn_level_advantages([[0.5, 1.0], [0.0], [1.0]], gamma=1.0, eps=0.0)
    mean, std = 2.5 / 3, (7 / 12) ** 0.5
    assert advantages[0] == pytest.approx([(1.5 - mean) / std, (1.0 - mean) / std])  # [0.8729, 0.2182]
    assert advantages[0] == pytest.approx([0.872872, 0.218218], abs=1e-6)
    assert advantages[1] == pytest.approx([(0 - mean) / std])
    assert advantages[2] == pytest.approx([(1 - mean) / std])
    # One turn per episode: GRPO exactly, (r - mean) / std.
    single = turn_level_advantages([[1.0], [0.0]], eps=0.0)
    assert single == [[pytest.approx(1 / 2 ** 0.5)], [pytest.approx(-1 / 2 ** 0.5)]]
    # Equal episode returns carry no signal.
    assert turn_level_advantages([[0.0, 1.0], [1.0]]) == [[0.0, 0.0], [0.0]]


def test_turn_grpo_spreads_each_turns_advantage_over_its_tokens():
    # Two episodes of one problem. Row 0: turn (1,3) reward 0.5, observation at 3, turn (4,5) reward 1.
    # Row 1: one turn (1,4) reward 0. Returns (gamma 1): row 0 [1.5, 1.0], row 1 [0]; mean 0.75,
    # std of (1.5, 0) = 1.06066; A = row 0 [0.70711, 0.23570], row 1 [-0.70711].
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0, 0.5, 0, 1.0], [0, 0, 0, 0, 0]])
    expected = torch.tensor([[0, 0.707107, 0.707107, 0, 0.235702], [0, -0.707107, -0.707107, -0.707107, 0]])
    torch.testing.assert_close(turn_grpo(rewards, mask, group_size=2, eps=0.0), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        turn_grpo(rewards, mask, group_size=3)


def test_turn_grpo_is_the_config_estimator_and_refuses_varying_groups():
    from reasonrl.algo.advantages import ADVANTAGES, is_token_level
    from reasonrl.registry import lookup
    from reasonrl.rewards.components import episode_reward

    cfg = load_config(overrides=["algo.advantage=reasonrl.agents.credit:turn_grpo", "agent.environment=python_math"])
    estimator = lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator")
    assert estimator is turn_grpo and is_token_level(estimator)
    # so the episode's reward is laid on its turns, each turn's on its last token
    assert isinstance(episode_reward(cfg)._components["episode"][0], TurnRewards)
    grpo = load_config(overrides=["agent.environment=python_math"])
    assert not isinstance(episode_reward(grpo)._components["episode"][0], TurnRewards)
    with pytest.raises(ConfigError, match="turn_grpo normalises over groups"):
        load_config(overrides=["algo.advantage=reasonrl.agents.credit:turn_grpo", "sampling.adaptive_budget=true"])
    with pytest.raises(ConfigError, match="sampling.replay"):
        load_config(overrides=["agent.environment=python_math", "sampling.replay=2"])
    with pytest.raises(ConfigError, match="agent.tool_format"):
        load_config(overrides=["agent.tool_format=xml"])


# --------------------------------------------------------------------------- episode engine (scripted)

class ScriptedEngine:
    """Plays `script[call][row]`: the text of each live episode's turn in that call (tokenised with
    the real tokenizer); logprob -0.5 per token. Records the prefixes it was asked to continue."""

    def __init__(self, tokenizer, script: list[list[str]]):
        self.tokenizer, self.script, self.prefixes = tokenizer, script, []
        self.pad_id, self.chat_template = tokenizer.pad_token_id, True

    def continue_from(self, prefixes, sampling: SamplingParams):
        texts = self.script[len(self.prefixes)]
        assert len(texts) == len(prefixes) * sampling.n
        self.prefixes.append([list(p) for p in prefixes])
        out = []
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            kept = ids[: sampling.max_new_tokens]
            finish = "length" if len(ids) > len(kept) else "stop"
            out.append(Completion(tuple(kept), text, tuple([-0.5] * len(kept)), finish))
        return [out[i: i + sampling.n] for i in range(0, len(out), sampling.n)]

    def load_weights(self, named_tensors):
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def agent(tokenizer, script, **options):
    max_turns = options.pop("env_max_turns", 4)
    engine = ScriptedEngine(tokenizer, script)
    return engine, AgentEngine(engine, lambda: calculator_env(max_turns=max_turns, tool_call_reward=-0.1), **options)


def test_loss_mask_covers_exactly_the_models_tokens(tokenizer):
    # The character tokenizer gives one token per character (and one per special token such as <eos>).
    turn1, turn2 = "x" + CALL, "\\boxed{5}<eos>"
    engine, episodes = agent(tokenizer, [[turn1, "ab"], [turn2]], observation_template="[{observation}]")
    group, = episodes.generate([PROBLEM], SamplingParams(n=2, max_new_tokens=100))
    first, second = group.completions
    # Episode 1: turn 1 is 1 + 81 (the call) = 82 model tokens, then "[5]" = 3 inserted tokens, then
    # turn 2 is 9 characters + <eos> = 10 model tokens: mask 82 x 1, 3 x 0, 10 x 1 (95 tokens).
    assert len(turn1) == 82
    assert first.loss_mask == (1,) * 82 + (0,) * 3 + (1,) * 10
    assert first.logprobs == (-0.5,) * 82 + (0.0,) * 3 + (-0.5,) * 10
    assert first.text == turn1 + "[5]" + "\\boxed{5}"
    assert (first.finish_reason, first.episode.correct, first.episode.reward) == ("stop", 1.0, pytest.approx(0.9))
    assert [(t.start, t.end, t.tool_call, t.observation_tokens) for t in first.episode.turns] == [
        (0, 82, "valid", 3), (85, 95, "none", 0)]
    # Episode 2 answered at once ("ab", no call): 2 model tokens, wrong.
    assert (second.loss_mask, second.episode.reward, second.episode.correct) == ((1, 1), 0.0, 0.0)
    # Token ids round-trip: the 2nd turn continued from exactly prompt + turn 1 + observation ids.
    prompt = list(group.prompt_ids)
    assert engine.prefixes[0] == [prompt]  # the first turn: the shared prompt, prefilled once for both episodes
    assert engine.prefixes[1] == [prompt + list(first.token_ids[:85])]
    assert tokenizer.decode(first.token_ids[82:85]) == "[5]"
    assert list(first.token_ids[:82]) == tokenizer(turn1, add_special_tokens=False)["input_ids"]
    # The learner trains on model tokens only.
    batch = make_train_batch([group], [1.0, -1.0], tokenizer.pad_token_id)
    p = len(prompt)
    assert batch.loss_mask_NT[0, p - 1: p - 1 + 95].tolist() == list(first.loss_mask)
    assert batch.loss_mask_NT[0].sum() == 92 and batch.loss_mask_NT[1].sum() == 2


def test_environments_stepped_in_threads_give_the_same_episodes(tokenizer):
    script = [["x" + CALL, "ab", CALL], ["\\boxed{5}<eos>", "\\boxed{4}"]]
    runs = [agent(tokenizer, script, workers=workers)[1].generate([PROBLEM], SamplingParams(n=3, max_new_tokens=100))
            for workers in (1, 3)]
    assert runs[0] == runs[1]
    assert [c.episode.reward for c in runs[0][0].completions] == [pytest.approx(0.9), 0.0, pytest.approx(-0.1)]


def test_episode_limits(tokenizer):
    # max_turns: the engine stops an episode the environment would continue, finish "length".
    _, episodes = agent(tokenizer, [[CALL], [CALL]], max_turns=2, observation_template="{observation}")
    done, = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=200))
    completion = done.completions[0]
    assert completion.finish_reason == "length" and not completion.episode.done
    assert [t.tool_call for t in completion.episode.turns] == ["valid", "valid"]
    assert completion.loss_mask == (1,) * 81 + (0,) + (1,) * 81  # the last call's result is not inserted
    # The environment's own max_turns: the 2nd turn is the answer, the episode is done.
    _, episodes = agent(tokenizer, [[CALL], ["\\boxed{5}" + CALL]], env_max_turns=2,
                        observation_template="{observation}")
    completion = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=200))[0].completions[0]
    assert completion.episode.done and completion.episode.correct == 1.0 and completion.finish_reason == "stop"
    # Episode tokens: 81 + 1 observation + 10 left of 92 for the 2nd turn, which is cut: "length".
    _, episodes = agent(tokenizer, [[CALL], ["abcdefghijklmnop"]], max_episode_tokens=92,
                        observation_template="{observation}")
    completion = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=200))[0].completions[0]
    assert len(completion.token_ids) == 92 and completion.finish_reason == "length"
    assert completion.text.endswith("5abcdefghij")
    # An observation that leaves no room for a reply ends the episode without it: 81 + 4 >= 84.
    _, episodes = agent(tokenizer, [[CALL]], max_episode_tokens=84, observation_template="{observation}...")
    completion = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=200))[0].completions[0]
    assert completion.loss_mask == (1,) * 81 and completion.finish_reason == "length"
    # A model turn cut by rollout.max_new_tokens ends the episode.
    _, episodes = agent(tokenizer, [[CALL]])
    completion = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=30))[0].completions[0]
    assert len(completion.token_ids) == 30 and completion.finish_reason == "length"
    assert completion.episode.turns[0].tool_call == "invalid"


def test_observations_are_cut_to_max_observation_tokens(tokenizer):
    long_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "10**40"}}</tool_call>'
    _, episodes = agent(tokenizer, [[long_call], ["ok"]], max_observation_tokens=5,
                        observation_template="<{observation}>")
    completion = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=200))[0].completions[0]
    assert "<10000\n... (output cut)>ok" in completion.text


# --------------------------------------------------------------------------- episode rewards

def test_episode_rewards_and_statistics(tokenizer):
    _, episodes = agent(tokenizer, [["x" + CALL, "ab"], ["\\boxed{5}<eos>"]], observation_template="[{observation}]")
    group, = episodes.generate([PROBLEM], SamplingParams(n=2, max_new_tokens=100))
    assert EpisodeReward().score_group(PROBLEM, group.completions) == [pytest.approx(0.9), 0.0]
    assert EpisodeStatistic("valid").score_group(PROBLEM, group.completions) == [0.5, 0.0]
    assert EpisodeStatistic("turns").score_group(PROBLEM, group.completions) == [2.0, 1.0]
    assert EpisodeStatistic("correct").score_group(PROBLEM, group.completions) == [1.0, 0.0]
    dense = TurnRewards().score_tokens(PROBLEM, group.completions)
    assert dense[0][81] == pytest.approx(-0.1) and dense[0][94] == 1.0 and sum(dense[0]) == pytest.approx(0.9)
    assert dense[1] == [0.0, 0.0]
    plain = Completion((1,), "x", (0.0,), "stop")
    with pytest.raises(TypeError, match="not generated by an AgentEngine"):
        EpisodeReward().score_group(PROBLEM, [plain])
    with pytest.raises(ValueError, match="unknown episode statistic"):
        EpisodeStatistic("speed")


def test_prompt_is_the_environments_first_observation(tokenizer):
    _, episodes = agent(tokenizer, [])
    ids = episodes.prompt_ids(PROBLEM)
    text = tokenizer.decode(ids)
    assert text.startswith("<|user|>To call a tool") and text.endswith("What is 2 + 3?<eos><|assistant|>")
    assert episodes.prompt_ids(replace(PROBLEM, prompt=[{"role": "user", "content": "hi"}]))[0] == \
        tokenizer.convert_tokens_to_ids("<|system|>")


# --------------------------------------------------------------------------- wiring from the config

def test_python_math_episode_from_the_config(tokenizer):
    from reasonrl.build import build_agent_engine, build_weighted_reward

    cfg = load_config("examples/agents/tool_math.toml", ["agent.max_observation_tokens=16"])
    engine = ScriptedEngine(tokenizer, [["Let me compute.\n```python\nx = 2 + 3\nprint(x)\n```\n"],
                                        ["```python\nprint(x * 10)\n```\n"], ["So \\boxed{5}"]])
    episodes = build_agent_engine(cfg, engine)
    group, = episodes.generate([PROBLEM], SamplingParams(n=1, max_new_tokens=100))
    completion = group.completions[0]
    assert completion.text == ("Let me compute.\n```python\nx = 2 + 3\nprint(x)\n```\n```output\n5\n```\n"
                               "```python\nprint(x * 10)\n```\n```output\n50\n```\nSo \\boxed{5}")
    assert [t.tool_call for t in completion.episode.turns] == ["valid", "valid", "none"]
    # The config's shaping: correct (1) + tool_bonus 0.1.
    assert completion.episode.reward == pytest.approx(1.1)
    reward = build_weighted_reward(cfg)
    assert reward.names == ("episode", "correct", "tool/valid", "tool/invalid", "tool/turns")
    scores = reward.score_group(PROBLEM, group.completions)
    assert scores.totals == (pytest.approx(1.1),)
    assert scores.components["tool/valid"] == (pytest.approx(2 / 3),)
    assert "You can run Python" in tokenizer.decode(episodes.prompt_ids(PROBLEM))


def test_retrieval_qa_from_the_config(tokenizer):
    from reasonrl.build import build_agent_engine

    cfg = load_config("examples/agents/retrieval_qa.toml")
    question = Problem(id="q", prompt="Who invented the safety match?", answer="Gustaf Erik Pasch")
    call = '<tool_call>{"name": "search", "arguments": {"query": "safety match invented"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, [[call], ["\\boxed{Gustaf Erik Pasch}"]])
    completion = build_agent_engine(cfg, engine).generate([question], SamplingParams(n=1, max_new_tokens=200))[0] \
        .completions[0]
    assert "<tool_response>\n[Safety match] The safety match was invented by the Swedish chemist" in completion.text
    assert completion.episode.correct == 1.0
    with pytest.raises(ValueError, match="agent.corpus"):
        build_agent_engine(load_config(overrides=["agent.environment=retrieval_qa"]), engine)
