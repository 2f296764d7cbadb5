"""`reasonrl eval` generates its problems in chunks of about 64 sequences (eval/run.py): how many
problems a chunk holds, that the engine is called with exactly those chunks, and that the cache key
changes with the chunking (a chunk's seed comes from its first problem) and with the model."""

from __future__ import annotations

from tqdm import tqdm

from reasonrl.eval.cache import CompletionCache
from reasonrl.eval.run import EvalSettings, _generate_cached
from reasonrl.types import Completion, Group, Problem


def test_a_chunk_holds_about_64_sequences_or_what_is_asked():
    assert [EvalSettings(n=n).problems_per_chunk for n in (1, 4, 8, 100)] == [64, 16, 8, 1]
    assert EvalSettings(n=1, chunk_size=5).problems_per_chunk == 5


def test_the_cache_key_names_the_chunking_and_the_model():
    assert EvalSettings(n=4).sampling_key("m") == EvalSettings(n=4, chunk_size=16).sampling_key("m")
    assert EvalSettings(n=4).sampling_key("m") != EvalSettings(n=4, chunk_size=32).sampling_key("m")
    assert EvalSettings(n=4).sampling_key("m") != EvalSettings(n=4).sampling_key("other model")


def test_the_engine_is_called_once_per_chunk(tmp_path):
    class RecordingEngine:
        def __init__(self):
            self.calls = []

        def generate(self, problems, sampling):
            self.calls.append(len(problems))
            return [Group(p, (1,), tuple(Completion((2,), "x", (0.0,), "stop") for _ in range(sampling.n)))
                    for p in problems]

    settings = EvalSettings(n=1, max_new_tokens=4)
    problems = [Problem(f"p{i}", "q", "a") for i in range(150)]
    engine = RecordingEngine()
    cache = CompletionCache(tmp_path / "completions.jsonl", settings.sampling_key("model"))
    groups = _generate_cached(engine, "task", problems, settings, cache, tqdm(disable=True))
    assert engine.calls == [64, 64, 22] and [g.problem.id for g in groups] == [p.id for p in problems]


def test_a_cached_episode_keeps_its_record(tmp_path):
    """An agent episode read back from the cache scores as it did: its turns, verdict and the checks its
    verifier stopped (reported as `timeouts`)."""
    from reasonrl.agents.engine import Episode, EpisodeCompletion, Turn

    episode = Episode(turns=(Turn(0, 2, 1.0, "valid", 3),), correct=1.0, done=True, timeouts=2)
    completion = EpisodeCompletion(token_ids=(5, 6, 7, 8, 9), text="hi", logprobs=(-0.1,) * 5, finish_reason="stop",
                                   loss_mask=(1, 1, 0, 0, 0), episode=episode)
    problem = Problem(id="p", prompt="q", answer="a")
    CompletionCache(tmp_path / "c.jsonl", "key").put("task", Group(problem=problem, prompt_ids=(1,),
                                                                   completions=(completion,)))
    [read] = CompletionCache(tmp_path / "c.jsonl", "key").get("task", problem).completions
    assert read == completion and read.episode.timeouts == 2
