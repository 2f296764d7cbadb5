"""verifiers environments (Prime Intellect's `verifiers`, `import verifiers.v1`; `pip install
-e '.[verifiers]'` in the checkout) as a task: task.name=verifiers (docs/environments.md).

task.env names the environment: the id of an installed one, loaded as verifiers loads it
(`vf.load_environment` of the `[env]` config whose taskset has that id; task.env_args is the rest of
that config, e.g. {"taskset": {"num_tasks": 100}}), or 'package.module:factory' (also
'path/to/file.py:factory'), called with task.env_args as keyword arguments, returning a `vf.Env` or
a `vf.Taskset`. It is loaded once per process (the task, the reward and the engine share it).

- Problems: the taskset's tasks, in its order, each a chat: its system prompt, then its prompt (a
  text as the user message, or its messages). The task data's `answer`, if it has one, is the gold
  answer; its own other fields are the problem's metadata. The first task.train_size +
  task.test_size tasks are read; a v1 taskset has no split: the last task.test_size are held out.
- Single-turn (a bare taskset, or the single-agent environment without a harness or tools of its
  own): an episode is one reply to the prompt, sampled by the engine. The reward is the task's own
  scoring (`Task.score`: its @vf.reward functions and its judges, each with its weight) on a trace
  of the prompt and the reply; each is a component, logged as reward/<name>, summed with its
  weight; its @vf.metric values are logged beside them at weight 0 (reward/metric/<name>). A
  reward that needs the task's runtime (a sandbox) is refused. Scoring a reply that takes longer
  than `SCORE_TIMEOUT_S` (a judge that does not answer) is cancelled: each of its rewards scores 0,
  counted in reward/timeouts. The bound acts where scoring awaits (verifiers' reward functions are
  coroutines; a blocking call handed to a thread is left running there, not waited for). One that
  computes without awaiting holds the event loop the bounds run on: they act at the next await, on
  every reply of the group whose deadline passed meanwhile (its neighbours' too: the clock cannot tell
  which one overran), and not at all when none follows. A group whose scoring took past the bound is
  warned about, with the way out (`asyncio.to_thread`).
- math-verify's own time limit (a SIGALRM timer, which verifiers' `verify_boxed_math_answer` asks for)
  raises off the main thread, where asynchronous rollouts score, and verifiers scores that as a wrong
  answer: every answer would score 0. Once an environment is loaded, math-verify off the main thread
  keeps its time limit by waiting, not by a signal (`rewards.math_verify_threads`): answers score as
  on the main thread, and a check past its limit ends as math-verify's timeout, counted.
- Any other environment (its own harness, tools, several agents) plays its episodes itself, the
  policy answering through the endpoint: reasonrl.agents.verifiers_episodes.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from reasonrl.registry import import_object, is_import_path, json_arguments
from reasonrl.rewards.bounded import count_stopped
from reasonrl.rewards.math_verify_threads import bound_off_the_main_thread
from reasonrl.tasks.base import Task
from reasonrl.types import Completion, Message, Problem

logger = logging.getLogger(__name__)

METRIC_PREFIX = "metric/"
SCORE_TIMEOUT_S = 60.0
"""Seconds a task's scoring of one reply may take (its judges call a model: a hung one would stall the step)."""
HELD_LOOP_SLACK_S = 1.0
"""Scoring stopped at its bound ends within this of it; a group that takes longer had its event loop held."""


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError("task.name=verifiers needs the verifiers package: pip install -e '.[verifiers]' in the "
                          "reasonrl checkout (or pip install 'verifiers>=0.4,<0.5')") from exc
    return vf


@functools.lru_cache(maxsize=4)
def load_environment(env: str, env_args: str) -> tuple[Any, Any]:
    """The environment task.env names (module docstring): its `vf.Env` (None when the factory gave a
    bare taskset) and its taskset."""
    vf, arguments = _vf(), json_arguments(env_args, "task.env_args")
    if is_import_path(env):
        loaded = import_object(env)(**arguments)
    else:
        taskset = arguments.get("taskset", {})
        if not isinstance(taskset, dict):
            raise TypeError(f"task.env_args: 'taskset' must be an object of the taskset's settings, got {taskset!r}")
        loaded = vf.load_environment(vf.resolve_env_config({**arguments, "taskset": {**taskset, "id": env}}))
    bound_off_the_main_thread()
    if isinstance(loaded, vf.Env):
        return loaded, loaded.taskset
    if not isinstance(loaded, vf.Taskset):
        raise TypeError(f"task.env={env!r} gave a {type(loaded).__name__}: expected a verifiers Env or Taskset")
    if _has_tools(loaded):
        raise ValueError(f"task.env={env!r} is a taskset with tools (toolsets), which a harness offers the model: "
                         "return its vf.Env from the factory (or give the environment's id)")
    return None, loaded


def load_taskset(env: str, env_args: str) -> Any:
    return load_environment(env, env_args)[1]


def plays_itself(env: str, env_args: str) -> bool:
    """Whether verifiers plays the environment's episodes (its harness, tools or agents), the policy
    answering through the endpoint; else each is a single reply to the prompt, which reasonrl samples.
    A bare taskset, or the single-agent environment with verifiers' default harness (bash, whose tools
    a task without toolsets does not need), is single-turn."""
    loaded, taskset = load_environment(env, env_args)
    if loaded is None:
        return False
    vf = _vf()
    own_harness = loaded.config.agent_harnesses() != {"agent": vf.default_agent_harness("")}
    return type(loaded) is not vf.SingleAgentEnv or own_harness or _has_tools(taskset)


def _has_tools(taskset: Any) -> bool:
    return bool(type(taskset).toolsets(taskset.config) or type(taskset).task_type().toolsets(taskset.config.task))


@functools.lru_cache(maxsize=4)
def load_tasks(env: str, env_args: str, count: int) -> dict[str, Any]:
    """The first `count` tasks of task.env's taskset (at most), by the id of their problem."""
    tasks = {}
    for task in load_taskset(env, env_args).take(count):
        key = problem_of(task).id
        if key in tasks:
            raise ValueError(f"task.env={env!r}: two tasks have the id {key!r}; give each a distinct TaskData.id "
                             "(or none: its position is its id)")
        tasks[key] = task
    return tasks


def verifiers_task(*, env: str, env_args: str, train_size: int, test_size: int) -> Task:
    """The environment's tasks (at most train_size + test_size) as problems, the last `test_size` held out."""
    problems = [problem_of(task) for task in load_tasks(env, env_args, train_size + test_size).values()]
    if len(problems) <= test_size:
        raise ValueError(f"task.env={env!r} has {len(problems)} tasks: too few to hold out task.test_size={test_size} "
                         "and train on the rest")
    return Task(name=f"verifiers:{env}", train=problems[:len(problems) - test_size],
                test=problems[len(problems) - test_size:])


def problem_of(task: Any) -> Problem:
    """A verifiers task as a Problem: its chat, its `answer`, its own fields as metadata."""
    vf, data = _vf(), task.data
    where = f"verifiers task {data.id or data.idx}"
    messages: list[Message] = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        messages.extend(_message(message, where) for message in data.prompt)
    else:
        raise ValueError(f"{where} has no prompt (the user opens the conversation): reasonrl needs a prompt to answer")
    own = set(type(data).model_fields) - set(vf.TaskData.model_fields)
    fields = data.model_dump(mode="json", include=own)
    answer = fields.get("answer")
    return Problem(id=str(data.id if data.id is not None else data.idx), prompt=messages,
                   answer="" if answer is None else str(answer), metadata=fields)


def _message(message: Any, where: str) -> Message:
    vf = _vf()
    if isinstance(message, vf.ToolMessage) or getattr(message, "tool_calls", None):
        raise ValueError(f"{where}: its prompt holds tool calls, which a single-turn episode cannot replay")
    if not isinstance(message.content, str) and any(not isinstance(part, vf.TextContentPart)
                                                    for part in message.content or []):
        raise ValueError(f"{where}: its prompt holds images; reasonrl trains on text")
    from verifiers.v1.types import content_text

    return {"role": message.role, "content": content_text(message.content)}


class TaskScores:
    """Each task's own scoring (`Task.score`) of a group's replies, done once per group and read by
    one `Signal` per reward, judge and metric (their names: `signals`)."""

    def __init__(self, tasks: Mapping[str, Any]):
        self.tasks = tasks
        first = next(iter(tasks.values()))
        self.rewards = {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in first.hooks("reward")}
        self.rewards |= {judge.reward_name: float(judge.config.weight) for judge in first.plugged_judges()}
        self.metrics = [fn.__name__ for fn in first.hooks("metric")]
        needs_runtime = [fn.__name__ for fn in (*first.hooks("reward"), *first.hooks("metric"))
                         if _needs_runtime(fn)] + [j.reward_name for j in first.plugged_judges() if _needs_runtime(j.score)]
        if needs_runtime:
            raise ValueError(f"the verifiers task's {', '.join(needs_runtime)} need the task's runtime (a sandbox its "
                             "harness runs in), which single-turn episodes do not have")
        self.lock = threading.Lock()
        self.last: tuple[tuple[str, tuple[str, ...]], list[dict[str, float]]] | None = None

    @property
    def signals(self) -> dict[str, float]:
        """Each component's name and weight: the rewards and judges, then the metrics at weight 0."""
        return self.rewards | {METRIC_PREFIX + name: 0.0 for name in self.metrics}

    def scores(self, problem: Problem, completions: Sequence[Completion]) -> list[dict[str, float]]:
        key = (problem.id, tuple(c.text for c in completions))
        with self.lock:
            if self.last is not None and self.last[0] == key:
                return self.last[1]
        task = self.tasks[problem.id]
        traces = [trace_of(task, c.text) for c in completions]

        async def score_all() -> list[bool]:
            return await asyncio.gather(*(_scored_within(task, trace) for trace in traces))

        started = time.monotonic()
        finished = _run_without_waiting_for_threads(score_all())
        if (took := time.monotonic() - started) > SCORE_TIMEOUT_S + HELD_LOOP_SLACK_S:
            logger.warning("verifiers task %r: scoring %d replies took %.1f s, past the %g s bound: a reward or "
                           "metric computed without awaiting and held the event loop the bound runs on (or caught "
                           "its cancellation and went on), so the bound could not stop it in time, and replies scored "
                           "beside it may have been stopped with it (reward/timeouts). Hand blocking work to "
                           "asyncio.to_thread", problem.id, len(traces), took, SCORE_TIMEOUT_S)
        scores = [self._read(problem, trace) if done else self._stopped(problem, trace)
                  for trace, done in zip(traces, finished)]
        with self.lock:
            self.last = (key, scores)
        return scores

    def _stopped(self, problem: Problem, trace: Any) -> dict[str, float]:
        count_stopped(f"verifiers task {problem.id!r}: scoring the reply {trace.last_reply[:200]!r} exceeded "
                      f"{SCORE_TIMEOUT_S:g} s; each of its rewards scores 0")
        return dict.fromkeys(self.signals, 0.0)

    def _read(self, problem: Problem, trace: Any) -> dict[str, float]:
        found = {name: reward.score for name, reward in trace.rewards.items() if reward is not None}
        found |= {METRIC_PREFIX + name: value for name, value in trace.metrics.items() if value is not None}
        if extra := set(found) - set(self.signals):
            raise ValueError(f"scoring problem {problem.id!r} gave {', '.join(sorted(extra))}, which its task does not "
                             "declare (a reward returning keyed scores): declare each as its own @vf.reward")
        if missing := set(self.signals) - set(found):
            raise ValueError(f"scoring problem {problem.id!r} left {', '.join(sorted(missing))} unscored")
        return found


async def _scored_within(task: Any, trace: Any) -> bool:
    """Whether the task's scoring of `trace` finished within `SCORE_TIMEOUT_S` (else it was cancelled). Told by the
    clock, not by an exception: scoring that swallows its cancellation returns as if it had finished."""
    try:
        async with asyncio.timeout(SCORE_TIMEOUT_S) as bound:
            await task.score(trace)
    except TimeoutError:
        return False
    return not bound.expired()


class _DaemonThreads(ThreadPoolExecutor):
    """A loop's default executor that runs each call on a daemon thread of its own: a call that never returns holds
    neither the step (nothing waits for it) nor the interpreter's exit (which waits for a ThreadPoolExecutor's)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 (handed to whoever awaits the call)
                    future.set_exception(exc)

        threading.Thread(target=run, daemon=True, name="verifiers-scoring").start()
        return future


def _run_without_waiting_for_threads(coroutine: Any) -> Any:
    """`asyncio.run(coroutine)`, except that the loop's threads are not waited for: a reward that hands a blocking
    call to a thread (`asyncio.to_thread`) that never returns would hold `asyncio.run`, and then the interpreter's
    exit, for good. Such a thread stays behind (a thread cannot be stopped); the step goes on."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_DaemonThreads())
    try:
        return loop.run_until_complete(coroutine)
    finally:
        try:
            if pending := asyncio.all_tasks(loop):
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts its default executor down without waiting


class Signal:
    """One of a task's rewards, judges or metrics (`name`), as a reward component."""

    def __init__(self, scores: TaskScores, name: str):
        self.scores, self.name = scores, name

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        return [values[self.name] for values in self.scores.scores(problem, completions)]


def verifiers_components(*, env: str, env_args: str, count: int) -> dict[str, tuple[Signal, float]]:
    """The reward of task.env's tasks (the first `count`): one component per reward, judge and metric,
    with its weight."""
    scores = TaskScores(load_tasks(env, env_args, count))
    return {name: (Signal(scores, name), weight) for name, weight in scores.signals.items()}


def trace_of(task: Any, reply: str) -> Any:
    """The trace of a single-turn episode: the task's prompt, then `reply` as the sampled answer."""
    vf, data = _vf(), task.data
    messages = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    messages += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
    nodes = [vf.MessageNode(parent=i - 1 if i else None, message=m) for i, m in enumerate(messages)]
    nodes.append(vf.MessageNode(parent=len(nodes) - 1, message=vf.AssistantMessage(content=reply), sampled=True))
    return vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
                    agent=vf.AgentInfo(config=vf.AgentConfig(), name="reasonrl"), nodes=nodes)


def _needs_runtime(fn: Any) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty
