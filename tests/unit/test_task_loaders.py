"""Task loaders: CSV / JSON / Parquet files, hub ids, difficulty and source metadata, the built-in
benchmarks (from small fixture files, and from the copies shipped in the package), and the
13-gram contamination check."""

from __future__ import annotations

import gzip
import json
import sys
import types
from importlib.util import find_spec
from pathlib import Path

import pytest

from reasonrl.tasks import Task, benchmarks
from reasonrl.tasks.base import DatasetError, load_hf, parse_hf_spec, problems_from_records, read_records
from reasonrl.tasks.benchmarks import BENCHMARKS, benchmark_task, find_data_dir
from reasonrl.tasks.decontamination import decontaminate, ngram_overlap, normalized_text, normalized_words
from reasonrl.types import Problem


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- file formats


def test_csv_file(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('question,answer,level\n"1 + 1, please?",2,Level 1\nhalf of 1?,0.50,Level 4\n')
    task = Task.from_records(path, test_size=1, difficulty_field="level", prompt_template="{prompt}")
    assert [(p.prompt, p.answer) for p in task.train] == [("1 + 1, please?", "2")]  # quoted comma kept
    assert task.test[0].answer == "0.50"  # CSV cells stay text as written
    assert [p.metadata["difficulty"] for p in [*task.train, *task.test]] == [1.0, 4.0]  # "Level 4" -> 4.0


def test_csv_missing_column_names_row_and_field(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("problem,answer\nx?,1\n")
    with pytest.raises(DatasetError, match=r"d\.csv row 0: missing field 'question'"):
        Task.from_records(path)


def test_json_list_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"question": "a?", "answer": 1}, {"question": "b?", "answer": 2}]))
    assert [p.answer for p in Task.from_records(path).train] == ["1", "2"]
    path.write_text(json.dumps({"question": "a?", "answer": 1}))
    with pytest.raises(DatasetError, match=r"expected a JSON list of objects, got dict"):
        Task.from_records(path)


def test_unknown_suffix(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("x")
    with pytest.raises(DatasetError, match=r"unknown file type '\.txt'; use one of \.csv, \.json, \.jsonl, \.parquet"):
        read_records(path)


def test_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    if find_spec("pyarrow") is None:
        path.write_bytes(b"PAR1")
        with pytest.raises(DatasetError, match=r"needs the 'pyarrow' package \(pip install pyarrow\)"):
            Task.from_records(path)
        return
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([{"question": "a?", "answer": 3, "level": 2}]), path)
    problem = Task.from_records(path, difficulty_field="level", prompt_template="{prompt}").train[0]
    assert (problem.prompt, problem.answer, problem.metadata["difficulty"]) == ("a?", "3", 2.0)


# --------------------------------------------------------------------------- metadata


def test_source_and_difficulty_metadata():
    rows = [{"question": "a?", "answer": "1", "difficulty": 3}, {"question": "b?", "answer": "2", "difficulty": 0.5}]
    task = Task.from_records(rows, name="mine", tag_source=True, difficulty_field="difficulty")
    assert [dict(p.metadata) for p in task.train] == [{"difficulty": 3.0, "source": "mine"},
                                                      {"difficulty": 0.5, "source": "mine"}]
    assert "source" not in Task.from_records(rows, name="mine").train[0].metadata  # off by default


@pytest.mark.parametrize("value", ["hard", None, True])
def test_difficulty_that_is_not_a_number(value):
    rows = [{"question": "a?", "answer": "1", "level": value}]
    with pytest.raises(DatasetError, match=r"records row 0: field 'level' must be a number or text holding one"):
        problems_from_records(rows, prompt_field="question", answer_field="answer", difficulty_field="level")


def test_missing_difficulty_field():
    with pytest.raises(DatasetError, match=r"records row 0: missing field 'level'"):
        Task.from_records([{"question": "a?", "answer": "1"}], difficulty_field="level")


# --------------------------------------------------------------------------- Hugging Face datasets


@pytest.mark.parametrize("spec, parsed", [
    ("hf:openai/gsm8k:main", ("openai/gsm8k", "main", None)),
    ("hf:openai/gsm8k:main@test", ("openai/gsm8k", "main", "test")),
    ("hf:HuggingFaceH4/MATH-500@test", ("HuggingFaceH4/MATH-500", None, "test")),
    ("hf:gsm8k", ("gsm8k", None, None)),
])
def test_parse_hf_spec(spec, parsed):
    assert parse_hf_spec(spec) == parsed


@pytest.mark.parametrize("spec", ["hf:", "hf:a:b:c", "hf:a@b@c"])
def test_bad_hf_spec(spec):
    with pytest.raises(DatasetError, match=r"write hf:NAME\[:CONFIG\]\[@SPLIT\]"):
        parse_hf_spec(spec)


@pytest.fixture
def fake_datasets(monkeypatch):
    """A stand-in `datasets` module (the hub is offline here): load_dataset records its call and returns rows."""
    calls = []

    def load_dataset(path, name=None, *, split, **kwargs):
        calls.append((path, name, split))
        return [{"question": f"{split} question {i}?", "answer": f"#### {i}"} for i in range(3)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_ids_read_train_and_test_splits(fake_datasets):
    task = Task.from_records("hf:openai/gsm8k:main", "hf:openai/gsm8k:main", name="gsm8k", prompt_template="{prompt}")
    assert fake_datasets == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert [p.prompt for p in task.train][:1] == ["train question 0?"]
    assert [p.prompt for p in task.test][:1] == ["test question 0?"]
    Task.from_records("hf:org/name@validation", test_size=1)
    assert fake_datasets[-1] == ("org/name", None, "validation")
    assert load_hf("org/x", "cfg", split="test")[2] == {"question": "test question 2?", "answer": "#### 2"}


def test_hub_id_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(DatasetError, match=r"needs the 'datasets' package \(pip install datasets\)"):
        Task.from_records("hf:openai/gsm8k:main")


def test_dataset_objects_and_split_dicts():
    rows = [{"question": "a?", "answer": "1"}]
    # a datasets.Dataset iterates as dicts, like any iterable of rows; a DatasetDict is a mapping of splits
    assert Task.from_records(iter(rows)).train[0].answer == "1"
    with pytest.raises(DatasetError, match=r"mapping of splits \(train, test\), not rows; pass one split"):
        Task.from_records({"train": rows, "test": rows})


@pytest.mark.skipif(find_spec("datasets") is None, reason="the 'datasets' package is not installed")
def test_real_datasets_object():
    import datasets

    dataset = datasets.Dataset.from_list([{"question": "a?", "answer": 1}, {"question": "b?", "answer": 2}])
    assert [p.answer for p in Task.from_records(dataset).train] == ["1", "2"]


# --------------------------------------------------------------------------- benchmarks from fixture files


@pytest.fixture
def data_dir(tmp_path):
    """A data directory in the layout and formats of the packaged one (uncompressed), a few rows per benchmark."""
    root = tmp_path / "data"
    write_jsonl(root / "gsm8k" / "train.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
        {"question": "A farm sells 1,000 eggs at $2. Revenue?", "answer": "1000*2=2000\n#### 2,000"},
        {"question": "  What is  6 times 7 ?", "answer": "#### 42"},  # same words as test row 0: dropped
    ])
    write_jsonl(root / "gsm8k" / "test.jsonl", [
        {"question": "what is 6 times 7?", "answer": "6*7=42\n#### 42"},
        {"question": "Sam reads 1,234,567 words. How many?", "answer": "#### 1,234,567"},
    ])
    write_jsonl(root / "math500" / "test.jsonl", [
        {"question": "Simplify 2/4.", "answer": "It is $\\boxed{\\frac{1}{2}}$.The answer is: \\frac{1}{2}"},
        {"question": "x?", "answer": "No box here.\nThe answer is: 5"},
    ])
    write_jsonl(root / "aime24" / "test.jsonl", [
        {"id": 60, "problem": "P1?", "question": "P1?", "solution": "...", "answer": "025", "url": "u"},
        {"id": 61, "problem": "P2?", "question": "P2?", "solution": "...", "answer": "113", "url": "u"},
    ])
    write_jsonl(root / "amc23" / "test.jsonl", [
        {"id": 0, "problem": "Q0?", "answer": 27.0, "url": "u", "question": "Q0?"},
        {"id": 1, "problem": "Q1?", "answer": 2.5, "url": "u", "question": "Q1?"},
        {"id": 2, "problem": "Q2?", "answer": -1.0, "url": "u", "question": "Q2?"},
    ])
    write_jsonl(root / "minerva_math" / "test.jsonl", [
        {"problem": "Focus?", "solution": "s=\\boxed{1.6} \\mathrm{cm}, not \\boxed{2}? no: \\boxed{\\{1, 2\\}}",
         "type": "Astronomy", "idx": 0},
    ])
    return root


def test_gsm8k_from_files(data_dir):
    task = benchmark_task("gsm8k", data_dir=data_dir)
    assert task.name == "gsm8k"
    assert [(p.id, p.answer) for p in task.train] == [("gsm8k-train-0", "7"), ("gsm8k-train-1", "2000")]
    assert [(p.id, p.answer) for p in task.test] == [("gsm8k-test-0", "42"), ("gsm8k-test-1", "1234567")]
    assert task.train[0].metadata == {"id": "gsm8k-train-0", "solution": "3+4=<<3+4=7>>7\n#### 7", "source": "gsm8k"}
    sized = benchmark_task("gsm8k", data_dir=data_dir, train_size=1, test_size=1, prompt_template="Q: {prompt}")
    assert [p.prompt for p in [*sized.train, *sized.test]] == ["Q: Tom has 3 apples and buys 4. How many?",
                                                              "Q: what is 6 times 7?"]
    (data_dir / "gsm8k" / "train.jsonl").unlink()  # train_size=0 (evaluation) does not read the training split
    held_out = benchmark_task("gsm8k", data_dir=data_dir, train_size=0)
    assert (list(held_out.train), [p.answer for p in held_out.test]) == ([], ["42", "1234567"])


def test_eval_only_benchmarks_from_files(data_dir):
    math500 = benchmark_task("math500", data_dir=data_dir)
    assert list(math500.train) == []
    assert [p.answer for p in math500.test] == ["\\frac{1}{2}", "5"]  # last \boxed{}, else "The answer is:" tail
    aime = benchmark_task("aime24", data_dir=data_dir)
    assert [(p.id, p.prompt, p.answer) for p in aime.test] == [("aime24-test-60", "P1?", "25"),
                                                              ("aime24-test-61", "P2?", "113")]
    assert "question" not in aime.test[0].metadata  # the duplicated problem text is kept once, as the prompt
    assert [p.answer for p in benchmark_task("amc23", data_dir=data_dir).test] == ["27", "2.5", "-1"]
    minerva = benchmark_task("minerva_math", data_dir=data_dir).test[0]
    assert (minerva.answer, minerva.metadata["type"], minerva.metadata["source"]) == ("\\{1, 2\\}", "Astronomy",
                                                                                      "minerva_math")
    with pytest.raises(DatasetError, match="math500 is an evaluation set without a training split"):
        benchmark_task("math500", data_dir=data_dir, train_size=10)


def test_benchmark_errors(data_dir, tmp_path):
    with pytest.raises(DatasetError, match=r"unknown benchmark 'gsm9k'; built-in: aime24, amc23, gsm8k"):
        benchmark_task("gsm9k", data_dir=data_dir)
    with pytest.raises(DatasetError, match=r"test_size=3 but the test split has 2 problems"):
        benchmark_task("gsm8k", data_dir=data_dir, test_size=3)
    write_jsonl(data_dir / "gsm8k" / "test.jsonl", [{"question": "q?", "answer": "no final line"}])
    with pytest.raises(DatasetError, match=r"gsm8k/test\.jsonl row 0: field 'answer' has no '#### N' final line"):
        benchmark_task("gsm8k", data_dir=data_dir)
    with pytest.raises(DatasetError, match=r"math500/test\.jsonl does not exist"):
        benchmark_task("math500", data_dir=tmp_path)


def test_benchmark_from_its_hub_copy(monkeypatch):
    calls = []

    def load_dataset(path, name=None, *, split):  # the fields of HuggingFaceH4/MATH-500
        calls.append((path, name, split))
        return [{"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac12}$.", "answer": "\\frac{1}{2}",
                 "subject": "Algebra", "level": 2, "unique_id": "test/algebra/1.json"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    problem = benchmark_task("math500", hub=True).test[0]
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]
    assert (problem.id, problem.prompt, problem.answer) == ("math500-test-0", "Half of 1?", "\\frac{1}{2}")
    assert problem.metadata["difficulty"] == 2.0 and problem.metadata["solution"] == "It is $\\boxed{\\frac12}$."
    benchmark_task("aime24", hub=True)
    assert calls[-1] == ("HuggingFaceH4/aime_2024", None, "train")  # its only split serves as the test set
    with pytest.raises(DatasetError, match="minerva_math has no known hub copy"):
        benchmark_task("minerva_math", hub=True)


def test_data_dir_lookup(data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("REASONRL_DATA", raising=False)
    # The default is the package's own copies, wherever the current directory is: a shared/data
    # directory above it (which an older lookup walked up to) is not picked up.
    (tmp_path / "project" / "shared" / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "project" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "a")
    assert find_data_dir() == benchmarks.PACKAGED_DATA
    assert (find_data_dir() / "gsm8k" / "test.jsonl.gz").is_file()
    assert find_data_dir().parent == Path(benchmarks.__file__).resolve().parents[1]  # reasonrl/data

    monkeypatch.setenv("REASONRL_DATA", str(data_dir))
    assert find_data_dir() == data_dir
    assert find_data_dir(tmp_path) == tmp_path  # an explicit directory wins
    monkeypatch.setenv("REASONRL_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DatasetError, match=r"\$REASONRL_DATA=.*nowhere' is not a directory"):
        find_data_dir()
    with pytest.raises(DatasetError, match=r"data_dir=.*elsewhere' is not a directory"):
        find_data_dir(tmp_path / "elsewhere")


def test_compressed_files_read_like_plain_ones(data_dir, tmp_path):
    plain = data_dir / "gsm8k" / "test.jsonl"
    packed = tmp_path / "gz" / "gsm8k" / "test.jsonl.gz"
    packed.parent.mkdir(parents=True)
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_records(packed) == read_records(plain)
    train = (data_dir / "gsm8k" / "train.jsonl").read_bytes()
    (tmp_path / "gz" / "gsm8k" / "train.jsonl.gz").write_bytes(gzip.compress(train))
    from_gz = benchmark_task("gsm8k", data_dir=tmp_path / "gz")
    assert [p.answer for p in from_gz.test] == ["42", "1234567"] and len(from_gz.train) == 2
    csv_gz = tmp_path / "rows.csv.gz"
    csv_gz.write_bytes(gzip.compress(b"question,answer\nq?,0.50\n"))
    assert read_records(csv_gz) == [{"question": "q?", "answer": "0.50"}]
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(DatasetError, match=r"broken\.jsonl\.gz: not a readable gzip file"):
        read_records(broken)
    (tmp_path / "t.parquet.gz").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"unknown file type '\.gz'"):
        read_records(tmp_path / "t.parquet.gz")


# --------------------------------------------------------------------------- benchmarks shipped in the package


def test_packaged_gsm8k_splits_are_disjoint(monkeypatch):
    monkeypatch.delenv("REASONRL_DATA", raising=False)
    task = benchmark_task("gsm8k")
    assert (len(task.train), len(task.test)) == (7473, 1319)  # the data README's row counts: no duplicate dropped
    train_ids, test_ids = {p.id for p in task.train}, {p.id for p in task.test}
    assert len(train_ids) == 7473 and len(test_ids) == 1319 and not train_ids & test_ids
    train_texts = {normalized_text(p.prompt) for p in task.train}
    assert not train_texts & {normalized_text(p.prompt) for p in task.test}
    assert [p.answer for p in task.train[:2]] == ["72", "10"]  # "#### 72", "#### 10"
    assert all(p.answer.lstrip("-").replace(".", "", 1).isdigit() for p in [*task.train, *task.test])  # no commas


def test_packaged_eval_benchmarks(monkeypatch):
    monkeypatch.delenv("REASONRL_DATA", raising=False)
    root = None
    sizes = {"math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272}
    for name, size in sizes.items():
        task = benchmark_task(name, data_dir=root)
        assert (len(task.train), len(task.test)) == (0, size), name
        assert all(p.answer and p.metadata["source"] == name for p in task.test)
    assert benchmark_task("amc23", data_dir=root).test[0].answer == "27"  # 27.0 in the file
    assert benchmark_task("math500", data_dir=root).test[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert benchmark_task("minerva_math", data_dir=root).test[0].answer == "1.6"
    assert benchmark_task("aime24", data_dir=root).test[0].answer == "204"


def test_packaged_gsm8k_contamination_report(monkeypatch):
    monkeypatch.delenv("REASONRL_DATA", raising=False)
    task = benchmark_task("gsm8k")
    report = ngram_overlap(task.train, task.test)
    # Measured once with this implementation (pinned so a change in normalisation or n-gram logic shows):
    # 3 of the 1319 test questions share a 13-gram with 4 training questions.
    assert report.contaminated_ids == ("gsm8k-test-581", "gsm8k-test-602", "gsm8k-test-632")
    assert report.train_ids == ("gsm8k-train-20", "gsm8k-train-406", "gsm8k-train-1314", "gsm8k-train-5162")
    assert report.fraction == pytest.approx(3 / 1319)
    assert len(decontaminate(task.train, task.test)) == 7473 - 4


# --------------------------------------------------------------------------- decontamination by hand


def problem(id_: str, text: str) -> Problem:
    return Problem(id=id_, prompt=text, answer="0")


TRAIN = [
    problem("A", "The quick brown fox jumps over the lazy dog near the river bank today"),  # 14 words
    problem("C", "Completely unrelated training text about apples and oranges and pears and plums here"),
]
BENCHMARK = [
    # 14 words; its 13-gram "the quick ... river bank" is A's first 13-gram
    problem("B1", "Yesterday the quick brown fox jumps over the lazy dog near the river bank"),
    # shares the 12 words "the quick ... the river" with A, then differs: no common 13-gram
    problem("B2", "The quick brown fox jumps over the lazy dog near the river then x y"),
    # A's first 13 words up to case and punctuation
    problem("B3", "THE QUICK, brown fox -- jumps over the LAZY dog; near the river bank!"),
    problem("B4", "lazy dog near"),  # under 13 words, contained in A
    problem("B5", "dog lazy"),  # under 13 words, not contained in order
    problem("B6", "azy dog near"),  # "azy" is not a word of A: containment is by whole words
]


def test_normalized_words():
    assert normalized_words("Janet’s ducks, 16!  A_B\tc") == ["janet", "s", "ducks", "16", "a", "b", "c"]


def test_ngram_overlap_by_hand():
    report = ngram_overlap(TRAIN, BENCHMARK, n=13)
    assert report.contaminated_ids == ("B1", "B3", "B4")
    assert report.train_ids == ("A",)
    assert (report.n, report.benchmark_size, report.fraction) == (13, 6, 0.5)  # 3 of 6
    # with n = 12, B2's 12 shared words are a common 12-gram too
    assert ngram_overlap(TRAIN, BENCHMARK, n=12).contaminated_ids == ("B1", "B2", "B3", "B4")
    assert ngram_overlap(TRAIN[1:], BENCHMARK).contaminated_ids == ()
    assert ngram_overlap(TRAIN, []).fraction == 0.0


def test_decontaminate_drops_the_leaking_training_problems():
    assert [p.id for p in decontaminate(TRAIN, BENCHMARK)] == ["C"]
    assert [p.id for p in decontaminate(TRAIN, BENCHMARK[4:])] == ["A", "C"]  # B5, B6 leak nothing
    chat = Problem(id="chat", prompt=[{"role": "user", "content": TRAIN[0].prompt}], answer="0")
    assert decontaminate([chat], BENCHMARK[:1]) == []  # chat prompts are compared by their contents
    with pytest.raises(ValueError, match="n must be at least 1"):
        ngram_overlap(TRAIN, BENCHMARK, n=0)


def test_registry_lists_the_benchmarks():
    assert sorted(BENCHMARKS) == ["aime24", "amc23", "gsm8k", "math500", "minerva_math"]
    assert [name for name, b in BENCHMARKS.items() if b.has_train] == ["gsm8k"]


# --------------------------------------------------------------------------- files that are not UTF-8

@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path, suffix):
    lines = {".jsonl": ['{"question": "1+1", "answer": "2"}', '{"question": "caf\xe9", "answer": "3"}'],
             ".json": ['[{"question": "1+1", "answer": "2"},', '{"question": "caf\xe9", "answer": "3"}]'],
             ".csv": ["question,answer", "caf\xe9,3"]}[suffix]
    path = tmp_path / f"data{suffix}"
    path.write_bytes("\n".join(lines).encode("latin-1"))  # é as the single byte 0xe9
    with pytest.raises(DatasetError, match=rf"data\{suffix}:2: not UTF-8 text .*b'\\xe9' at column \d+.*re-encode"):
        read_records(path)


def test_humaneval_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
    import gzip

    from reasonrl.tasks.humaneval import humaneval_task

    path = tmp_path / "HumanEval.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"task_id": "a"}\n{"task_id": "\xff"}\n'))
    with pytest.raises(DatasetError, match=r"HumanEval.jsonl.gz:2: not UTF-8 text"):
        humaneval_task(path=path)


def test_jsonl_lines_split_on_newlines_only(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "a\u2028b", "answer": "1"}\r\n{"question": "c", "answer": "2"}\n', encoding="utf-8")
    assert [row["question"] for row in read_records(path)] == ["a\u2028b", "c"]


def test_empty_answers_are_named_once_for_the_dataset():
    rows = [{"question": "1 + 1?", "answer": "2"}, {"question": "2 + 2?", "answer": ""}, {"question": "3?", "answer": " "}]
    with pytest.warns(UserWarning, match=r"my.csv: 2 of 3 rows have an empty 'answer'"):
        problems = problems_from_records(rows, prompt_field="question", answer_field="answer", source="my.csv")
    assert [p.answer for p in problems] == ["2", "", " "]  # kept: a label-free reward reads none
