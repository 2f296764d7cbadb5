"""Sampling strategies: DAPO dynamic sampling, online difficulty filtering, curricula. Numbers are
worked by hand from each method's rule; every sampler resumes exactly from its state."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from helpers import CountingEngine

from reasonrl.sampling import (
    BandSampler,
    CompetenceCurriculum,
    PassRateCurriculum,
    PassRates,
    ReplayBuffer,
    allocate_samples,
    competence,
    fill_batch,
    generate_with_budget,
    group_accuracy,
    has_correctness_spread,
    has_reward_spread,
)
from reasonrl.sampling.stages import Stage, from_sources, parse_stage, parse_stages, stage_at
from reasonrl.types import Completion, Group, Problem, SamplingParams, is_solution


def scored(problem_id: str, rewards: list[float]) -> Group:
    completions = tuple(Completion(token_ids=(1,), text="x", logprobs=(0.0,), finish_reason="stop") for _ in rewards)
    return Group(problem=Problem(id=problem_id, prompt="p", answer="a"), prompt_ids=(0,), completions=completions,
                 rewards=tuple(rewards))


# ---------------------------------------------------------------------------------------------
# Dynamic sampling.

def test_reward_spread():
    assert has_reward_spread(scored("a", [0, 1, 0]))
    assert not has_reward_spread(scored("b", [1, 1, 1]))
    assert not has_reward_spread(scored("c", [0, 0]))


def test_dapo_keeps_groups_by_correctness_not_by_total_reward():
    # All wrong, but the overlong punishment tells the lengths apart: the total rewards differ, so the
    # loose rule keeps the group (it would train on length alone); DAPO's 0 < #correct < G drops it.
    all_wrong = replace(scored("w", [0.0, -0.5, -1.0]),
                        reward_components={"correct": (0.0, 0.0, 0.0), "overlong": (0.0, -0.5, -1.0)})
    assert has_reward_spread(all_wrong) and not has_correctness_spread(all_wrong)
    all_right = replace(scored("r", [1.0, 0.5, 1.0]),
                        reward_components={"correct": (1.0, 1.0, 1.0), "overlong": (0.0, -0.5, 0.0)})
    assert has_reward_spread(all_right) and not has_correctness_spread(all_right)
    mixed = replace(scored("m", [1.0, 0.0, 0.0]), reward_components={"correct": (1.0, 0.0, 0.0)})
    assert has_correctness_spread(mixed)
    # Without a "correct" component, a positive reward counts as correct.
    assert has_correctness_spread(scored("u", [0.3, 0.0])) and not has_correctness_spread(scored("v", [0.3, 0.2]))


def test_partial_credit_is_not_a_solution():
    # reasoning-gym scores "3 times" against 3 as 1/7 and "= 42" against 42 as 0.5: no completion of
    # this group solved its problem, so DAPO's filter drops it as all wrong and its pass rate is 0;
    # one full-credit answer beside partial ones makes it mixed.
    partial = replace(scored("p", [0.5, 1 / 7, 0.0]), reward_components={"correct": (0.5, 1 / 7, 0.0)})
    assert partial.solved == (False, False, False)
    assert group_accuracy(partial) == 0.0 and not has_correctness_spread(partial)
    one_solved = replace(partial, reward_components={"correct": (1.0, 1 / 7, 0.5)})
    assert one_solved.solved == (True, False, False) and group_accuracy(one_solved) == pytest.approx(1 / 3)
    assert has_correctness_spread(one_solved)
    assert scored("u", [0.3, 0.0]).solved == (True, False)  # no "correct" component: a positive reward
    assert Group(problem=partial.problem, prompt_ids=(0,), completions=partial.completions).solved is None


def test_one_rule_decides_a_solution():
    # Full credit less float rounding: ten checks of 0.1 average to 0.9999999999999999.
    assert is_solution(sum([0.1] * 10), None) and is_solution(1.0, -5.0) and not is_solution(1 - 1e-6, 1.0)
    # The "correct" component decides where there is one, whatever the total; without it, the total above 0.
    assert not is_solution(0.0, 3.0) and is_solution(None, 1e-12) and not is_solution(None, 0.0)
    assert not is_solution(None, None)
    group = replace(scored("g", [2.0, 0.5, 0.0]), reward_components={"correct": (0.0, 1.0, 1 - 1e-6)})
    assert group.solved == (False, True, False)


def test_fill_batch_keeps_sampling_until_the_batch_is_informative():
    # Problems 0..: even ids are all-correct (dropped), odd ids mixed (kept). Target 3.
    counter = iter(range(100))
    drawn_sizes = []

    def draw(count):
        drawn_sizes.append(count)
        return [Problem(id=str(next(counter)), prompt="p", answer="a") for _ in range(count)]

    def rollout(problems, round_index):  # each group's scoring stopped one check at its time bound
        return [replace(scored(p.id, [1, 1] if int(p.id) % 2 == 0 else [0, 1]), reward_timeouts=1) for p in problems]

    groups, metrics = fill_batch(draw, rollout, target=3, max_rounds=10)
    # round 1: ids 0,1,2 -> keeps 1 (2 missing); round 2: ids 3,4 -> keeps 3 (1 missing); round 3: id 5 -> keeps 5.
    assert [g.problem.id for g in groups] == ["1", "3", "5"]
    assert drawn_sizes == [3, 2, 1]
    # every completion sampled, kept or not: rewards 2 + 1 + 2 | 1 + 2 | 1 = 9 of 12 (the kept: 3 of 6)
    assert metrics == {"sampling/rounds": 3.0, "sampling/dropped_groups": 3.0, "sampling/short_groups": 0.0,
                       "sampling/dropped_frac": 0.5, "sampling/dropped_graded_frac": 0.0,
                       "sampling/reward_mean_all": 0.75, "sampling/accuracy_all": 0.75,
                       "sampling/reward_timeouts_all": 6.0}  # the 3 dropped groups' included


def test_fill_batch_stops_after_max_rounds():
    def draw(count):
        return [Problem(id="x", prompt="p", answer="a")] * count

    groups, metrics = fill_batch(draw, lambda problems, r: [scored("x", [1, 1]) for _ in problems],
                                 target=2, max_rounds=3)
    assert len(groups) == 2  # nothing informative: the last round's groups, for the step's logs only
    assert metrics == {"sampling/rounds": 3.0, "sampling/dropped_groups": 6.0, "sampling/short_groups": 2.0,
                       "sampling/dropped_frac": 1.0, "sampling/dropped_graded_frac": 0.0,
                       "sampling/reward_mean_all": 1.0, "sampling/accuracy_all": 1.0,
                       "sampling/reward_timeouts_all": 0.0}


def test_fill_batch_with_one_round_is_plain_sampling():
    groups, metrics = fill_batch(lambda n: [Problem(id=str(i), prompt="p", answer="a") for i in range(n)],
                                 lambda problems, r: [scored(p.id, [0, 1] if p.id == "0" else [0, 0])
                                                      for p in problems], target=2, max_rounds=1)
    assert [g.problem.id for g in groups] == ["0"]
    assert metrics["sampling/short_groups"] == 1.0
    assert metrics["sampling/reward_mean_all"] == metrics["sampling/accuracy_all"] == 0.25  # [0, 1] and [0, 0]


def test_the_policy_s_own_reward_is_taken_over_every_sampled_completion():
    # Partial credit and no "correct" component (a reasoning-gym score): the accuracy is the mean score,
    # as reward/correct and the evaluation take it, not the share above 0 (which would be 3 of 6 = 0.5).
    # round 1: [0.5, 0] kept, [0, 0] dropped; round 2: [0.2, 0.2] dropped (no spread under the correctness
    # rule: both count as correct), then max_rounds. Rewards 0.5 + 0.4 = 0.9 of 6.
    rounds = iter([[scored("a", [0.5, 0.0]), scored("b", [0.0, 0.0])], [scored("c", [0.2, 0.2])]])
    groups, metrics = fill_batch(lambda n: [Problem(id="x", prompt="p", answer="a")] * n,
                                 lambda problems, r: next(rounds), target=2, max_rounds=2, keep=has_correctness_spread)
    assert [g.problem.id for g in groups] == ["a"]
    assert metrics["sampling/reward_mean_all"] == metrics["sampling/accuracy_all"] == pytest.approx(0.15)


def test_groups_dropped_though_their_scores_differ_are_counted():
    # Partial credit without a "correct" component: a score above 0 counts as a solution, so under the
    # correctness rule [0.5, 0.25] (both "solved") is dropped though it would teach; [0, 0] is dropped with
    # one score; [1, 0] is kept. 2 of 3 dropped, 1 of 3 with scores that differ. The reward rule keeps it.
    def one_round(keep):
        return fill_batch(lambda n: [Problem(id="x", prompt="p", answer="a")] * n,
                          lambda problems, r: [scored("a", [0.5, 0.25]), scored("b", [0.0, 0.0]), scored("c", [1.0, 0.0])],
                          target=3, max_rounds=1, keep=keep)[1]

    by_correctness = one_round(has_correctness_spread)
    assert by_correctness["sampling/dropped_frac"] == pytest.approx(2 / 3)
    assert by_correctness["sampling/dropped_graded_frac"] == pytest.approx(1 / 3)
    by_reward = one_round(has_reward_spread)
    assert by_reward["sampling/dropped_frac"] == pytest.approx(1 / 3)
    assert by_reward["sampling/dropped_graded_frac"] == 0.0


def test_the_accuracy_over_every_sampled_completion_is_the_correct_component_s_mean():
    # A format bonus of 0.1 on every completion: the reward mean counts it, the accuracy does not.
    # [1, 0] kept, [0, 0] dropped: rewards 1.1 + 0.1 + 0.1 + 0.1 = 1.4 of 4; correct 1 of 4.
    def with_bonus(problem_id, correct):
        group = scored(problem_id, [c + 0.1 for c in correct])
        return replace(group, reward_components={"correct": tuple(correct), "format": (0.1,) * len(correct)})

    groups, metrics = fill_batch(lambda n: [Problem(id="x", prompt="p", answer="a")] * n,
                                 lambda problems, r: [with_bonus("a", [1.0, 0.0]), with_bonus("b", [0.0, 0.0])],
                                 target=2, max_rounds=1, keep=has_correctness_spread)
    assert [g.problem.id for g in groups] == ["a"]
    assert metrics["sampling/reward_mean_all"] == pytest.approx(0.35)
    assert metrics["sampling/accuracy_all"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------
# Online difficulty filtering.

def test_pass_rates_are_an_exponential_moving_average():
    rates = PassRates(decay=0.5)
    rates.update(3, 1.0)
    assert rates.get(3) == 1.0  # the first observation is taken as is
    rates.update(3, 0.0)
    rates.update(3, 0.5)
    assert rates.get(3) == pytest.approx(0.5 * (0.5 * 1.0 + 0.5 * 0.0) + 0.5 * 0.5)  # 0.5
    assert rates.get(4) is None


def test_band_sampler_skips_solved_and_hopeless_problems():
    sampler = BandSampler(6, low=0.2, high=0.8, seed=0)
    sampler.observe([0, 1, 2], [1.0, 0.0, 0.5])  # 0 solved, 1 hopeless, 2 in the band; 3..5 unknown
    drawn = [i for _ in range(8) for i in sampler.next(2)]
    assert set(drawn) == {2, 3, 4, 5}
    # Every pass over the 6 problems skips the 2 out-of-band ones: 16 draws = 4 passes -> 8 skipped
    assert sampler.metrics()["sampling/skipped_problems"] == 8.0
    assert sampler.metrics()["sampling/outside_band"] == 2.0


def test_band_sampler_stops_skipping_when_everything_is_solved():
    sampler = BandSampler(3, low=0.0, high=0.9, seed=0)
    sampler.observe([0, 1, 2], [1.0, 1.0, 1.0])
    assert len(sampler.next(2)) == 2
    assert sampler.metrics()["sampling/band_exhausted"] == 1.0


def test_band_sampler_resumes_exactly():
    first = BandSampler(10, low=0.1, high=0.9, seed=3)
    first.observe([1, 2], [1.0, 0.0])
    first.next(4)
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    second = BandSampler(10, low=0.1, high=0.9, seed=3)
    second.load_state_dict(state)
    assert [first.next(3) for _ in range(4)] == [second.next(3) for _ in range(4)]


# ---------------------------------------------------------------------------------------------
# Curricula.

def test_competence_square_root_schedule():
    # c(t) = min(1, sqrt(t (1 - c0^2) / T + c0^2)); c0 = 0.1, T = 100
    assert competence(0, 100, 0.1) == pytest.approx(0.1)
    assert competence(25, 100, 0.1) == pytest.approx(math.sqrt(25 * 0.99 / 100 + 0.01))  # 0.5074
    assert competence(100, 100, 0.1) == pytest.approx(1.0)
    assert competence(500, 100, 0.1) == 1.0


def test_competence_curriculum_opens_the_easiest_problems_first():
    difficulties = [5, 1, 4, 2, 3, 9, 8, 7, 6, 0]  # easiest: index 9 (0), then 1 (1), 3 (2), 4 (3), ...
    curriculum = CompetenceCurriculum(difficulties, total_steps=100, initial=0.2, seed=0)
    assert set(curriculum.next(2)) == {9, 1}  # step 0: ceil(0.2 * 10) = 2 open problems
    curriculum.step = 25  # c = sqrt(25 * 0.96 / 100 + 0.04) = 0.529 -> ceil(5.29) = 6 open
    assert curriculum.open_count() == 6
    assert set(curriculum.next(6)) == {9, 1, 3, 4, 2, 0}
    curriculum.step = 100
    assert set(curriculum.next(10)) == set(range(10))


def test_competence_curriculum_resumes_exactly():
    first = CompetenceCurriculum(list(range(20)), total_steps=10, seed=1)
    first.next(4)
    second = CompetenceCurriculum(list(range(20)), total_steps=10, seed=1)
    second.load_state_dict(first.state_dict())
    assert [first.next(4) for _ in range(5)] == [second.next(4) for _ in range(5)]


def test_pass_rate_curriculum_advances_when_the_level_is_learned():
    difficulties = [1, 1, 2, 2, 3]
    curriculum = PassRateCurriculum(difficulties, advance_at=0.75, decay=0.5)
    assert set(curriculum.next(4)) == {0, 1}  # level 1 only
    curriculum.observe([0, 1], [1.0, 1.0])  # running accuracy: 0.5, then 0.75 -> advance
    assert curriculum.metrics()["sampling/level"] == 2.0
    assert set(curriculum.next(2)) == {2, 3}
    curriculum.observe([4], [1.0])  # a problem of another level does not count
    assert curriculum.metrics()["sampling/level_accuracy"] == 0.0
    curriculum.observe([2, 3, 2], [1.0, 1.0, 0.0])  # 0.5, 0.75 -> advance to 3 before the third
    assert curriculum.metrics()["sampling/level"] == 3.0
    curriculum.observe([4, 4], [1.0, 1.0])  # the last level stays
    assert curriculum.next(2) == [4, 4]


def test_pass_rate_curriculum_resumes_exactly():
    first = PassRateCurriculum([1, 1, 1, 2, 2], advance_at=0.6, decay=0.0)
    first.next(2)
    first.observe([0], [1.0])
    second = PassRateCurriculum([1, 1, 1, 2, 2], advance_at=0.6, decay=0.0)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [first.next(3) for _ in range(3)] == [second.next(3) for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# Adaptive budget.

def test_allocate_samples_by_failure_rate():
    # total 16, 3 problems, min 2 -> 10 spare; weights: 1 - 1.0 -> floor 0.1, 1 - 0.0 = 1.0, unknown 0.5
    # shares 10 * (0.1, 1.0, 0.5) / 1.6 = (0.625, 6.25, 3.125) -> floors (0, 6, 3), 1 left -> largest
    # remainder 0.625 (problem 0): counts (2 + 1, 2 + 6, 2 + 3)
    assert allocate_samples([1.0, 0.0, None], 16) == [3, 8, 5]
    assert allocate_samples([0.5, 0.5], 8) == [4, 4]  # equal rates: the uniform G
    assert sum(allocate_samples([0.9, 0.1, 0.3, None, 1.0], 40, min_samples=3)) == 40
    with pytest.raises(ValueError, match="cannot give"):
        allocate_samples([0.0, 0.0], 3)


def test_generate_with_budget_one_call_per_size_in_problem_order():
    engine = CountingEngine()
    problems = [Problem(id=str(i), prompt="p", answer="a") for i in range(4)]
    groups = generate_with_budget(engine, problems, SamplingParams(n=4, seed=10), [2, 6, 2, 6])
    assert [g.problem.id for g in groups] == ["0", "1", "2", "3"]
    assert [g.size for g in groups] == [2, 6, 2, 6]
    assert engine.calls == [(["0", "2"], 2, 12), (["1", "3"], 6, 16)]


# ---------------------------------------------------------------------------------------------
# Experience replay.

def with_correct(problem_id: str, correct: list[float], text: str = "x") -> Group:
    group = scored(problem_id, correct)
    completions = tuple(Completion(token_ids=(k,), text=f"{text}{k}", logprobs=(-1.0,), finish_reason="stop")
                        for k in range(len(correct)))
    return Group(problem=group.problem, prompt_ids=(0,), completions=completions, rewards=tuple(correct),
                 reward_components={"correct": tuple(correct)})


def test_replay_puts_a_remembered_correct_completion_into_an_all_wrong_group():
    buffer = ReplayBuffer(per_problem=2)
    buffer.add(7, with_correct("7", [0, 1, 1, 0], text="old"))
    wrong = with_correct("7", [0, 0, 0, 0], text="new")
    assert buffer.mixed(3, wrong, step=0) is None  # nothing stored for problem 3
    assert buffer.mixed(7, with_correct("7", [0, 1, 0, 0]), step=0) is None  # not all wrong
    mixed = buffer.mixed(7, wrong, step=0)
    assert [c.text for c in mixed.completions[:3]] == ["new0", "new1", "new2"]
    assert mixed.completions[3].text in ("old1", "old2") and mixed.rewards is None  # to be scored again
    assert buffer.metrics()["sampling/replayed"] == 1.0


def test_replay_remembers_solutions_only():
    buffer = ReplayBuffer(per_problem=2)
    buffer.add(7, with_correct("7", [0.5, 0.25, 0, 0], text="partial"))  # partial credit: nothing to replay
    assert buffer.mixed(7, with_correct("7", [0, 0, 0, 0]), step=0) is None
    assert buffer.mixed(7, with_correct("7", [0.5, 0, 0, 0]), step=0) is None  # nothing stored to mix in
    buffer.add(7, with_correct("7", [0, 1, 0, 0], text="solved"))
    mixed = buffer.mixed(7, with_correct("7", [0.5, 0, 0, 0]), step=0)  # no solution in it: all wrong
    assert mixed is not None and mixed.completions[3].text == "solved1"


def test_replay_keeps_the_newest_and_resumes():
    buffer = ReplayBuffer(per_problem=2)
    buffer.add(1, with_correct("1", [1, 1], text="a"))
    buffer.add(1, with_correct("1", [1, 0], text="b"))
    assert [c.text for c in buffer.stored[1]] == ["a1", "b0"]
    restored = ReplayBuffer()
    restored.load_state_dict(buffer.state_dict())
    assert restored.stored == buffer.stored and restored.per_problem == 2


# ---------------------------------------------------------------------------------------------
# Multi-stage schedules.

def test_stages_parse_and_take_effect_at_their_step():
    stages = parse_stages(["100: max_new_tokens=128 sources=a+b", "0: max_new_tokens=64 group_size=4"])
    assert stages[0] == Stage(start_step=0, max_new_tokens=64, group_size=4)
    assert stages[1] == Stage(start_step=100, max_new_tokens=128, sources=frozenset({"a", "b"}))
    assert stage_at(stages, 99) is stages[0] and stage_at(stages, 100) is stages[1]
    assert stage_at(parse_stages(["5: group_size=2"]), 4) is None


@pytest.mark.parametrize("spec", ["x: max_new_tokens=4", "10 max_new_tokens=4", "3: length=4", "3: group_size=0",
                                  "3: group_size=four"])
def test_bad_stages_are_named(spec):
    with pytest.raises(ValueError, match="stage"):
        parse_stage(spec)


def test_from_sources_passes_over_other_sources():
    problems = [Problem(id=str(i), prompt="p", answer="a", metadata={"source": "ab"[i % 2]}) for i in range(6)]
    order = iter(range(100))
    assert from_sources(lambda n: [next(order) % 6 for _ in range(n)], problems, frozenset({"b"}), 3) == [1, 3, 5]
    with pytest.raises(ValueError, match="sources of the task: a, b"):
        from_sources(lambda n: [0] * n, problems, frozenset({"c"}), 1)


def test_the_alarms_read_dynamic_samplings_all_round_numbers_only_under_it():
    from reasonrl.guards import alarms
    from reasonrl.guards.alarm_participant import rollout_signals
    from reasonrl.rollout.producer import Rollouts
    from reasonrl.sampling import dynamic as sampling_dynamic

    for name in ("DROPPED_FRAC", "DROPPED_GRADED_FRAC", "REWARD_MEAN_ALL", "ACCURACY_ALL"):  # the names they read
        assert getattr(alarms, name) == getattr(sampling_dynamic, name)

    kept = [scored("a", [1.0, 0.0])]
    all_rounds = {"sampling/dropped_frac": 0.75, "sampling/dropped_graded_frac": 0.5, "sampling/reward_mean_all": 0.125,
                  "sampling/accuracy_all": 0.125}
    dynamic = Rollouts(sampling=SamplingParams(), groups=kept, sampling_metrics=all_rounds | {"sampling/rounds": 2.0})
    signals = rollout_signals(dynamic)
    assert {key: signals[key] for key in all_rounds} == all_rounds and "sampling/rounds" not in signals
    assert signals["rollout/zero_std_frac"] == 0.0 and signals["reward/mean"] == 0.5
    assert not set(all_rounds) & set(rollout_signals(Rollouts(sampling=SamplingParams(), groups=kept)))
