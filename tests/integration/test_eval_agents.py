"""`reasonrl eval --config` on an agent config: every completion is an episode of multi-turn tool
use played against the config's environment, accuracy is the environment's verdict on the final
answer (not a check of the episode's text, not its total reward), tool-use statistics are reported,
and cached episodes come back with their records."""

from __future__ import annotations

import json
import string

import pytest

from reasonrl.agents import StepResult
from reasonrl.commands.cli import main

# Every turn of the tiny random model ends at one of these (almost surely within 64 tokens), so that
# the episodes are not cut by the per-turn token limit.
STOPS = json.dumps(list(string.ascii_lowercase + string.digits))


class TwoTurns:
    """A tool turn (rewarded 0.5), then the final answer: "correct" when the problem's answer is 1."""

    def reset(self, problem):
        self.problem, self.turns = problem, 0
        return problem.prompt

    def step(self, action: str) -> StepResult:
        self.turns += 1
        if self.turns == 1:
            return StepResult("42", 0.5, False, {"tool_call": "valid"})
        correct = float(self.problem.answer == "1")
        return StepResult("", correct, True, {"tool_call": "none", "correct": correct})


def make_environment() -> TwoTurns:
    return TwoTurns()


@pytest.fixture
def agent_config(tmp_path):
    rows = [{"question": f"q{i}", "answer": answer} for i, answer in enumerate(["1", "0", "1"])]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[task]
name = "jsonl"
train_path = "{data}"
test_path = "{data}"
prompt_template = "{{prompt}}"

[agent]
environment = "{__name__}:make_environment"
max_turns = 3
max_episode_tokens = 256

[rollout]
stop = {STOPS}
""")
    return config


def run_eval(model_dir, out, *extra):
    return main(["eval", str(model_dir), "--n", "2", "--k", "1,2", "--max-new-tokens", "64", "--temperature", "1.0",
                 "--out", str(out), "--no-progress", *extra])


def test_eval_plays_and_scores_episodes_of_an_agent_config(tiny_model_dir, tmp_path, agent_config):
    out = tmp_path / "eval"
    assert run_eval(tiny_model_dir, out, "--config", str(agent_config)) == 0
    metrics = json.loads((out / "results.json").read_text())["tasks"]["qa"]
    assert metrics["problems"] == 3
    # Two of the three problems are answered "correctly" by every episode; the tool turn's 0.5 reward
    # makes every episode's total positive, and the random text holds no right answer: accuracy is
    # neither of those.
    for name in ("pass@1", "pass@2", "mean@1", "mean@2"):
        assert metrics[name]["value"] == pytest.approx(2 / 3), name
    assert metrics["components"]["tool/turns"] == pytest.approx(2.0)  # a tool turn, then the answer
    assert metrics["components"]["tool/valid"] == pytest.approx(0.5)  # one valid call per two turns
    assert metrics["components"]["episode"] == pytest.approx(0.5 + 2 / 3)
    assert metrics["truncated_frac"] == 0.0
    cached = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    episode = cached[0]["completions"][0]
    assert len(episode["episode"]["turns"]) == 2 and 0 in episode["loss_mask"]  # the observation is inserted
    assert metrics["length_mean"] == pytest.approx(
        sum(sum(c["loss_mask"]) for r in cached for c in r["completions"]) / 6)  # the model's tokens only
    assert "qa, per completion: episode" in (out / "results.md").read_text()

    # Again: the episodes come from the cache with their records, and score the same.
    before = (out / "completions.jsonl").read_text()
    assert run_eval(tiny_model_dir, out, "--config", str(agent_config), "--k", "1") == 0
    assert (out / "completions.jsonl").read_text() == before
    again = json.loads((out / "results.json").read_text())["tasks"]["qa"]
    assert again["pass@1"] == metrics["pass@1"]

    # The same problems without the agent are other completions (a separate cache entry), checked as text.
    data = json.loads(agent_config.read_text().split("train_path = ")[1].split("\n")[0])
    assert run_eval(tiny_model_dir, out, "--task", data) == 0
    assert len((out / "completions.jsonl").read_text().splitlines()) == 6
    plain = json.loads((out / "results.json").read_text())["tasks"]["qa"]
    assert plain["pass@1"]["value"] < 2 / 3 and "components" not in plain


@pytest.mark.parametrize(("extra", "message"), [
    (("--engine", "openai", "--url", "http://127.0.0.1:9/v1"), ("agent config (agent.environment) is evaluated with "
                                                                  "--engine hf")),
    (("--set", "agent.max_turns"), "--set takes section.key=value"),
    (("--set", "agent.max_turn=2"), "agent.max_turn"),
])
def test_bad_agent_arguments_are_named(tiny_model_dir, tmp_path, agent_config, capsys, extra, message):
    assert run_eval(tiny_model_dir, tmp_path / "eval", "--config", str(agent_config), *extra) == 2
    assert message in capsys.readouterr().err


def test_eval_needs_a_task_or_a_config(tiny_model_dir, tmp_path, capsys):
    assert run_eval(tiny_model_dir, tmp_path / "eval") == 2
    assert "name the tasks to evaluate with --task" in capsys.readouterr().err
