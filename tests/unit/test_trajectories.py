"""An agent's recorded calls become training sequences: merged where a call's prompt extends what came
before (the tokens between masked), separate where it does not, laid out after a shared prompt."""

from __future__ import annotations

import pytest

from reasonrl.agents.trajectories import Call, after_prompt, assemble, shared_prompt
from reasonrl.types import Completion


def call(prompt, generated, finish="stop"):
    return Call(tuple(prompt), Completion(token_ids=tuple(generated), text="", finish_reason=finish,
                                          logprobs=tuple(-0.1 * t for t in generated)))


def test_a_call_extending_the_last_one_continues_it_with_the_tokens_between_masked():
    (merged,) = assemble([call([1, 2], [3, 4]), call([1, 2, 3, 4, 9, 8], [5], "length")])
    assert merged.prompt_ids == (1, 2)
    assert merged.token_ids == (3, 4, 9, 8, 5)
    assert merged.loss_mask == (1, 1, 0, 0, 1)
    assert merged.logprobs == pytest.approx((-0.3, -0.4, 0.0, 0.0, -0.5))
    assert merged.finish_reason == "length" and merged.calls == 2


def test_a_prompt_ending_as_a_trajectory_ends_but_differing_before_does_not_extend_it():
    # The last token is compared first, to tell most prompts apart at once: a prompt sharing it still
    # has to hold the whole sequence.
    first, second = assemble([call([1, 2], [3]), call([1, 5, 3, 4], [6])])
    assert (first.token_ids, second.prompt_ids, second.token_ids) == ((3,), (1, 5, 3, 4), (6,))


def test_merging_matches_the_definition_on_random_calls():
    import random

    rng = random.Random(0)
    for _ in range(300):
        calls, sequences = [], []  # sequences: the naive reading of the definition, kept beside
        for _ in range(rng.randint(1, 6)):
            base = list(rng.choice(sequences)) if sequences and rng.random() < 0.7 else []
            prompt = base + [rng.randint(1, 3) for _ in range(rng.randint(0, 3))]
            if base and rng.random() < 0.3:
                prompt[rng.randrange(len(prompt))] = rng.randint(1, 3)  # a rewritten history
            generated = [rng.randint(1, 3) for _ in range(rng.randint(1, 2))]
            extended = [i for i, seq in enumerate(sequences) if prompt[:len(seq)] == seq and len(seq) <= len(prompt)]
            if extended:
                target = max(reversed(extended), key=lambda i: len(sequences[i]))
                sequences[target] = prompt + generated
            else:
                sequences.append(prompt + generated)
            calls.append(call(prompt, generated))
        assert [list(t.prompt_ids + t.token_ids) for t in assemble(calls)] == sequences


def test_a_rewritten_history_gives_separate_exact_samples():
    # The second prompt drops the first reply's 7 (a template stripping <think> from earlier turns).
    first, second = assemble([call([1, 2], [7, 3]), call([1, 2, 3, 9], [5])])
    assert (first.prompt_ids, first.token_ids, first.loss_mask) == ((1, 2), (7, 3), (1, 1))
    assert (second.prompt_ids, second.token_ids, second.loss_mask) == ((1, 2, 3, 9), (5,), (1,))
    assert first.calls == second.calls == 1


def test_a_call_continues_the_longest_trajectory_it_extends_and_a_repeat_forks():
    calls = [call([1], [2]), call([1, 2, 6], [3]), call([1], [2]), call([1, 2, 6, 3, 7], [4])]
    long, repeated = assemble(calls)
    assert long.token_ids == (2, 6, 3, 7, 4) and long.calls == 3
    assert (repeated.prompt_ids, repeated.token_ids) == ((1,), (2,))  # its prompt no longer extends [1, 2, 6, 3]


def test_samples_are_laid_out_after_the_prompt_they_all_begin_with():
    a, b = assemble([call([5, 6, 7], [1]), call([5, 6, 8, 8], [2])])
    prompt = shared_prompt([a, b])
    assert prompt == (5, 6)
    moved = after_prompt(b, prompt)
    assert (moved.prompt_ids, moved.token_ids, moved.loss_mask, moved.logprobs[:2]) == (
        (5, 6), (8, 8, 2), (0, 0, 1), (0.0, 0.0))
    assert shared_prompt([a, *assemble([call([4], [1])])]) == ()
