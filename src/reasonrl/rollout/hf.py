"""Reference rollout engine on a transformers causal LM (CPU or CUDA).

A hand-written decode loop rather than `model.generate`, because RL needs what `generate` does
not give cheaply: the log-probability of each sampled token under the tempered distribution,
each prompt prefilled once and its KV cache shared by the G samples of its group, and finished
sequences dropped from the batch as soon as they end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from reasonrl.rollout.base import prompt_token_ids
from reasonrl.types import Completion, Group, Problem, SamplingParams


def sample_next_tokens(logits_NV: torch.Tensor, sampling: SamplingParams,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-probability under logits / temperature (untruncated).

    top-k / top-p only restrict which tokens can be drawn; the reported log-prob is the one the
    learner recomputes from the same logits and temperature. Drawing is the Gumbel-max trick
    (argmax of z - log E, E ~ Exp(1)), which samples softmax(z) exactly in fewer passes over
    the vocabulary than softmax + multinomial.
    """
    scaled_NV = logits_NV.float()
    if not sampling.greedy:
        scaled_NV = scaled_NV / sampling.temperature
    log_normaliser_N1 = torch.logsumexp(scaled_NV, dim=-1, keepdim=True)
    if sampling.greedy:
        tokens_N = scaled_NV.argmax(dim=-1)
    else:
        candidates_NV = scaled_NV
        if 0 < sampling.top_k < scaled_NV.shape[-1]:
            kth_N1 = torch.topk(scaled_NV, sampling.top_k, dim=-1).values[:, -1:]
            candidates_NV = candidates_NV.masked_fill(candidates_NV < kth_N1, float("-inf"))
        if sampling.top_p < 1.0:
            candidates_NV = _nucleus(candidates_NV, sampling.top_p)
        noise_NV = torch.empty_like(candidates_NV).exponential_(generator=generator)
        tokens_N = (candidates_NV - noise_NV.log_()).argmax(dim=-1)
    logp_N = (scaled_NV.gather(1, tokens_N[:, None]) - log_normaliser_N1).squeeze(1)
    return tokens_N, logp_N


def _nucleus(logits_NV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_NV, order_NV = torch.sort(logits_NV, dim=-1, descending=True)
    probs_NV = torch.softmax(sorted_NV, dim=-1)
    mass_before_NV = probs_NV.cumsum(dim=-1) - probs_NV
    sorted_NV = sorted_NV.masked_fill(mass_before_NV > top_p, float("-inf"))
    return logits_NV.scatter(1, order_NV, sorted_NV)


class HFEngine:
    """RolloutEngine around a transformers causal LM it owns (a copy of the policy)."""

    def __init__(self, model: Any, tokenizer: Any, *, chat_template: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_token_ids(model, tokenizer)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise KeyError(f"the engine's model has no weight named {name!r}: "
                                   "the learner and the engine must hold the same architecture")
                params[name].copy_(tensor)

    def prompt_ids(self, problem: Problem) -> list[int]:
        return prompt_token_ids(self.tokenizer, problem, chat_template=self.chat_template)

    @torch.inference_mode()
    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        prompts = [self.prompt_ids(p) for p in problems]
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        tokens, logprobs, finish = self._decode(prompts, sampling, generator)
        groups = []
        for b, problem in enumerate(problems):
            completions = []
            for i in range(b * sampling.n, (b + 1) * sampling.n):
                completions.append(Completion(token_ids=tuple(tokens[i]), text=self._text(tokens[i], sampling.stop),
                                              logprobs=tuple(logprobs[i]), finish_reason=finish[i]))
            groups.append(Group(problem=problem, prompt_ids=tuple(prompts[b]), completions=tuple(completions)))
        return groups

    def _text(self, ids: list[int], stop: tuple[str, ...]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    def _decode(self, prompts: list[list[int]], sampling: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Sample sampling.n continuations of every prompt; row b*n + g is sample g of prompt b."""
        n, device = sampling.n, self.device
        width = max(len(p) for p in prompts)
        input_ids_BP = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=device)
        attention_BP = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids_BP, attention_mask=attention_BP,
                         position_ids=(attention_BP.cumsum(1) - 1).clamp(min=0),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        # Prefill once per prompt, then let the group's samples share that cache.
        cache.batch_repeat_interleave(n)
        logits_NV = out.logits[:, -1].repeat_interleave(n, dim=0)
        attention_NS = attention_BP.repeat_interleave(n, dim=0)
        position_N = attention_NS.sum(1)
        rows = len(prompts) * n
        active_N = torch.arange(rows, device=device)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        stop_check = _StopChecker(self.tokenizer, sampling.stop)
        for step in range(sampling.max_new_tokens):
            next_N, logp_N = sample_next_tokens(logits_NV, sampling, generator)
            active_rows = active_N.tolist()
            for row, token, logp in zip(active_rows, next_N.tolist(), logp_N.tolist()):
                tokens[row].append(token)
                logprobs[row].append(logp)
                if token in self.eos_ids or stop_check.hit(tokens[row]):
                    finish[row] = "stop"
            keep = [finish[row] == "length" for row in active_rows]
            if step + 1 == sampling.max_new_tokens or not any(keep):
                break
            if not all(keep):
                kept_N = torch.tensor(keep, device=device).nonzero().squeeze(1)
                cache.batch_select_indices(kept_N)
                active_N, next_N = active_N[kept_N], next_N[kept_N]
                attention_NS, position_N = attention_NS[kept_N], position_N[kept_N]
            attention_NS = torch.cat([attention_NS, attention_NS.new_ones(len(active_N), 1)], dim=1)
            out = self.model(input_ids=next_N[:, None], attention_mask=attention_NS, position_ids=position_N[:, None],
                             past_key_values=cache, use_cache=True)
            logits_NV = out.logits[:, -1]
            position_N = position_N + 1
        return tokens, logprobs, finish


class _StopChecker:
    """Whether a completion's decoded tail contains a stop string (decoding only the tail)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.tail_tokens = max((len(s) for s in stop), default=0) + 2

    def hit(self, ids: list[int]) -> bool:
        if not self.stop:
            return False
        tail = self.tokenizer.decode(ids[-self.tail_tokens:], skip_special_tokens=True)
        return any(s in tail for s in self.stop)


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return frozenset(ids)
