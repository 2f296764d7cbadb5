"""The rollout engine on vLLM (Kwon et al. 2023, "Efficient Memory Management for Large Language
Model Serving with PagedAttention"), for GPUs: the same RolloutEngine protocol as the hf engine.

vLLM is imported when an engine is built, never at module import, so the package works where
vLLM (a CUDA-only wheel) is absent. What RL needs from it, and how it is obtained:

- exact token ids: prompts go in as token ids (rendered by the same `prompt_token_ids` as the
  hf engine) and completions come back as the sampled ids, never re-tokenised text;
- sampling log-probs under logits / temperature: vLLM is built with
  `logprobs_mode="processed_logprobs"` and asked for `logprobs=0` (the sampled token only).
  vLLM's processed log-probs are taken *after* top-k / top-p truncation, while the learner's
  are untruncated, so this engine refuses top_k > 0 and top_p < 1 rather than train on a
  silently different distribution;
- weight sync: `load_weights` hands the learner's (name, tensor) pairs in HF naming to the
  vLLM model's own `load_weights`, which fuses q/k/v and gate/up projections itself;
- colocation with the learner on the same GPUs: `sleep()` frees the KV cache and offloads the
  weights (vLLM's sleep mode) while the learner trains, `wake()` restores them; in colocated
  mode vLLM runs in this process (V1 multiprocessing off) so that its model is reachable.

Each problem's request carries its own seed, derived from (sampling.seed, its index), so a
problem's samples do not depend on which other problems share the call. `rollout.engine=vllm`
builds it from the config (reasonrl.rollout.choice).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from reasonrl.rollout.base import PrefixContinuation
from reasonrl.seeds import problem_seed
from reasonrl.types import Completion, FinishReason, SamplingParams

# vLLM's finish reasons besides "length": "stop" covers EOS and stop strings; "abort" is an
# engine shutdown mid-request, which is an error rather than a completion.
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("the vllm rollout engine needs vLLM and a CUDA GPU: `pip install vllm` (its wheel pins "
                          "a CUDA build of torch), or use rollout.engine=hf") from exc
    return vllm


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("the vllm rollout engine needs a CUDA GPU; on CPU use rollout.engine=hf")


class VLLMEngine(PrefixContinuation):
    """RolloutEngine around a vLLM `LLM` holding a copy of the policy."""

    def __init__(self, model: str, tokenizer: Any, *, chat_template: bool = True, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.4, colocated: bool = True, max_model_len: int | None = None,
                 seed: int = 0, **llm_kwargs: Any):
        require_cuda()
        if colocated:
            # In-process engine core: its model object is then reachable for weight loading.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = import_vllm()
        self.vllm = vllm
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.colocated = colocated
        self.asleep = False
        self.llm = vllm.LLM(model=model, tokenizer=model, dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            enable_sleep_mode=colocated, logprobs_mode="processed_logprobs", **llm_kwargs)

    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """`sampling.n` continuations of each token-id prefix, taken as is; one list per prefix.
        `seeds`: one per prefix (default: derived from sampling.seed and the prefix's index)."""
        if not prefixes or any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("continue_from needs at least one prefix, and no empty prefix (nothing to continue)")
        if sampling.top_k > 0 or sampling.top_p < 1.0:
            raise ValueError("vLLM reports log-probs of the top-k/top-p truncated distribution, the learner "
                             "recomputes untruncated ones: use rollout.top_k=0 and rollout.top_p=1 with the "
                             "vllm engine")
        if self.asleep:
            raise RuntimeError("the vllm engine is asleep (its weights and KV cache are off the GPU): call wake() "
                               "before generating")
        if seeds is None:
            seeds = [problem_seed(sampling.seed, index) for index in range(len(prefixes))]
        elif len(seeds) != len(prefixes):
            raise ValueError(f"{len(seeds)} seeds for {len(prefixes)} prefixes")
        requests = [self._sampling_params(sampling, seed) for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(prefix)} for prefix in prefixes], requests,
                                    use_tqdm=False)
        return [[self._completion(sample) for sample in output.outputs] for output in outputs]

    def _sampling_params(self, sampling: SamplingParams, seed: int) -> Any:
        return self.vllm.SamplingParams(n=sampling.n, temperature=sampling.temperature,
                                        max_tokens=sampling.max_new_tokens, stop=list(sampling.stop),
                                        seed=None if sampling.greedy else seed,
                                        logprobs=0, skip_special_tokens=True, ignore_eos=sampling.ignore_eos)

    @staticmethod
    def _completion(sample: Any) -> Completion:
        if sample.finish_reason not in _FINISH:
            raise RuntimeError(f"vLLM ended a request with finish reason {sample.finish_reason!r}: the engine was "
                               "aborted or ran out of memory; lower rollout.vllm_gpu_memory_utilization or max_new_tokens")
        token_ids = tuple(sample.token_ids)
        logprobs = tuple(float(sample.logprobs[i][token].logprob) for i, token in enumerate(token_ids))
        return Completion(token_ids=token_ids, text=sample.text, logprobs=logprobs,
                          finish_reason=_FINISH[sample.finish_reason])

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The learner's weights (HF names) into vLLM's model, which maps and fuses them itself;
        the prefix cache is reset, its entries were computed with the old weights."""
        weights = []
        for name, tensor in named_tensors:
            if "lora_" in name:
                raise ValueError(f"weight {name!r} is a LoRA adapter: merge the adapters into the base weights "
                                 "before syncing to vLLM (peft's merge_and_unload on a copy)")
            weights.append((name, tensor))
        was_asleep = self.asleep
        if was_asleep:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays freed until wake()
        self._model().load_weights(weights=weights)
        self.llm.reset_prefix_cache()
        if was_asleep:
            self.llm.sleep(level=1)

    def sleep(self) -> None:
        """Free the GPU for the learner: offload the weights to CPU memory, drop the KV cache."""
        if not self.colocated:
            raise RuntimeError("sleep() needs the engine built with colocated=True (vLLM's sleep mode)")
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _model(self) -> Any:
        """vLLM's torch model in this process (colocated mode runs the engine core in-process)."""
        try:
            return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        except AttributeError:
            pass
        try:
            return self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError as exc:
            raise RuntimeError("cannot reach vLLM's model to load weights: build the engine with colocated=True "
                               "(VLLM_ENABLE_V1_MULTIPROCESSING=0), or this vLLM version moved it") from exc
