"""verifiers environments (task.name=verifiers), defined here: an arithmetic taskset whose tasks
score a reply with two weighted rewards and a metric. Its tasks become problems (system prompt, then
prompt, the answer as gold, held-out split); an installed environment loads by its id as verifiers
loads one, with its config from task.env_args; each reward is a component with its weight, equal to
what verifiers' own scoring gives; what a single reply cannot score is refused; and training on it
learns (and a flipped sign does not). An environment with its own harness (two turns and a
calculator tool between them) plays its episodes itself through the endpoint: its calls are
trained, the tool's answer masked, with the engine's log-probs; one that breaks loses its episode."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

vf = pytest.importorskip("verifiers.v1")

from reasonrl import load_config, train
from reasonrl.build import build_task, build_weighted_reward
from reasonrl.tasks.verifiers_env import load_tasks, load_taskset, trace_of
from reasonrl.types import Completion


class SumData(vf.TaskData):
    answer: int
    numbers: list[int]


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.reward(weight=0.5)
    async def digits(self, trace: vf.Trace) -> float:
        """The share of the reply's characters that are digits (a tiny model can learn to write them)."""
        reply = trace.last_reply
        return sum(ch.isdigit() for ch in reply) / len(reply) if reply else 0.0

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 40


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            a, b = 3 * i % 17, 5 * i % 13
            data = SumData(prompt=f"What is {a} + {b}?", system_prompt="Answer with the number only.",
                           answer=a + b, numbers=[a, b])
            yield SumTask(data, self.config.task)


def sums(num_tasks: int = 40) -> vf.Taskset:
    """task.env's factory."""
    return SumTaskset(SumConfig(num_tasks=num_tasks))


def env_config(*extra: str):
    return load_config(overrides=["task.name=verifiers", f"task.env={__name__}:sums", "task.test_size=4", *extra])


def test_its_tasks_are_the_problems(tmp_path):
    task = build_task(env_config('task.env_args={"num_tasks": 10}'))
    assert (len(task.train), len(task.test)) == (6, 4)
    first = task.train[0]
    assert first.prompt == [{"role": "system", "content": "Answer with the number only."},
                            {"role": "user", "content": "What is 0 + 0?"}]
    assert (first.id, first.answer, first.metadata) == ("0", "0", {"answer": 0, "numbers": [0, 0]})
    assert task.test[-1].prompt[1]["content"] == "What is 10 + 6?" and task.test[-1].answer == "16"
    with pytest.raises(ValueError, match="has 3 tasks: too few to hold out task.test_size=4"):
        build_task(env_config('task.env_args={"num_tasks": 3}'))


def test_an_installed_environment_loads_by_its_id(tmp_path, monkeypatch):
    package = tmp_path / "sums_v1"
    package.mkdir()
    (package / "__init__.py").write_text(f"from {__name__} import SumTaskset\n\n__all__ = ['SumTaskset']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    task = build_task(load_config(overrides=["task.name=verifiers", "task.env=sums-v1", "task.test_size=2",
                                             'task.env_args={"taskset": {"num_tasks": 7}}']))
    assert (len(task.train), len(task.test)) == (5, 2)
    assert sys.modules["sums_v1"].SumTaskset is SumTaskset


def completion(text: str) -> Completion:
    return Completion(token_ids=(1,), text=text, logprobs=(0.0,), finish_reason="stop")


def test_each_reward_is_a_component_with_its_weight_as_verifiers_scores_it():
    cfg = env_config()
    reward, problem = build_weighted_reward(cfg), build_task(cfg).train[3]  # What is 9 + 2?
    assert reward.weights == {"correct": 1.0, "digits": 0.5, "metric/length": 0.0}
    replies = ["11", "1 1", "eleven"]
    scores = reward.score_group(problem, [completion(text) for text in replies])
    assert scores.components == {"correct": (1.0, 0.0, 0.0), "digits": (1.0, 2 / 3, 0.0),
                                 "metric/length": (2.0, 3.0, 6.0)}
    assert scores.totals == (1.5, 1 / 3, 0.0)
    task = load_tasks(cfg.task.env, cfg.task.env_args, cfg.task.train_size + cfg.task.test_size)["3"]
    for text, total in zip(replies, scores.totals):  # verifiers' own scoring of the same trace
        trace = trace_of(task, text)
        import asyncio

        asyncio.run(task.score(trace))
        assert trace.reward == pytest.approx(total)


class ToolTaskset(SumTaskset):
    @classmethod
    def toolsets(cls, config):
        return [object()]


class RuntimeTask(SumTask):
    @vf.reward
    async def ran(self, trace: vf.Trace, runtime) -> float:
        return 1.0


class RuntimeTaskset(vf.Taskset[RuntimeTask, SumConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield RuntimeTask(task.data, self.config.task)


class KeyedTask(SumTask):
    @vf.reward
    async def both(self, trace: vf.Trace) -> dict[str, float]:
        return {"a": 1.0, "b": 0.0}


class KeyedTaskset(vf.Taskset[KeyedTask, SumConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield KeyedTask(task.data, self.config.task)


class StallingJudgeTask(SumTask):
    @vf.reward(weight=1.0)
    async def judged(self, trace: vf.Trace) -> float:
        if trace.last_reply == "stall":  # as a judge model that never answers
            await asyncio.sleep(60)
        if trace.last_reply == "swallow":  # scoring that takes its cancellation for something else and goes on
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return 1.0
        if trace.last_reply == "thread":  # a blocking call handed to a thread, which cannot be cancelled
            await asyncio.to_thread(time.sleep, 8)
        return 1.0


class StallingJudgeTaskset(vf.Taskset[StallingJudgeTask, SumConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield StallingJudgeTask(task.data, self.config.task)


class BoxedTask(SumTask):
    @vf.reward(weight=1.0)
    async def boxed(self, trace: vf.Trace) -> float:
        return vf.verify_boxed_math_answer(trace.last_reply, str(self.data.answer))


class BoxedTaskset(vf.Taskset[BoxedTask, SumConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield BoxedTask(task.data, self.config.task)


def boxed() -> vf.Taskset:
    return BoxedTaskset(SumConfig())


def test_math_verify_scores_answers_off_the_main_thread_too():
    """verifiers' verify_boxed_math_answer asks math-verify for its SIGALRM timer, which raises off the
    main thread (asynchronous rollouts score there): every answer would score 0."""
    import threading

    cfg = env_config(f"task.env={__name__}:boxed")
    reward, problem = build_weighted_reward(cfg), build_task(cfg).train[3]  # What is 9 + 2?
    def replies(where: str) -> list[Completion]:  # each its own texts: scores are kept for the last texts scored
        return [completion(f"{where}: \\boxed{{11}}"), completion(f"{where}: \\boxed{{12}}"),
                completion(f"{where}: \\boxed{{\\frac{{22}}{{2}}}}")]

    scored = {"main": reward.score_group(problem, replies("main")).components["boxed"]}
    worker = threading.Thread(target=lambda: scored.update(
        thread=reward.score_group(problem, replies("thread")).components["boxed"]))
    worker.start()
    worker.join()
    assert scored == {"main": (1.0, 0.0, 1.0), "thread": (1.0, 0.0, 1.0)}


def stalling_judge() -> vf.Taskset:
    return StallingJudgeTaskset(SumConfig())


def tools() -> vf.Taskset:
    return ToolTaskset(SumConfig())


def with_runtime() -> vf.Taskset:
    return RuntimeTaskset(SumConfig())


def keyed() -> vf.Taskset:
    return KeyedTaskset(SumConfig())


def test_scoring_that_does_not_finish_in_time_scores_zero_and_is_counted(monkeypatch):
    from reasonrl.tasks import verifiers_env

    monkeypatch.setattr(verifiers_env, "SCORE_TIMEOUT_S", 0.5)
    cfg = env_config(f"task.env={__name__}:stalling_judge")
    reward, problem = build_weighted_reward(cfg), build_task(cfg).train[3]  # What is 9 + 2?
    started = time.monotonic()
    scores = reward.score_group(problem, [completion(text) for text in ["11", "stall", "12", "swallow", "thread"]])
    assert time.monotonic() - started < 0.5 + 4.0  # unbounded: the 60 s the judge takes, or the thread's 8 s
    assert scores.components["judged"] == (1.0, 0.0, 1.0, 0.0, 0.0)
    assert scores.components["correct"] == (1.0, 0.0, 0.0, 0.0, 0.0)  # all of a stopped reply's rewards are 0
    assert scores.timeouts == 3


class BlockingTask(SumTask):
    @vf.reward(weight=1.0)
    async def blocking(self, trace: vf.Trace) -> float:
        if trace.last_reply == "block":
            time.sleep(1.7)  # noqa: ASYNC251 (computes without awaiting: the bound cannot act until the next await)
        return 1.0


class BlockingTaskset(vf.Taskset[BlockingTask, SumConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield BlockingTask(task.data, self.config.task)


def blocking() -> vf.Taskset:
    return BlockingTaskset(SumConfig())


def test_scoring_that_holds_the_event_loop_past_the_bound_is_warned_about(monkeypatch, caplog):
    from reasonrl.tasks import verifiers_env

    monkeypatch.setattr(verifiers_env, "SCORE_TIMEOUT_S", 0.5)
    cfg = env_config(f"task.env={__name__}:blocking")
    reward, problem = build_weighted_reward(cfg), build_task(cfg).train[3]
    quick = reward.score_group(problem, [completion("11"), completion("12")])
    assert quick.components["blocking"] == (1.0, 1.0) and not caplog.records
    held = reward.score_group(problem, [completion("11"), completion("block")])
    # The bound acts at the next await, on every reply whose deadline passed meanwhile: the held one's neighbour too.
    assert held.components["blocking"] == (0.0, 0.0) and held.timeouts == 2
    [warning] = [r.getMessage() for r in caplog.records if r.name == "reasonrl.tasks.verifiers_env"]
    assert "scoring 2 replies took" in warning and "held the event loop" in warning and "asyncio.to_thread" in warning


def test_a_thread_that_scoring_left_behind_holds_neither_the_step_nor_the_exit():
    script = """
import asyncio, time
from reasonrl.tasks.verifiers_env import _run_without_waiting_for_threads

async def score():
    try:
        async with asyncio.timeout(0.2):
            await asyncio.to_thread(time.sleep, 600)  # a judge's blocking call that never returns
    except TimeoutError:
        return "stopped"

print(_run_without_waiting_for_threads(score()), flush=True)
"""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False)
    assert done.stdout.strip() == "stopped", done.stderr
    assert time.monotonic() - started < 60  # asyncio.run, or threads joined at exit: 600 s


def test_what_a_single_reply_cannot_play_is_refused():
    with pytest.raises(ValueError, match="is a taskset with tools .toolsets., which a harness offers the model: return "
                                         "its vf.Env"):
        load_taskset(f"{__name__}:tools", "")
    with pytest.raises(ValueError, match="ran need the task's runtime"):
        build_weighted_reward(env_config(f"task.env={__name__}:with_runtime"))
    keyed_reward = build_weighted_reward(env_config(f"task.env={__name__}:keyed"))
    problem = build_task(env_config()).train[0]
    with pytest.raises(RuntimeError, match="gave a, b, which its task does not declare"):
        keyed_reward.score_group(problem, [completion("0")])
    with pytest.raises(TypeError, match="gave a int: expected a verifiers Env or Taskset"):
        load_taskset("builtins:int", "")


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "reward/mean" in line]


def negated_grpo(rewards_BG: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    from reasonrl.algo.advantages import grpo

    return -grpo(rewards_BG, eps=eps)


def test_training_on_a_verifiers_environment_learns_and_a_flipped_sign_does_not(tiny_model_dir, tmp_path):
    settings = ["task.name=verifiers", f"task.env={__name__}:sums", "task.test_size=4", "rollout.max_new_tokens=4",
                "train.steps=12", "run.log_every=0"]
    train(tiny_config(tiny_model_dir, tmp_path / "up", *settings))
    up = metrics(tmp_path / "up")
    digits = [m["reward/digits"] for m in up]
    assert sum(digits[-3:]) / 3 > sum(digits[:3]) / 3 + 0.3, digits
    for m in up:  # the logged total is the components weighed as the task weighs them
        assert m["reward/mean"] == pytest.approx(m["reward/correct"] + 0.5 * m["reward/digits"], abs=1e-6)
    assert all("reward/metric/length" in m for m in up)
    train(tiny_config(tiny_model_dir, tmp_path / "down", *settings, f"algo.advantage={__name__}:negated_grpo"))
    down = [m["reward/digits"] for m in metrics(tmp_path / "down")]
    assert sum(down[-3:]) / 3 <= sum(digits[:3]) / 3 + 0.05, down


# ---------------------------------------------------------------------------- played by verifiers

class CalcHarness(vf.Harness[vf.HarnessConfig]):
    """A harness of two model turns, run in-process (verifiers allows it: every call goes through its
    interception): after the first reply it calls a calculator tool on the task's numbers and gives
    the model the result, which it answers again. A task whose first number is 7 breaks it."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        for turn in range(2):
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
            if turn == 0:
                a, b = data.numbers
                if a == 7:
                    raise RuntimeError("the calculator is out of order")
                messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                             {"role": "user", "content": f"calculator: {a} + {b} = {a + b}"}]
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class CalcTaskset(SumTaskset):
    pass


LOCAL = '{"agent": {"runtime": {"type": "subprocess"}}, "taskset": {"num_tasks": 20}}'


@pytest.fixture
def calc_v1(tmp_path, monkeypatch):
    """An installed environment that brings its own harness: verifiers plays its episodes."""
    package = tmp_path / "calc_v1"
    package.mkdir()
    (package / "__init__.py").write_text(f"from {__name__} import CalcHarness, CalcTaskset\n\n"
                                         "__all__ = ['CalcTaskset', 'CalcHarness']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return "calc-v1"


def test_an_environment_with_its_own_harness_plays_its_episodes_through_the_endpoint(calc_v1, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.agents.openai_agents import OpenAIAgentEngine
    from reasonrl.build import build_environment_engine
    from reasonrl.rollout import HFEngine
    from reasonrl.tasks.verifiers_env import plays_itself
    from reasonrl.training.learner import make_train_batch
    from reasonrl.training.token_stats import token_logprobs
    from reasonrl.types import SamplingParams

    cfg = load_config(overrides=["task.name=verifiers", f"task.env={calc_v1}", f"task.env_args={LOCAL}",
                                 "task.test_size=2", f"model.name={tiny_model_dir}"])
    assert plays_itself(cfg.task.env, cfg.task.env_args) and not plays_itself(f"{__name__}:sums", "")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    episodes = build_environment_engine(cfg, HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir)))
    assert isinstance(episodes, OpenAIAgentEngine)
    try:
        problems = build_task(cfg).train[1:3]  # the first numbers 3 and 6 (7 breaks the harness)
        groups = episodes.generate(problems, SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=5))
        reward = build_weighted_reward(cfg)
        for group in groups:
            assert group.failures == ()
            scored = reward.score_group(group.problem, group.completions)
            assert scored.components["episode"] == tuple(c.reward for c in group.completions)
        samples = [c for g in groups for c in g.completions]
        # Each episode's second call holds the calculator's answer after the first reply: in its tokens, out of its
        # loss (a call whose prompt does not extend the last one's tokens is a sample of its own).
        for group in groups:
            for episode in range(2):
                assert any(c.episode == episode and "calculator: " in c.text and 0 in c.loss_mask
                           for c in group.completions)
        batch = make_train_batch(groups, [0.0] * len(samples), episodes.pad_id)
        with torch.no_grad():
            logp_NT, _ = token_logprobs(model, batch, 1.0)
        mask = batch.loss_mask_NT.bool()
        torch.testing.assert_close(logp_NT[mask], batch.sampling_logp_NT[mask], atol=1e-4, rtol=1e-4)
        broken = episodes.generate([build_task(cfg).train[8], problems[0]], SamplingParams(n=2, max_new_tokens=4))
        assert [len(g.completions) for g in broken] == [0, 2]  # task 8: 7 + 1
        assert all("the calculator is out of order" in failure for failure in broken[0].failures)
    finally:
        episodes.close()


def test_training_on_an_environment_that_plays_its_own_episodes(calc_v1, tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path, "task.name=verifiers", f"task.env={calc_v1}",
                      f"task.env_args={LOCAL}", "task.test_size=2", "rollout.max_new_tokens=4", "train.steps=3",
                      "run.log_every=0", "run.sync_check=false"))
    rows = metrics(tmp_path)
    assert len(rows) == 3 and all("reward/episode" in m and "env/failed" in m for m in rows)
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sum(m["env/failed"] for m in rows) == sum(1 for r in rollouts if r.get("error"))
    assert sum(m["env/failed"] for m in rows) > 0  # the broken problem (task 8) was drawn: failures are counted
    for m in rows:  # the logged episode reward is the mean of the step's scored samples' rewards
        played = [r["components"]["episode"] for r in rollouts if r["step"] == m["step"] and not r.get("error")]
        assert played and m["reward/episode"] == pytest.approx(sum(played) / len(played))


@pytest.mark.parametrize("settings", [["task.on_error=stop"], ["task.on_error=stop", "task.agent_timeout_s=9"]])
def test_episode_settings_on_a_single_turn_environment_are_refused_by_name(tiny_model_dir, settings):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.build import build_environment_engine
    from reasonrl.config import ConfigError
    from reasonrl.rollout import HFEngine

    cfg = load_config(overrides=["task.name=verifiers", f"task.env={__name__}:sums", f"model.name={tiny_model_dir}",
                                 *settings])
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir))
    named = ", ".join(setting.split("=")[0] for setting in settings)
    with pytest.raises(ConfigError, match=rf"^{named}: no effect, .* remove {'them' if len(settings) > 1 else 'it'}$"):
        build_environment_engine(cfg, engine)
