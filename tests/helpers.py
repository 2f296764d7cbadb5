"""What several test modules share, importable as `helpers` (tests/ is on the path through its
conftest.py): tiny models built offline, hand-made groups and batches, scripted engines, the
letters task and the tiny training and SFT configs, the readers of a run's logs, a run directory
written by hand, the fused LM head's check on a device, and the names of the shipped recipes.
Fixtures live in conftest.py; test modules import from here, never from each other."""

from __future__ import annotations

import json
import os
import platform
import string
from pathlib import Path
from typing import Any

import pytest
import torch

from reasonrl import allocator
from reasonrl.allocator import preloaded_allocator
from reasonrl.tasks import Task
from reasonrl.types import Completion, Group, Problem

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or preloaded_allocator() is not None,
    reason="glibc's malloc only")
"""For tests of the C heap reasonrl tunes and reads (`training.runtime`): Linux with glibc serving malloc
(not another allocator preloaded)."""

INSTALLED_ALLOCATOR = next((name for name in allocator.ALLOCATORS if allocator.find_allocator(name)), None)
"""The first of reasonrl.allocator's allocators installed here (None: neither tcmalloc nor mimalloc)."""


def environment_preloading(preload: str | None) -> dict[str, str]:
    """This process's environment for a child, with LD_PRELOAD set to `preload` alone (None: unset)."""
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    return env

# --------------------------------------------------------------------------- tiny models

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tiny_model(directory: Path, *, seed: int = 0, layers: int = 2, hidden: int = 32,
                     initializer_range: float = 0.02) -> Path:
    """A random 2-layer Llama and a character-level tokenizer saved as an HF model directory."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        bos_token="<bos>", additional_special_tokens=SPECIAL_TOKENS[3:])
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True, initializer_range=initializer_range,
                         pad_token_id=vocab["<pad>"], eos_token_id=vocab["<eos>"], bos_token_id=vocab["<bos>"])
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def char_tokenizer(chars: str) -> Any:
    """A character-level tokenizer over `chars` (after <pad> and <eos>), for tokenizers that differ."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", *chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def tiny_policy(seed: int = 0) -> torch.nn.Module:
    """A random 1-layer Llama over 32 token ids, in memory (no tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


TINY_LLAMA_LAYERS = 3


def tiny_llama(mode: str, positions: int = 0) -> torch.nn.Module:
    """A random 3-layer Llama over 40 token ids with activation checkpointing `mode` (sdpa attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reasonrl.training import recompute

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=TINY_LLAMA_LAYERS, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=8, max_position_embeddings=64))
    model.set_attn_implementation("sdpa")
    recompute.enable(model, mode, positions)
    return model


def batch(completion_lengths=(2, 7, 4, 11)):
    """A train batch of one random group for `tiny_llama`: a 5-token prompt, completions of these lengths."""
    from reasonrl.training.learner import make_train_batch

    generator = torch.Generator().manual_seed(3)
    group = Group(problem=Problem(id="p", prompt="x", answer="1"),
                  prompt_ids=tuple(torch.randint(2, 40, (5,), generator=generator).tolist()),
                  completions=tuple(Completion(token_ids=tuple(torch.randint(2, 40, (n,), generator=generator).tolist()),
                                               text="", logprobs=(-1.0,) * n, finish_reason="stop")
                                    for n in completion_lengths))
    return make_train_batch([group], torch.randn(len(completion_lengths), generator=generator).tolist(), pad_id=0)


def group(prompt_ids, *completions) -> Group:
    """A group of the given prompt and completion token ids; completion token i has log-prob -0.1 (i + 1)."""
    return Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=tuple(prompt_ids),
                 completions=tuple(Completion(token_ids=tuple(ids), text="", logprobs=tuple(-0.1 * (i + 1) for i in range(len(ids))),
                                              finish_reason="stop") for ids in completions))


class CountingEngine:
    """A scripted engine that answers each problem with its id, and records each call's problems, n and seed."""

    def __init__(self):
        self.calls = []

    def generate(self, problems, sampling):
        self.calls.append(([p.id for p in problems], sampling.n, sampling.seed))
        return [Group(problem=p, prompt_ids=(0,), completions=tuple(
            Completion(token_ids=(1,), text=p.id, logprobs=(0.0,), finish_reason="stop") for _ in range(sampling.n)))
            for p in problems]


def one_call_agent(base_url, model, problem):
    """An agent written with the `openai` client: one chat call on the problem; its reward, 1 if the reply holds 'a'."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}])
    return float("a" in (reply.choices[0].message.content or ""))


class ScriptedPrefixEngine:
    """A PrefixEngine that continues every prefix with `reply(decoded prefix)` tokenised (then <eos>, within
    max_new_tokens), each token's log-prob -0.5, and records each call's prefixes and seeds."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.chat_template = tokenizer, reply, True
        self.pad_id = tokenizer.pad_token_id
        self.calls = []

    def continue_from(self, prefixes, sampling, seeds=None):
        from reasonrl.rollout.base import completion_text

        self.calls.append(([list(p) for p in prefixes], seeds))
        out = []
        for prefix in prefixes:
            ids = [*self.tokenizer(self.reply(self.tokenizer.decode(list(prefix))), add_special_tokens=False)["input_ids"],
                   self.tokenizer.eos_token_id][: sampling.max_new_tokens]
            finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
            out.append([Completion(token_ids=tuple(ids), text=completion_text(self.tokenizer, ids, sampling.stop),
                                   logprobs=(-0.5,) * len(ids), finish_reason=finish) for _ in range(sampling.n)])
        return out

    def load_weights(self, named_tensors):
        pass

    def close(self):
        pass


# --------------------------------------------------------------------------- tasks and configs

TASK = Task(name="letters",
            train=[Problem(id=str(i), prompt=f"say something {i}", answer="a") for i in range(16)],
            test=[Problem(id=f"t{i}", prompt=f"say more {i}", answer="a") for i in range(4)])


def share_of_a(completion: str, problem: Problem) -> float:
    """Reward: the fraction of the completion's characters that are the letter 'a'."""
    return completion.count("a") / len(completion) if completion else 0.0


def first_character_code(completion: str, problem: Problem) -> float:
    """A reward that differs between almost any two completions (the first character's code mod 7), so
    that every group has a spread and every step an update, whatever tokens are sampled."""
    return float(ord(completion[0]) % 7) if completion else 0.0


def negated_grpo(rewards_BG: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    from reasonrl.algo.advantages import grpo

    return -grpo(rewards_BG, eps=eps)


def tiny_config(model_dir: Path, run_dir: Path, *extra: str):
    from reasonrl import load_config

    # A tiny random model seldom stops within its 8 tokens: the default job's overlong filtering
    # (sampling.mask_truncated) would leave almost nothing to learn from, so it is off here.
    return load_config(overrides=[
        f"model.name={model_dir}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "sampling.mask_truncated=false",
        "rollout.prompts_per_step=4", "rollout.group_size=8", "rollout.max_new_tokens=8", "rollout.temperature=1.0",
        "rollout.dtype=float32", "train.dtype=float32", "train.lr=1e-2", "train.micro_batch_size=16",
        "eval.problems=0", "run.save_every=0", *extra])


def sft_config(model_dir: Path, run_dir: Path, *extra: str):
    from reasonrl import load_config

    return load_config(overrides=[f"model.name={model_dir}", f"run.dir={run_dir}", "run.progress=false",
                                  "run.tensorboard=false", "train.lr=1e-2", "train.dtype=float32", "sft.batch_size=4",
                                  "run.save_every=0", *extra])


# Preference pairs: "aaaa" chosen over "bbbb" for every prompt.
PAIRS = Task(name="prefs", train=[Problem(id=str(i), prompt=f"q{i}", answer="aaaa", metadata={"rejected": "bbbb"})
                                  for i in range(4)], test=[Problem(id="t", prompt="q", answer="aaaa")])


def mostly_a(text: str, problem: Problem) -> float:
    return float(len(text) > 0 and text.count("a") / len(text) >= 0.25)


def train_straight_and_resumed(model_dir: Path, tmp_path: Path, *extra: str) -> None:
    """4 steps in one run (tmp_path/straight), and 2 + 2 with a resume (tmp_path/resumed)."""
    from reasonrl import train

    train(tiny_config(model_dir, tmp_path / "straight", "train.steps=4", *extra), task=TASK, reward=share_of_a)
    train(tiny_config(model_dir, tmp_path / "resumed", "train.steps=2", *extra), task=TASK, reward=share_of_a)
    train(tiny_config(model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *extra),
          task=TASK, reward=share_of_a)


# --------------------------------------------------------------------------- a run's files

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_metrics(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl (steps, evaluations, summaries)."""
    return read_jsonl(run_dir / "metrics.jsonl")


def run_rollouts(run_dir: Path) -> list[dict]:
    """A run's rollouts.jsonl: one line per completion."""
    return read_jsonl(run_dir / "rollouts.jsonl")


def step_metrics(run_dir: Path) -> list[dict]:
    """The training steps' lines of a run's metrics.jsonl."""
    return [m for m in run_metrics(run_dir) if "reward/mean" in m]


def reward_curve(run_dir: Path) -> list[float]:
    return [m["reward/mean"] for m in step_metrics(run_dir)]


def checkpoint_parameters(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The policy's parameters in the run's checkpoint of `step`."""
    return parameters(run_dir / "checkpoints" / f"step_{step:06d}" / "policy")


def parameters(directory: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return {name: p.detach() for name, p in model.named_parameters()}


SCRIPT_BREAKER = "</script><script>window.pwned = 1;</script><!--"
# Step 3's completions as (problem, text, finish_reason, correct component, format component).
# correct: a, c, f; incorrect: b, d (the "</script>" one), e; truncated (finish "length"): b, c.
STEP3 = [("p1", "a: \\boxed{5}", "stop", 1.0, 0.1), ("p1", "b: 4 4 4 4", "length", 0.0, 0.0),
         ("p1", "c: \\boxed{5} and more", "length", 1.0, 0.1),
         ("p2", "d: " + SCRIPT_BREAKER, "stop", 0.0, 0.0), ("p2", "e: <b>no</b> & co", "stop", 0.0, 0.1),
         ("p2", "f: \\boxed{7}", "stop", 1.0, 0.1)]


def rollout(step: int, problem: str, text: str, finish: str, correct: float, fmt: float, advantage: float) -> dict:
    return {"step": step, "problem_id": problem, "prompt": f"What is {problem}?",
            "answer": "5" if problem == "p1" else "7", "completion": text, "finish_reason": finish,
            "num_tokens": len(text), "reward": correct + fmt,
            "components": {"correct": correct, "format": fmt}, "advantage": advantage}


def write_run(run_dir: Path) -> Path:
    """Three steps of a GRPO run: evaluations at steps 0 and 3, 2 problems x 3 completions per step."""
    import tomli_w

    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(tomli_w.dumps({
        "model": {"name": "tiny-llama"}, "task": {"name": "arithmetic"}, "algo": {"advantage": "grpo"},
        "rollout": {"group_size": 3, "prompts_per_step": 2}, "train": {"steps": 3, "lr": 1e-5}}))
    lines = [{"step": 0, "eval/greedy_accuracy": 0.25, "eval/sampled_accuracy": 0.125}]
    for step in (1, 2, 3):
        lines.append({"step": step, "reward/mean": 0.1 * step, "reward/std": 0.05, "reward/correct": 0.1 * step,
                      "reward/format": 0.05, "loss/policy": -0.01, "loss/clip_frac": 0.02 * step,
                      "kl/mean": 0.001 * step, "entropy/mean": 2.0 - 0.1 * step, "rollout/len_mean": 30.0 + step,
                      "rollout/truncated_frac": 1 / 3, "perf/tokens_per_s": 100.0, "perf/step_s": 2.0,
                      "source/accuracy/gsm8k": 0.5})
    lines.append({"step": 3, "eval/greedy_accuracy": 0.75, "eval/sampled_accuracy": 0.5})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = [rollout(step, problem, f"step {step} {problem} {i}", "stop", float(i == 0), 0.0, 0.5)
               for step in (1, 2) for problem in ("p1", "p2") for i in range(3)]
    records += [rollout(3, problem, text, finish, correct, fmt, 0.25) for problem, text, finish, correct, fmt in STEP3]
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


# --------------------------------------------------------------------------- the fused LM head


def head_problem(seed: int, rows: int = 7, hidden: int = 6, vocabulary: int = 13, dtype=torch.float64):
    """Random hidden states, head weights, target ids and upstream gradients for the fused LM head."""
    generator = torch.Generator().manual_seed(seed)
    hidden_KH = torch.randn(rows, hidden, generator=generator, dtype=dtype).requires_grad_()
    weight_VH = torch.randn(vocabulary, hidden, generator=generator, dtype=dtype).requires_grad_()
    targets_K = torch.randint(0, vocabulary, (rows,), generator=generator)
    upstream = torch.randn(2, rows, generator=generator, dtype=dtype)
    return hidden_KH, weight_VH, targets_K, upstream


def fused_head_against_the_autocast_head(monkeypatch, device: str) -> None:
    """Under bfloat16 autocast on `device`: the same log-probs and entropies bit for bit, gradients
    within bfloat16 rounding of the products."""
    from reasonrl.training import token_stats
    from reasonrl.training.token_stats import head_logprob_and_entropy, logprob_and_entropy

    monkeypatch.setattr(token_stats, "HEAD_BLOCK_ELEMENTS", 300 * 4)
    hidden_KH, weight_VH, targets_K, upstream = (t.to(device) for t in head_problem(
        6, rows=10, hidden=32, vocabulary=300, dtype=torch.float32))
    head = torch.nn.Linear(32, 300, bias=False).to(device)
    head.weight = torch.nn.Parameter(weight_VH.detach().clone())

    def run(fused: bool):
        hidden = hidden_KH.detach().clone().requires_grad_()
        head.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            if fused:
                logp_K, entropy_K = head_logprob_and_entropy(hidden, head.weight, targets_K, 0.7)
            else:
                logp_K, entropy_K = logprob_and_entropy(head(hidden), targets_K, 0.7)
        (upstream[0] @ logp_K + upstream[1] @ entropy_K).backward()
        return logp_K, entropy_K, hidden.grad, head.weight.grad.clone()

    fused, unfused = run(True), run(False)
    assert all(t.dtype == torch.float32 and t.device.type == device for t in (*fused, *unfused))
    torch.testing.assert_close(fused[0], unfused[0], atol=0, rtol=0)  # the same bfloat16 logits
    torch.testing.assert_close(fused[1], unfused[1], atol=0, rtol=0)
    torch.testing.assert_close(fused[2], unfused[2], atol=2e-2, rtol=2e-2)  # bfloat16 rounding of products
    torch.testing.assert_close(fused[3], unfused[3], atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------- recipes

# The recipes shipped in src/reasonrl/recipes/*.toml.
EXPECTED_RECIPES = {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "gmpo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
                    "remax", "opo", "ppo", "clip_cov", "kl_cov", "sapo", "dppo", "dppo_kl", "topr", "gdpo", "maxrl",
                    "luspo", "distill", "prime", "treerl", "lora"}


# --------------------------------------------------------------------------- numbers derived by hand

F64 = torch.float64


def t(values) -> torch.Tensor:
    """Values derived by hand, as a float64 tensor."""
    return torch.tensor(values, dtype=F64)


def close(actual, expected, atol=1e-6):
    """`actual` equals the hand-derived `expected` to `atol` (no relative tolerance)."""
    torch.testing.assert_close(actual, t(expected) if not isinstance(expected, torch.Tensor) else expected,
                               atol=atol, rtol=0)
