"""Shared fixtures: a tiny random Llama with a character-level tokenizer, built offline; and how
the suite shares the machine when pytest-xdist runs it in several processes (`make test`)."""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist each worker process takes its share of the cores, so that N workers do not
# run N times as many compute threads as there are cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

# Under pytest-xdist (`make test`), the Ray modules share one worker: each starts a local Ray
# instance sized to the machine (`--dist loadgroup` keeps a group on one worker). The sandbox
# modules check that no sandbox process or directory outlives a test anywhere on the machine, which
# a sandboxed program of a test in another worker would break: they are marked `serial`, and
# `make test` runs them after the others, alone.
_RAY_MODULES = ("test_ray.py", "test_scale_train.py", "test_ray_init.py")
_SERIAL_MODULES = ("test_sandbox.py", "test_sandbox_attacks.py", "test_code_reward.py")


@pytest.hookimpl(tryfirst=True)  # before -m selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif item.path.name in _SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)

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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
