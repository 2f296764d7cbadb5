"""model.system_prompt and model.reasoning_format: by default every prompt is as it was; set, every
problem's conversation opens with the system message (a text prompt becoming its user message),
which the chat template renders in training rollouts, `reasonrl eval --config` and SFT; a problem with
a system message of its own is refused, as are the knobs where reasonrl does not open the
conversations. reasoning_format=think_answer asks for exactly what reward.format_style=think_answer
rewards: a completion written as told gets the full format reward."""

from __future__ import annotations

import json
import re

import pytest
from helpers import TASK, sft_config, share_of_a, tiny_config

from reasonrl import Participant, Problem, load_config, train
from reasonrl.build import build_task, build_weighted_reward, system_message, with_system_message
from reasonrl.commands.cli import main
from reasonrl.config import ConfigError
from reasonrl.models import load_tokenizer
from reasonrl.rewards.format import FORMAT_INSTRUCTIONS, is_think_answer
from reasonrl.rollout.base import prompt_token_ids
from reasonrl.stages import sft
from reasonrl.tasks import TASKS
from reasonrl.types import Completion

THINK = FORMAT_INSTRUCTIONS["think_answer"]


def opened(text: str, prompt: str) -> list[dict]:
    return [{"role": "system", "content": text}, {"role": "user", "content": prompt}]


def test_by_default_every_prompt_is_the_tasks_own_text():
    cfg = load_config()
    assert system_message(cfg) == ""
    built, plain = build_task(cfg), TASKS[cfg.task.name](cfg.task, cfg.run.seed)
    assert [p.prompt for p in (*built.train, *built.test)] == [p.prompt for p in (*plain.train, *plain.test)]
    assert all(isinstance(p.prompt, str) for p in built.train)
    assert build_task(cfg, TASK) is TASK


def test_the_system_message_opens_every_problem_of_the_configs_task_and_of_ones_own():
    cfg = load_config(overrides=["model.system_prompt=Be brief."])
    task = build_task(cfg, TASK)
    assert [p.prompt for p in task.train] == [opened("Be brief.", p.prompt) for p in TASK.train]
    assert [(p.id, p.answer) for p in task.test] == [(p.id, p.answer) for p in TASK.test]
    assert build_task(cfg).test[0].prompt == opened("Be brief.", TASKS["arithmetic"](cfg.task, 0).test[0].prompt)
    assert build_task(cfg, task) == task  # a task already opened by the message is kept as it is


def test_reasoning_format_adds_its_instruction_after_the_system_prompt():
    assert system_message(load_config(overrides=["model.reasoning_format=think_answer"])) == THINK
    both = load_config(overrides=["model.reasoning_format=think_answer", "model.system_prompt=Be brief."])
    assert system_message(both) == f"Be brief.\n\n{THINK}"


def test_the_chat_template_renders_the_system_message_before_the_prompt(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    problem = build_task(load_config(overrides=["model.reasoning_format=think_answer"]), TASK).train[0]
    rendered = tokenizer.decode(prompt_token_ids(tokenizer, problem, chat_template=True))
    assert rendered.endswith(f"<|system|>{THINK}<eos><|user|>say something 0<eos><|assistant|>")


def test_a_problem_with_its_own_system_message_is_refused():
    own = Problem(id="chat", prompt=[{"role": "system", "content": "You are a tutor."},
                                     {"role": "user", "content": "1+1?"}], answer="2")
    with pytest.raises(ConfigError, match=r"problem 'chat' has a system message of its own.*model.system_prompt"):
        with_system_message([own], "Be brief.")
    assert with_system_message([own], "") == [own]  # nothing to add, nothing refused
    chat = Problem(id="c", prompt=[{"role": "user", "content": "1+1?"}], answer="2")
    assert with_system_message([chat], "S")[0].prompt == opened("S", "1+1?")


@pytest.mark.parametrize("where", [["model.chat_template=false"], ["task.name=verifiers", "task.env=an-env"],
                                   ["agent.environment=python_math"],
                                   ["task.agent=reasonrl.rewards.format:has_boxed"]])
@pytest.mark.parametrize("knob", ["model.system_prompt=Be brief.", "model.reasoning_format=think_answer"])
def test_the_knobs_are_refused_where_reasonrl_does_not_open_the_conversations(where, knob):
    with pytest.raises(ConfigError, match=rf"{knob.split('=')[0]}=.* has no effect"):
        load_config(overrides=[*where, knob])


def completion(text: str) -> Completion:
    return Completion(token_ids=(1,), text=text, logprobs=(-1.0,), finish_reason="stop")


def test_a_completion_written_as_the_instruction_says_gets_the_full_format_reward():
    # The instruction's own example is the layout the check accepts.
    example = re.search(r"i\.e\., (<think>.*?</answer>)", THINK)
    assert example is not None and is_think_answer(example.group(1))
    cfg = load_config(overrides=["model.reasoning_format=think_answer", "reward.format_style=think_answer"])
    problem = Problem(id="p", prompt="What is 2 + 3?", answer="5")
    as_told = ["<think>2 + 3 = 5</think> <answer>5</answer>",
               "<think>\nTwo plus three is five.\n</think>\n<answer>\\boxed{5}</answer>\n"]  # the task asks for \boxed{}
    not_as_told = ["<think>2 + 3 = 5</think> <answer>5</answer> Hope this helps.",  # words after </answer>
                   "2 + 3 = 5, so <answer>5</answer>",  # no <think>
                   "<think>2 + 3 = 6</think> <answer>6</answer>"]  # as told but wrong: the format reward is gated
    scores = build_weighted_reward(cfg).score_group(problem, [completion(t) for t in as_told + not_as_told])
    # correct_weight x 1 + format_weight x 1 = 1.0 + 0.1 for both written as told.
    assert scores.totals == pytest.approx((1.1, 1.1, 1.0, 1.0, 0.0))


class PromptRecorder(Participant):
    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    def observe(self, step, indices, groups):
        self.prompts += [self.tokenizer.decode(group.prompt_ids) for group in groups]
        return groups


def test_training_rollouts_and_their_log_carry_the_system_message(tiny_model_dir, tmp_path):
    recorder = PromptRecorder(load_tokenizer(str(tiny_model_dir)))
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=1", "model.system_prompt=Be brief."), task=TASK,
          reward=share_of_a, participants=[recorder])
    assert len(recorder.prompts) == 4
    assert all(re.fullmatch(r"<\|system\|>Be brief\.<eos><\|user\|>say something \d+<eos><\|assistant\|>", text)
               for text in recorder.prompts), recorder.prompts
    logged = [json.loads(line)["prompt"] for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert all(prompt[0] == {"role": "system", "content": "Be brief."} for prompt in logged)


def test_sft_trains_on_prompts_opened_by_the_system_message(tiny_model_dir, tmp_path, monkeypatch):
    seen = []

    def recording(tokenizer, problem, **kwargs):
        seen.append(problem.prompt)
        return original(tokenizer, problem, **kwargs)

    original = sft.sft_group
    monkeypatch.setattr(sft, "sft_group", recording)
    sft.train_sft(sft_config(tiny_model_dir, tmp_path, "train.steps=1", "model.system_prompt=Be brief."), task=TASK)
    assert seen == [opened("Be brief.", p.prompt) for p in TASK.train]


def test_eval_with_a_config_opens_the_task_problems_with_its_system_message(tiny_model_dir, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", str(tiny_model_dir), "--task", "arithmetic", "--n", "1", "--limit", "2",
                 "--max-new-tokens", "1", "--out", str(out), "--no-progress", "--config", "grpo",
                 "--set", "model.system_prompt=Be brief."]) == 0
    tokenizer = load_tokenizer(str(tiny_model_dir))
    prompts = [tokenizer.decode(json.loads(line)["prompt_ids"]) for line in (out / "completions.jsonl").read_text()
               .splitlines()]
    assert len(prompts) == 2 and all(text.startswith("<|system|>Be brief.<eos><|user|>What is ") for text in prompts)
