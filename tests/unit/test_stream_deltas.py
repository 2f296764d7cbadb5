"""Streaming deltas: what each token of an answer adds to the stream. Against the definition they
replace (the longest prefix of the final text that the decode of each prefix of the tokens agrees
with), on a byte-level BPE tokenizer whose tokens split multi-byte characters, with and without a
stop string cut from the text; and linear in the answer's length."""

from __future__ import annotations

import os
import random

import pytest
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

from reasonrl.rollout.openai_protocol import Choice
from reasonrl.rollout.openai_server import MAX_PENDING_TOKENS, CompletionBackend

WORDS = ["the", " answer", " is", " 42", " caf\u00e9", " \u65e5\u672c\u8a9e", " \U0001f600", "\n", " x", "=", "\u00e9\u00e9"]


@pytest.fixture(scope="module")
def backend() -> CompletionBackend:
    trainer = ByteLevelBPETokenizer()
    rng = random.Random(0)
    trainer.train_from_iterator(["".join(rng.choice(WORDS) for _ in range(30)) for _ in range(200)], vocab_size=300,
                                min_frequency=2, show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer)
    return CompletionBackend(tokenizer=tokenizer, chat_template=False, model_name="m", generate=None, sampling=None)


def by_prefixes(tokenizer, ids: list[int], final: str) -> list[str]:
    deltas, done = [], 0
    for k in range(1, len(ids) + 1):
        agreed = max(done, len(os.path.commonprefix([tokenizer.decode(ids[:k], skip_special_tokens=True), final])))
        deltas.append(final[done:agreed])
        done = agreed
    deltas[-1] += final[done:]
    return deltas


def choice(ids: list[int], text: str) -> Choice:
    return Choice(token_ids=tuple(ids), text=text, logprobs=(0.0,) * len(ids), finish_reason="stop")


@pytest.mark.parametrize("seed", range(20))
def test_each_token_adds_what_the_decode_of_its_prefix_adds(backend, seed):
    rng = random.Random(seed)
    text = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    ids = backend.tokenizer.encode(text)
    final = text if seed % 2 else text[:rng.randint(0, len(text))]  # odd seeds: a stop string cut from the text
    deltas = backend.deltas(choice(ids, final))
    assert "".join(deltas) == final
    assert deltas == by_prefixes(backend.tokenizer, ids, final)


def test_a_character_split_over_tokens_comes_whole(backend):
    text = " x \U0001f680 x"  # a rocket, unseen in training: its four bytes span three tokens
    ids = backend.tokenizer.encode(text)
    assert "\ufffd" in "".join(backend.tokenizer.decode([i]) for i in ids)
    deltas = backend.deltas(choice(ids, text))
    assert "".join(deltas) == text and not any("\ufffd" in delta for delta in deltas)
    assert sum("\U0001f680" in delta for delta in deltas) == 1 and deltas.count("") >= 2  # held, then whole


class CountingTokenizer:
    """The backend's tokenizer, counting the tokens it decodes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **options):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **options)


def decoded_tokens(backend, ids: list[int], text: str) -> int:
    counting = CountingTokenizer(backend.tokenizer)
    streaming = CompletionBackend(tokenizer=counting, chat_template=False, model_name="m", generate=None, sampling=None)
    assert "".join(streaming.deltas(choice(ids, text))) == text
    return counting.decoded


def test_a_long_answer_streams_in_linear_time(backend):
    """Decoding every prefix would decode n(n+1)/2 tokens (8 million here); a window, a few per token."""
    ids = backend.tokenizer.encode(" answer" * 4000)
    assert decoded_tokens(backend, ids, backend.tokenizer.decode(ids)) <= 8 * len(ids)


def test_bytes_no_token_completes_stream_in_linear_time(backend):
    """Tokens of lone UTF-8 continuation bytes never end a character: held without a bound, every token
    would decode the whole answer so far (a policy can write 16k of them)."""
    continuation = backend.tokenizer.convert_tokens_to_ids("\u00a1")  # the byte 0xA1 alone
    ids = [continuation] * 4000
    text = backend.tokenizer.decode(ids)
    assert set(text) == {"\ufffd"}
    assert decoded_tokens(backend, ids, text) <= 4 * MAX_PENDING_TOKENS * len(ids)


def byte_tokens(backend, text: bytes) -> list[int]:
    """One token per byte of `text` (the byte-level alphabet holds all 256)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    return [backend.tokenizer.convert_tokens_to_ids(alphabet[byte]) for byte in text]


HEADS = {"lone bytes": b"\xa1\xa1\xa1", "a whole e-acute then half a rocket": b"\xc3\xa9\xf0\x9f", "one": b"\xa1"}


@pytest.mark.parametrize("head", list(HEADS.values()), ids=list(HEADS))
def test_text_after_held_bytes_streams_token_by_token(backend, head):
    """A release forced by the bound keeps a character that later tokens finish whole: the stream
    goes on as before, not all in the last delta."""
    ids = byte_tokens(backend, head) + byte_tokens(backend, "\U0001f680".encode()) + backend.tokenizer.encode(" answer" * 50)
    text = backend.tokenizer.decode(ids)
    deltas = backend.deltas(choice(ids, text))
    assert "".join(deltas) == text
    assert max(len(delta) for delta in deltas) <= 8  # each " answer" as it comes, the rocket whole
    assert sum("\U0001f680" in delta for delta in deltas) == 1

