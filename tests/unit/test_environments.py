"""Environments: a user-written environment, reasoning-gym adapters scoring their own answers,
mixtures by weight, the routing reward, determinism by seed and disjoint train/test splits."""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from reasonrl.seeds import derive_seed31
from reasonrl.tasks.base import DatasetError
from reasonrl.tasks.environments import (
    EnvironmentReward,
    MixtureEnvironment,
    ProblemGenerator,
    ReasoningGymEnvironment,
    environment_from_spec,
    environment_task,
    extract_final_answer,
    make_environment,
    make_mixture,
)
from reasonrl.types import Problem


@dataclass(frozen=True)
class AddTwo:
    """A user environment in a few lines: add two numbers below `high`."""

    name: str = "add_two"
    high: int = 100

    def generate(self, seed: int, index: int) -> Problem:
        rng = random.Random(f"{seed}-{index}")
        a, b = rng.randrange(self.high), rng.randrange(self.high)
        return Problem(id=f"add-{seed}-{index}", prompt=f"{a} + {b} = ?", answer=str(a + b))

    def score(self, completion: str, problem: Problem) -> float:
        return float(completion.strip() == problem.answer)


def prompts(problems) -> list:
    return [p.prompt for p in problems]


# --------------------------------------------------------------------------- user environment


def test_user_environment_task():
    env = AddTwo()
    assert isinstance(env, ProblemGenerator)
    task = environment_task(env, train_size=200, test_size=50, seed=0, prompt_template="Q: {prompt}")
    assert (task.name, len(task.train), len(task.test)) == ("add_two", 200, 50)
    for problem in [*task.train, *task.test]:
        a, b = map(int, re.fullmatch(r"Q: (\d+) \+ (\d+) = \?", problem.prompt).groups())
        assert problem.answer == str(a + b) and problem.metadata["source"] == "add_two"
        assert env.score(problem.answer, problem) == 1.0 and env.score("-1", problem) == 0.0
    assert not set(prompts(task.train)) & set(prompts(task.test))
    ids = [p.id for p in [*task.train, *task.test]]
    assert len(set(ids)) == len(ids)
    first = env.generate(derive_seed31(0, "test"), 0)  # test problem 0 is problem 0 of the test stream, templated
    assert (task.test[0].id, task.test[0].prompt) == (first.id, f"Q: {first.prompt}")


def test_train_skips_test_prompts_and_is_deterministic():
    env = AddTwo(high=4)  # 16 distinct problems: many train draws repeat a test prompt and are skipped
    task = environment_task(env, train_size=100, test_size=5, seed=3)
    assert not set(prompts(task.train)) & set(prompts(task.test))
    assert environment_task(env, train_size=100, test_size=5, seed=3) == task
    other = environment_task(AddTwo(), train_size=20, test_size=5, seed=4)
    assert prompts(other.train) != prompts(environment_task(AddTwo(), train_size=20, test_size=5, seed=3).train)
    assert derive_seed31(3, "train") != derive_seed31(3, "test")


def test_too_few_distinct_problems():
    env = AddTwo(high=1)  # one problem only: "0 + 0 = ?"
    with pytest.raises(DatasetError, match=r"'add_two': only 0 train problems in 50 draws .* too few distinct"):
        environment_task(env, train_size=1, test_size=1, max_attempts=50)


def test_generate_must_return_a_problem():
    @dataclass(frozen=True)
    class Broken(AddTwo):
        def generate(self, seed, index):
            return {"prompt": "x"}

    with pytest.raises(TypeError, match=r"'add_two': generate\(\) returned dict, not a Problem"):
        environment_task(Broken(), train_size=1, test_size=1)


# --------------------------------------------------------------------------- answer extraction


@pytest.mark.parametrize("text, answer", [
    ("think... <answer> 42 </answer> and \\boxed{7}", "42"),  # an answer tag wins
    ("so \\boxed{1} then \\boxed{\\frac{1}{2}}\nbye", "\\frac{1}{2}"),  # else the last box
    ("4 * 6 = 24\n\nThe final answer is 24.", "24"),  # else a stated answer
    ("So the answer is **Zoey is a knight**.\nDone", "Zoey is a knight"),
    ("step 1\nstep 2\n  final: 9  \n\n", "final: 9"),  # else the last non-empty line
    ("  \n", None),
    ("<answer> </answer>\nso 5", None),  # an empty answer tag is no answer, not a cue to read the last line
])
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


# --------------------------------------------------------------------------- reasoning-gym

reasoning_gym = pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("dataset, config", [
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    ("countdown", {"min_numbers": 3, "max_numbers": 4}),
    ("knights_knaves", {"n_people": 2}),
    ("zebra_puzzles", {"num_people": 3, "num_characteristics": 3}),
])
def test_reasoning_gym_scores_its_own_answers(dataset, config):
    env = ReasoningGymEnvironment(dataset, **config)
    task = environment_task(env, train_size=6, test_size=4, seed=0)
    assert not set(prompts(task.train)) & set(prompts(task.test))
    for problem in [*task.train, *task.test]:
        assert problem.answer and problem.metadata["source"] == dataset
        assert problem.metadata["entry"]["question"] == problem.prompt
        assert env.score(f"Let me think.\n<answer>{problem.answer}</answer>", problem) == 1.0
        assert env.score(f"The result is \\boxed{{{problem.answer}}}", problem) == 1.0
        assert env.score("<answer>no idea</answer>", problem) < 1.0
        assert env.score("", problem) < 1.0


def test_a_reasoning_gym_score_that_runs_long_is_stopped_and_counted(monkeypatch):
    # countdown evaluates the answer with sympy: 9**9**8 ran past 20 s.
    import time

    from reasonrl.rewards.bounded import timeouts_on_this_thread
    from reasonrl.tasks import environments

    monkeypatch.setattr(environments, "SCORE_TIMEOUT_S", 0.5)
    env = ReasoningGymEnvironment("countdown", min_numbers=3, max_numbers=4)
    problem = environment_task(env, train_size=1, test_size=1, seed=0).test[0]
    before, started = timeouts_on_this_thread(), time.monotonic()
    assert env.score("<answer>9**9**8</answer>", problem) == 0.0
    assert time.monotonic() - started < 0.5 + 2.0
    assert timeouts_on_this_thread() == before + 1
    assert env.score(f"<answer>{problem.answer}</answer>", problem) == 1.0  # the bound leaves quick ones alone


def test_making_a_reasoning_gym_scorer_is_not_counted_against_the_bound(monkeypatch):
    # Some datasets take seconds to make (arc_agi loads the ARC set). Made inside the bound, every answer would
    # score 0 as a timeout, and the nonsense probe at construction would pass without the scorer ever running.
    from reasonrl.rewards.bounded import timeouts_on_this_thread
    from reasonrl.tasks import environments, reasoning_gym_scoring

    create = reasoning_gym.create_dataset

    def slow_create(*args, **kwargs):
        time.sleep(1.0)
        return create(*args, **kwargs)

    monkeypatch.setattr(reasoning_gym_scoring, "_scorers", {})
    monkeypatch.setattr(reasoning_gym, "create_dataset", slow_create)
    monkeypatch.setattr(environments, "SCORE_TIMEOUT_S", 0.5)
    before = timeouts_on_this_thread()
    env = ReasoningGymEnvironment("chain_sum")
    problem = env.generate(0, 0)
    assert env.score(f"<answer>{problem.answer}</answer>", problem) == 1.0
    assert timeouts_on_this_thread() == before


@pytest.mark.timeout(120)
def test_reasoning_gym_scoring_off_the_main_thread_is_bounded_too(monkeypatch):
    # An asynchronous run's producer thread scores: no signal reaches it, so the scorer runs in a worker process,
    # killed at the bound. Unbounded, 9**9**8 holds the thread past 20 s.
    import threading
    import time

    from reasonrl.rewards.bounded import shutdown_pools, timeouts_on_this_thread
    from reasonrl.tasks import environments

    countdown = ReasoningGymEnvironment("countdown", min_numbers=3, max_numbers=4)
    problem = environment_task(countdown, train_size=1, test_size=1, seed=0).test[0]
    factors = ReasoningGymEnvironment("prime_factorization")
    factored = factors.generate(0, 0)
    seen = {}

    def score_on_a_thread() -> None:
        seen["right"] = countdown.score(f"<answer>{problem.answer}</answer>", problem)  # starts the worker
        monkeypatch.setattr(environments, "SCORE_TIMEOUT_S", 0.5)
        before, started = timeouts_on_this_thread(), time.monotonic()
        seen["slow"] = countdown.score("<answer>9**9**8</answer>", problem)
        seen["slow_s"] = time.monotonic() - started
        seen["timeouts"] = timeouts_on_this_thread() - before
        monkeypatch.undo()
        seen["unparseable"] = factors.score("<answer>two times three</answer>", factored)
        seen["factored"] = factors.score(f"<answer>{factored.answer}</answer>", factored)

    try:
        thread = threading.Thread(target=score_on_a_thread, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "scoring on a thread other than the main one was not stopped"
    finally:
        shutdown_pools()
    assert seen.pop("slow_s") < 0.5 + 2.0
    assert seen == {"right": 1.0, "slow": 0.0, "timeouts": 1, "unparseable": 0.0, "factored": 1.0}


def test_reasoning_gym_difficulty_knobs_are_passed_through():
    env = ReasoningGymEnvironment("basic_arithmetic", min_terms=2, max_terms=2, min_digits=3, max_digits=3)
    numbers = []
    for index in range(10):
        problem = env.generate(7, index)
        entry = problem.metadata["entry"]["metadata"]
        assert (entry["num_terms"], entry["num_digits"]) == (2, 3)
        numbers += re.findall(r"\d+", problem.prompt)
    # reasoning-gym turns a few operands into divisors or small ones ("647 / 1"); nearly all have three digits
    assert sum(len(n) == 3 for n in numbers) >= 0.8 * len(numbers)
    one_digit = ReasoningGymEnvironment("basic_arithmetic", min_digits=1, max_digits=1).generate(7, 0)
    assert max(map(len, re.findall(r"\d+", one_digit.prompt))) == 1


def test_reasoning_gym_is_deterministic_by_seed():
    a = environment_task(ReasoningGymEnvironment("chain_sum"), train_size=10, test_size=5, seed=1)
    b = environment_task(ReasoningGymEnvironment("chain_sum"), train_size=10, test_size=5, seed=1)
    c = environment_task(ReasoningGymEnvironment("chain_sum"), train_size=10, test_size=5, seed=2)
    assert a == b
    assert prompts(a.train) != prompts(c.train) and prompts(a.test) != prompts(c.test)


def test_reasoning_gym_streams_read_as_one_endless_dataset():
    # chain_sum makes item i of a dataset seeded s from Random(s + i); the stream is read in chunks of 500 items,
    # item 501 of stream s being item 1 of a dataset seeded s + 500: the same problem as item 501 of one dataset
    env = ReasoningGymEnvironment("chain_sum")
    whole = reasoning_gym.create_dataset("chain_sum", seed=40, size=1000)
    assert [env.generate(40, i).prompt for i in (0, 499, 500, 501, 999)] == \
        [whole[i]["question"] for i in (0, 499, 500, 501, 999)]


def test_reasoning_gym_config_errors():
    with pytest.raises(DatasetError, match=r"reasoning-gym dataset 'basic_arithmetc'; did you mean basic_arithmetic"):
        ReasoningGymEnvironment("basic_arithmetc")
    with pytest.raises(DatasetError, match=r"'basic_arithmetic' has no setting digits; its settings: .*max_digits"):
        ReasoningGymEnvironment("basic_arithmetic", digits=2)
    with pytest.raises(DatasetError, match=r"'composite' dataset: mix datasets with MixtureEnvironment"):
        ReasoningGymEnvironment("composite")
    with pytest.raises(DatasetError, match=r"invalid settings"):
        ReasoningGymEnvironment("basic_arithmetic", min_digits=0)


def test_reasoning_gym_answer_its_scorer_cannot_parse_scores_zero():
    # prime_factorization's scorer calls int() on the answer's factors and raises on other text
    env = ReasoningGymEnvironment("prime_factorization")
    problem = env.generate(0, 0)
    assert env.score("<answer>two times three</answer>", problem) == 0.0
    assert env.score(f"<answer>{problem.answer}</answer>", problem) == 1.0


def test_reasoning_gym_broken_scorers(monkeypatch):
    chain_sum = type(reasoning_gym.create_dataset("chain_sum", size=1, seed=0))
    monkeypatch.setattr(chain_sum, "score_answer", lambda self, answer, entry: 1.0)  # rewards anything
    with pytest.raises(DatasetError, match=r"'chain_sum' gives full marks to a nonsense answer"):
        ReasoningGymEnvironment("chain_sum")

    def crash(self, answer, entry):
        raise ValueError("scorer bug")

    monkeypatch.setattr(chain_sum, "score_answer", crash)  # fails on the reference answer too: an error, not a 0
    with pytest.raises(ValueError, match="scorer bug"):
        ReasoningGymEnvironment("chain_sum")


def test_reasoning_gym_refuses_problems_of_another_dataset():
    problem = ReasoningGymEnvironment("chain_sum").generate(0, 0)
    with pytest.raises(ValueError, match=r"not made by reasoning-gym dataset 'basic_arithmetic'"):
        ReasoningGymEnvironment("basic_arithmetic").score("1", problem)


# --------------------------------------------------------------------------- mixtures and routing


def test_mixture_respects_weights():
    mixture = MixtureEnvironment({"a": (AddTwo(name="a"), 1.0), "b": (AddTwo(name="b"), 3.0),
                                  "c": (AddTwo(name="c"), 0.5)})
    n = 3000
    counts = Counter(mixture.generate(5, index).metadata["source"] for index in range(n))
    for name, weight in (("a", 1.0), ("b", 3.0), ("c", 0.5)):
        # each count is Binomial(n, p) with p = weight / 4.5; allow 4 standard deviations
        p = weight / 4.5
        assert abs(counts[name] - n * p) <= 4 * math.sqrt(n * p * (1 - p)), (name, counts)


def test_mixture_task_and_reward_route_by_source():
    mixture = MixtureEnvironment({"sum": (AddTwo(), 1.0),
                                  "chain": (ReasoningGymEnvironment("chain_sum"), 1.0)})
    task = environment_task(mixture, train_size=30, test_size=10, seed=0)
    assert {p.metadata["source"] for p in task.train} == {"sum", "chain"}
    assert not set(prompts(task.train)) & set(prompts(task.test))
    ids = [p.id for p in [*task.train, *task.test]]
    assert len(set(ids)) == len(ids)
    reward = EnvironmentReward(mixture)
    assert sorted(reward.routes) == ["chain", "sum"]
    for problem in task.test:
        gold = problem.answer if problem.metadata["source"] == "sum" else f"<answer>{problem.answer}</answer>"
        assert reward(gold, problem) == 1.0 == mixture.score(gold, problem)
        assert reward("<answer>wrong</answer>", problem) == 0.0


def test_environment_reward_errors():
    reward = EnvironmentReward([AddTwo(), AddTwo(name="other")])
    stray = Problem(id="p", prompt="x", answer="1", metadata={"source": "gsm8k"})
    with pytest.raises(ValueError, match=r"'p' has metadata\['source'\]='gsm8k', which no environment scores "
                                         r"\(environments: add_two, other\)"):
        reward("1", stray)
    with pytest.raises(ValueError, match="two environments are named 'add_two'"):
        EnvironmentReward([AddTwo(), AddTwo(high=5)])
    with pytest.raises(ValueError, match=r"weight of 'a' must be a positive number"):
        MixtureEnvironment({"a": (AddTwo(), 0.0)})


def test_make_environment_by_name():
    env = make_environment("basic_arithmetic", {"max_digits": 1})
    assert isinstance(env, ReasoningGymEnvironment) and env.config == {"max_digits": 1}
    user = make_environment(f"{__name__}:AddTwo", {"high": 3})
    assert user == AddTwo(high=3)
    mixture = make_mixture({"chain_sum": 2.0, "basic_arithmetic": 1.0}, {"basic_arithmetic": {"max_digits": 1}})
    assert isinstance(mixture, MixtureEnvironment) and [w for _, w in mixture.components.values()] == [2.0, 1.0]
    assert isinstance(make_mixture({"chain_sum": 1.0}), ReasoningGymEnvironment)
    with pytest.raises(DatasetError, match=r"settings for countdown, which is not in the mixture"):
        make_mixture({"chain_sum": 1.0}, {"countdown": {}})


def test_environment_from_config_strings():
    single = environment_from_spec("basic_arithmetic", '{"max_digits": 2}')
    assert isinstance(single, ReasoningGymEnvironment) and single.config == {"max_digits": 2}
    mixture = environment_from_spec("chain_sum=3, basic_arithmetic=1", '{"basic_arithmetic": {"max_digits": 1}}')
    assert {k: (type(e).__name__, w) for k, (e, w) in mixture.components.items()} == {
        "chain_sum": ("ReasoningGymEnvironment", 3.0), "basic_arithmetic": ("ReasoningGymEnvironment", 1.0)}
    assert mixture.components["basic_arithmetic"][0].config == {"max_digits": 1}
    assert environment_from_spec(f"{__name__}:AddTwo", {"high": 7}) == AddTwo(high=7)
    with pytest.raises(DatasetError, match=r"write NAME=WEIGHT, got 'countdown=lots'"):
        environment_from_spec("chain_sum=1,countdown=lots")
    with pytest.raises(DatasetError, match="must be a JSON object"):
        environment_from_spec("chain_sum", "[1]")
    with pytest.raises(DatasetError, match="no environment named"):
        environment_from_spec(" , ")
