"""EpochSampler: every problem once per epoch, deterministic per seed, exactly resumable."""

from __future__ import annotations

import json

import pytest

from reasonrl.sampling import EpochSampler


def test_every_index_once_per_epoch():
    sampler = EpochSampler(10, seed=0)
    first, second = sampler.next(10), sampler.next(10)
    assert sorted(first) == list(range(10))
    assert sorted(second) == list(range(10))
    assert first != second  # a fresh order each epoch (fixed seed: deterministic)
    assert sampler.state_dict()["epoch"] == 1


def test_batches_cross_epoch_boundaries():
    # 7 problems drawn 3 at a time: 3 + 3 + 1 finish epoch 0, the last 2 open epoch 1
    chunks = EpochSampler(7, seed=5)
    batches = [chunks.next(3) for _ in range(3)]
    assert [len(b) for b in batches] == [3, 3, 3]
    drawn = [i for b in batches for i in b]

    epochs = EpochSampler(7, seed=5)
    epoch0, epoch1 = epochs.next(7), epochs.next(7)
    assert drawn == epoch0 + epoch1[:2]
    assert chunks.state_dict() == {"epoch": 1, "position": 2, "num_problems": 7, "seed": 5}


def test_sequence_does_not_depend_on_batch_sizes():
    one_go = EpochSampler(5, seed=2).next(23)  # 4 full epochs and 3 of the fifth
    sampler = EpochSampler(5, seed=2)
    pieces = [i for n in (1, 4, 5, 0, 7, 6) for i in sampler.next(n)]
    assert pieces == one_go
    for epoch in range(4):
        assert sorted(one_go[5 * epoch : 5 * epoch + 5]) == [0, 1, 2, 3, 4]


def test_batch_larger_than_the_task():
    drawn = EpochSampler(3, seed=0).next(8)
    assert len(drawn) == 8
    assert sorted(drawn[:3]) == sorted(drawn[3:6]) == [0, 1, 2]


def test_deterministic_per_seed():
    assert EpochSampler(50, seed=1).next(120) == EpochSampler(50, seed=1).next(120)
    assert EpochSampler(50, seed=1).next(50) != EpochSampler(50, seed=2).next(50)


def test_resume_from_state_gives_the_exact_sequence():
    straight = EpochSampler(7, seed=3)
    expected = [straight.next(3) for _ in range(3)]

    first = EpochSampler(7, seed=3)
    drawn = [first.next(3)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint as plain data
    resumed = EpochSampler(7, seed=3)
    resumed.load_state_dict(state)
    drawn += [resumed.next(3), resumed.next(3)]
    assert drawn == expected


def test_resume_at_an_epoch_boundary():
    straight = EpochSampler(4, seed=9)
    expected = straight.next(4) + straight.next(4)
    first = EpochSampler(4, seed=9)
    head = first.next(4)  # position == num_problems: the next draw opens epoch 1
    resumed = EpochSampler(4, seed=9)
    resumed.load_state_dict(first.state_dict())
    assert head + resumed.next(4) == expected


def test_state_for_another_task_size_or_seed_fails():
    state = EpochSampler(10, seed=0).state_dict()
    with pytest.raises(ValueError, match="10 problems with seed 0, not 11 with seed 0"):
        EpochSampler(11, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="not 10 with seed 1"):
        EpochSampler(10, seed=1).load_state_dict(state)


def test_needs_at_least_one_problem():
    with pytest.raises(ValueError, match="at least one problem"):
        EpochSampler(0)
    assert EpochSampler(1).next(3) == [0, 0, 0]


def test_a_resume_in_a_later_epoch_continues_that_epoch_s_order():
    straight = EpochSampler(4, seed=9)
    expected = straight.next(6) + straight.next(2)
    first = EpochSampler(4, seed=9)
    head = first.next(6)  # epoch 1, at its third problem
    resumed = EpochSampler(4, seed=9)
    resumed.load_state_dict(first.state_dict())
    assert first.state_dict()["epoch"] == 1 and head + resumed.next(2) == expected
