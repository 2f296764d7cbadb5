"""The in-training evaluation (reasonrl.eval.evaluate): generation in chunks of about chunk_rows
sequences per mode, each chunk with its own seed, and accuracies over every problem."""

from __future__ import annotations

from helpers import CountingEngine  # answers each problem with its id

from reasonrl.eval import evaluate
from reasonrl.rewards import WeightedReward
from reasonrl.types import Problem


def test_each_mode_generates_chunks_of_about_chunk_rows_sequences_with_one_seed_each():
    engine = CountingEngine()
    problems = [Problem(id=str(i), prompt="p", answer=str(i) if i % 2 else "no") for i in range(10)]
    correct = WeightedReward({"correct": (lambda completion, problem: float(completion == problem.answer), 1.0)})
    metrics = evaluate(engine, problems, correct, temperature=0.7, samples=4, greedy=True, max_new_tokens=8,
                       seed=5, chunk_rows=8, progress=False)
    greedy, sampled = engine.calls[:2], engine.calls[2:]
    # Greedy: one sequence per problem, 8 problems a chunk; sampled: 4 per problem, 2 problems a chunk.
    assert greedy == [([str(i) for i in range(8)], 1, 0), (["8", "9"], 1, 1)]
    assert sampled == [([str(i), str(i + 1)], 4, 5 + i // 2) for i in range(0, 10, 2)]
    assert metrics["eval/greedy_accuracy"] == metrics["eval/sampled_accuracy"] == 0.5
