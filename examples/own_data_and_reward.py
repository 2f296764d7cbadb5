"""Train on your own problems with your own reward function (the README's example).

The same function is the reward from the command line, on a JSONL file of the same records:
`reasonrl train task.name=jsonl task.train_path=FILE reward.fn=examples/own_data_and_reward.py:exact_answer`
(the training below runs only when this file is run as a script)."""

from reasonrl import Task, load_config, train
from reasonrl.rewards import extract_answer


def exact_answer(completion: str, problem) -> float:  # any callable (text, problem) -> float
    return float(extract_answer(completion, "boxed") == problem.answer)  # the prompts ask for \boxed{}


if __name__ == "__main__":
    records = [{"question": f"What is {a} times {b}?", "answer": str(a * b)}
               for a in range(2, 12) for b in range(2, 12)]
    task = Task.from_records(records, test_size=20)  # or Task.from_records("train.jsonl", "test.jsonl")
    cfg = load_config(overrides=["train.steps=10", "run.dir=runs/own-data",
                                 "model.name=HuggingFaceTB/SmolLM2-135M-Instruct"])
    result = train(cfg, task=task, reward=exact_answer)
    print(result.eval_before, result.eval_after)
