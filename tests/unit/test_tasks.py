"""Tasks: the built-in arithmetic task and Task.from_records (lists of dicts, JSONL files)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from reasonrl.tasks import Task, arithmetic_task
from reasonrl.tasks.base import DatasetError
from reasonrl.types import Problem

QUESTION = re.compile(r"What is (\d+(?: \+ \d+)*)\?")


def numbers_of(problem: Problem) -> tuple[int, ...]:
    match = QUESTION.search(problem.prompt)
    assert match, problem.prompt
    return tuple(int(n) for n in match.group(1).split(" + "))


# --------------------------------------------------------------------------- arithmetic


def test_arithmetic_sizes_and_gold_answers():
    task = arithmetic_task(train_size=300, test_size=40, digits=2, operands=2, seed=0)
    assert task.name == "arithmetic"
    assert (len(task.train), len(task.test)) == (300, 40)
    for problem in [*task.train, *task.test]:
        numbers = numbers_of(problem)
        assert len(numbers) == 2
        assert all(10 <= n <= 99 for n in numbers)  # two digits each
        assert problem.answer == str(sum(numbers))  # parsed back from the prompt, added here
        assert list(problem.metadata["numbers"]) == list(numbers)


def test_arithmetic_more_operands_and_one_digit():
    task = arithmetic_task(train_size=50, test_size=5, digits=1, operands=4, seed=3)
    for problem in [*task.train, *task.test]:
        numbers = numbers_of(problem)
        assert len(numbers) == 4 and all(0 <= n <= 9 for n in numbers)
        assert problem.answer == str(sum(numbers))


def test_arithmetic_default_prompt_is_the_bare_question():
    problem = arithmetic_task(train_size=1, test_size=0, seed=0).train[0]
    a, b = numbers_of(problem)
    assert problem.prompt == f"What is {a} + {b}?"
    assert int(problem.answer) - a == b


def test_arithmetic_prompt_template():
    task = arithmetic_task(train_size=3, test_size=1, prompt_template="Q: {prompt}\nBox it: \\boxed{{}}.")
    for problem in [*task.train, *task.test]:
        assert re.fullmatch(r"Q: What is \d+ \+ \d+\?\nBox it: \\boxed\{\}\.", problem.prompt)


def test_arithmetic_train_and_test_share_no_expression():
    task = arithmetic_task(train_size=2000, test_size=500, digits=2, operands=2, seed=1)
    train = [numbers_of(p) for p in task.train]
    test = [numbers_of(p) for p in task.test]
    assert len(set(train)) == 2000 and len(set(test)) == 500  # no duplicates within a split
    assert not set(train) & set(test)
    ids = [p.id for p in [*task.train, *task.test]]
    assert len(set(ids)) == len(ids)


def test_arithmetic_every_sum_when_asking_for_all_of_them():
    # 1 digit (0..9), 2 operands: 10 * 10 = 100 distinct ordered pairs; asking for all 100 gives each once
    task = arithmetic_task(train_size=80, test_size=20, digits=1, operands=2, seed=0)
    pairs = {numbers_of(p) for p in [*task.train, *task.test]}
    assert pairs == set(itertools.product(range(10), repeat=2))


def test_arithmetic_is_deterministic_per_seed():
    a = arithmetic_task(train_size=100, test_size=10, seed=7)
    b = arithmetic_task(train_size=100, test_size=10, seed=7)
    c = arithmetic_task(train_size=100, test_size=10, seed=8)
    assert a == b
    assert [p.prompt for p in a.train] != [p.prompt for p in c.train]
    assert [p.prompt for p in a.test] != [p.prompt for p in c.test]


def test_arithmetic_too_many_problems():
    # 1 digit, 2 operands: only 100 distinct sums; 90 + 11 = 101
    with pytest.raises(ValueError, match="only 100 distinct sums") as info:
        arithmetic_task(train_size=90, test_size=11, digits=1, operands=2)
    assert "90 + 11" in str(info.value)
    # 2 digits (10..99), 2 operands: 90 * 90 = 8100
    with pytest.raises(ValueError, match="only 8100 distinct sums"):
        arithmetic_task(train_size=8000, test_size=101, digits=2, operands=2)


# --------------------------------------------------------------------------- from_records

RECORDS = [
    {"question": "1 + 1?", "answer": "2"},
    {"question": "2 + 2?", "answer": 4, "id": "q-four", "level": 1},
    {"question": "half of 1?", "answer": 0.5},
    {"question": "3 + 3?", "answer": "6"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_from_records_list_of_dicts():
    task = Task.from_records(RECORDS, RECORDS[:1], prompt_template="Solve: {prompt}", name="mine")
    assert task.name == "mine"
    assert [p.prompt for p in task.train] == ["Solve: 1 + 1?", "Solve: 2 + 2?", "Solve: half of 1?", "Solve: 3 + 3?"]
    assert [p.answer for p in task.train] == ["2", "4", "0.5", "6"]  # numbers become text
    assert [p.id for p in task.train] == ["0", "q-four", "2", "3"]  # "id" field, else the row index
    assert task.train[1].metadata == {"id": "q-four", "level": 1}  # other fields are kept
    assert [p.prompt for p in task.test] == ["Solve: 1 + 1?"]


def test_from_records_carves_test_off_the_end():
    task = Task.from_records(RECORDS, test_size=1)
    assert [p.answer for p in task.train] == ["2", "4", "0.5"]
    assert [p.answer for p in task.test] == ["6"]
    task = Task.from_records(RECORDS)  # test_size 0: no test split
    assert len(task.train) == 4 and list(task.test) == []


def test_from_records_custom_fields():
    rows = [{"problem": "x?", "solution": "1"}]
    task = Task.from_records(rows, prompt_field="problem", answer_field="solution", prompt_template="{prompt}")
    assert (task.train[0].prompt, task.train[0].answer) == ("x?", "1")


def test_from_jsonl_files(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(RECORDS[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in RECORDS[1:]))
    task = Task.from_records(train, test_size=2)  # blank lines are skipped
    assert [p.answer for p in task.train] == ["2", "4"]
    assert [p.answer for p in task.test] == ["0.5", "6"]

    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "9 + 9?", "answer": "18"}])
    task = Task.from_records(str(train), str(test), prompt_template="{prompt}")
    assert len(task.train) == 4
    assert [(p.prompt, p.answer) for p in task.test] == [("9 + 9?", "18")]


def test_chat_message_prompts(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 2?"}]
    task = Task.from_records([{"question": messages, "answer": "3"}], prompt_template="IGNORED {prompt}")
    assert list(task.train[0].prompt) == messages  # a chat prompt is used as is, no template
    path = write_jsonl(tmp_path / "chat.jsonl", [{"question": messages, "answer": 3}])
    assert list(Task.from_records(path).train[0].prompt) == messages


def test_missing_field_names_row_and_field():
    rows = [{"question": "a", "answer": "1"}, {"question": "b", "solution": "2"}]
    with pytest.raises(DatasetError, match=r"records row 1: missing field 'answer'") as info:
        Task.from_records(rows)
    assert "solution" in str(info.value)  # shows the fields the row has


def test_missing_field_in_file_names_the_file(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": "1"}, {"answer": "2"}])
    with pytest.raises(DatasetError, match=r"d\.jsonl row 1: missing field 'question'"):
        Task.from_records(path)


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_empty_prompt(prompt):
    with pytest.raises(DatasetError, match=r"records row 0: field 'question' is empty"):
        Task.from_records([{"question": prompt, "answer": "1"}])


@pytest.mark.parametrize("answer", [{"value": 2}, ["2"], None, True])
def test_answer_that_is_not_text_or_number(answer):
    rows = [{"question": "a", "answer": "1"}, {"question": "b", "answer": "1"}, {"question": "c", "answer": answer}]
    with pytest.raises(DatasetError, match=r"records row 2: field 'answer' must be a string or number"):
        Task.from_records(rows)


@pytest.mark.parametrize("prompt", [5, [], [{"role": "user"}], [{"role": "user", "content": 1}], {"content": "x"}])
def test_prompt_that_is_not_text_or_chat(prompt):
    with pytest.raises(DatasetError, match=r"records row 0: field 'question' must be text or a list"):
        Task.from_records([{"question": prompt, "answer": "1"}])


def test_row_that_is_not_a_dict():
    with pytest.raises(DatasetError, match=r"records row 1: expected a dict, got list"):
        Task.from_records([{"question": "a", "answer": "1"}, ["b", "2"]])


def test_invalid_json_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": \n')
    # line 1 valid, line 2 blank, line 3 broken
    with pytest.raises(DatasetError, match=r"bad\.jsonl:3: not valid JSON"):
        Task.from_records(path)


def test_non_object_line(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n["b", "2"]\n')
    with pytest.raises(DatasetError, match=r"list\.jsonl:2: expected a JSON object, got list"):
        Task.from_records(path)


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"'.*nope\.jsonl' does not exist"):
        Task.from_records(tmp_path / "nope.jsonl")
    train = write_jsonl(tmp_path / "train.jsonl", RECORDS)
    with pytest.raises(DatasetError, match="does not exist"):
        Task.from_records(train, tmp_path / "missing-test.jsonl")


@pytest.mark.parametrize("test_size", [4, 5])
def test_test_size_too_large(test_size):
    with pytest.raises(DatasetError, match=f"test_size={test_size} leaves no training problems out of 4"):
        Task.from_records(RECORDS, test_size=test_size)
    assert len(Task.from_records(RECORDS, test_size=3).train) == 1  # one left is fine


def test_no_problems(tmp_path):
    with pytest.raises(DatasetError, match="no problems"):
        Task.from_records([])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match="no problems"):
        Task.from_records(empty)


def test_dataset_error_is_a_value_error():
    assert issubclass(DatasetError, ValueError)
