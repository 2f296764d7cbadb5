"""What best_of_n ranks by (mean log-prob, the verifier, a reward model) and confidence-weighted
self-consistency, through `eval.run.task_metrics` on scripted groups whose answers are known."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from reasonrl.commands.eval import best_of_n_scorer
from reasonrl.eval.run import EvalSettings, mean_logprob_scores, task_metrics, verifier_scores
from reasonrl.rewards import MathReward, WeightedReward, score_groups
from reasonrl.types import Completion, Group, Problem

torch.set_num_threads(1)

PROBLEM = Problem(id="p0", prompt="2+3?", answer="5")


def completion(text: str, logprobs: tuple[float, ...]) -> Completion:
    return Completion(token_ids=tuple(range(len(logprobs))), text=text, logprobs=logprobs, finish_reason="stop")


# One right answer against two wrong ones that agree. Confidences exp(mean log-prob):
# "5": exp(-0.1) = .905; the "7"s: exp(-1) = .368 and exp(-2) = .135, together .503 < .905.
GROUP = Group(problem=PROBLEM, prompt_ids=(), completions=(
    completion("5", (-0.1, -0.1)), completion("7", (-1.0,)), completion("7", (-2.0,))))
SETTINGS = EvalSettings(n=3, ks=(3,), tts=("majority", "weighted_majority", "best_of_n"), budgets=(3,))


def accuracies(score_fn) -> dict[str, float]:
    [scored] = score_groups([GROUP], WeightedReward({"correct": (MathReward(), 1.0)}))
    found = task_metrics([scored], SETTINGS, score_fn)["tts"]
    assert all(rows[0]["samples"] == 3.0 and rows[0]["tokens"] == pytest.approx(3 * 4 / 3) for rows in found.values())
    return {method: rows[0]["accuracy"] for method, rows in found.items()}


def test_confidence_weighting_outvotes_a_less_confident_majority() -> None:
    assert math.exp(-0.1) > math.exp(-1.0) + math.exp(-2.0)
    # majority: "7" has 2 votes, wrong. weighted: "5" .905 > .503, right. best_of_n by mean log-prob:
    # -0.1 is the highest, the "5", right.
    assert accuracies(mean_logprob_scores) == {"majority": 0.0, "weighted_majority": 1.0, "best_of_n": 1.0}


def test_a_scorer_changes_best_of_n_only() -> None:
    # A reward model that likes the first "7" best: best_of_n is wrong, the confidence-weighted vote is not.
    assert accuracies(lambda group: [0.1, 0.9, 0.2]) == {"majority": 0.0, "weighted_majority": 1.0, "best_of_n": 0.0}
    # The verifier (the gold-answer check) as the scorer picks the right one: pass@n.
    assert accuracies(verifier_scores)["best_of_n"] == 1.0
    with pytest.raises(ValueError, match="not scored"):
        verifier_scores(GROUP)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.5)
    directory = tmp_path_factory.mktemp("tiny-rm")
    LlamaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_reward_model_directory_scores_best_of_n(reward_model_dir: Path) -> None:
    from reasonrl.rewards.judge import ClassifierReward

    score_fn = best_of_n_scorer(str(reward_model_dir), None, SETTINGS)
    scores = score_fn(GROUP)
    expected = ClassifierReward.from_pretrained(str(reward_model_dir)).score_group(PROBLEM, GROUP.completions)
    assert scores == pytest.approx(expected, abs=1e-6)
    assert max(scores) - min(scores) > 1e-4  # the reward model tells the completions apart
    # best_of_n at budget 3 is right exactly when the reward model ranks the "5" (completion 0) first.
    assert accuracies(score_fn)["best_of_n"] == float(scores.index(max(scores)) == 0)


def test_unknown_scorer_is_named() -> None:
    with pytest.raises(ValueError, match="neither logprob, verifier, prm nor a reward model directory"):
        best_of_n_scorer("nope", None, SETTINGS)


def test_partial_credit_is_no_pass() -> None:
    # reasoning-gym's partial credit ("= 5" against 5 scores 0.5) is not a solution: pass@3 counts
    # a problem only when one of its samples scored full credit.
    from dataclasses import replace

    partial = replace(GROUP, rewards=(0.5, 0.0, 0.25), reward_components={"correct": (0.5, 0.0, 0.25)})
    settings = EvalSettings(n=3, ks=(3,))
    assert task_metrics([partial], settings, mean_logprob_scores)["pass@3"]["value"] == 0.0
    solved = replace(partial, reward_components={"correct": (1.0, 0.0, 0.25)})
    assert task_metrics([solved], settings, mean_logprob_scores)["pass@3"]["value"] == 1.0


def test_checks_stopped_at_their_bound_are_counted_in_the_results() -> None:
    from dataclasses import replace

    [scored] = score_groups([GROUP], WeightedReward({"correct": (MathReward(), 1.0)}))
    assert task_metrics([scored], SETTINGS, mean_logprob_scores)["timeouts"] == 0
    stopped = [replace(scored, reward_timeouts=2), replace(scored, problem=replace(PROBLEM, id="p1"), reward_timeouts=1)]
    assert task_metrics(stopped, SETTINGS, mean_logprob_scores)["timeouts"] == 3


def test_answer_comparisons_cut_at_their_budget_are_counted_in_the_results(monkeypatch) -> None:
    from reasonrl.eval import run
    from reasonrl.rewards import unsupervised

    [scored] = score_groups([GROUP], WeightedReward({"correct": (MathReward(), 1.0)}))
    assert task_metrics([scored], SETTINGS, mean_logprob_scores)["vote_timeouts"] == 0
    # A budget already spent: "5" and "7" are not equal as text, so the group counts once.
    monkeypatch.setattr(run, "answer_clusters", lambda answers: unsupervised.answer_clusters(answers, budget_s=0.0))
    found = task_metrics([scored, scored], SETTINGS, mean_logprob_scores)
    assert found["vote_timeouts"] == 2 and found["timeouts"] == 0
