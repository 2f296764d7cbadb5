"""Where one decode step of reasonrl's engine spends its time, in three parts that add up to the step:
the captured decode graph (rollout/cuda_graph.py), drawing the next tokens from the logits
(rollout/next_token.py, with the copy of the tokens to the host that the decode loop waits for), and
what is left of the engine's measured step, the host's own work between steps. Inside the graph, the
same step run eagerly under torch's profiler gives each operator's device time and the number of
kernels a step launches, which is what a graph replays.

Two candidate changes to the step are timed beside it, as graphs of the same step (exploratory: what
a change to rollout/fused.py would buy, measured before making it):
- `sdpa`: attention through `F.scaled_dot_product_attention` (one fused kernel over the cache, a
  boolean mask) instead of batched products, a float32 softmax and casts;
- `compiled` (at one shape, chosen by the caller): the whole step through `torch.compile` (inductor
  fuses the elementwise operators between the matrix products), then captured as before; the compile
  falls in its first step, whose seconds are recorded.
Each variant's logits are compared with the step's own (`max_logit_diff`).

Why by hand: the engine's step is measured end to end by benchmarks/gpu_sizes.py; this splits it.
The profiler alone would hide the split, since it cannot attribute time inside a graph replay to
the operators that were captured.

`profile_decode_step(model, rows, prompt_tokens, new_tokens, device)` is one record of
benchmarks/gpu_sizes.py's `profile` part; on a CPU (its smoke run) there is no graph: the profile
reads CPU time, and only the `sdpa` variant's logits are compared.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import seconds_of

TOP_OPERATORS = 12


def profile_decode_step(model, rows: int, prompt_tokens: int, new_tokens: int, device: torch.device,
                        steps: int = 32, compile_too: bool = False) -> dict[str, Any]:
    """Milliseconds per decode step of the graph and of sampling at `rows` rows, a cache of the
    capacity the engine gives (prompt + new tokens: a captured step attends to all of it), the eager
    step's operators by device time, and the variants' graphs (`compiled` only with `compile_too` on
    CUDA: a compile costs tens of seconds a shape)."""
    from reasonrl.rollout.next_token import sample_next_tokens
    from reasonrl.types import SamplingParams

    start = Prefilled(model, rows, prompt_tokens, new_tokens, device)
    sampling = SamplingParams(n=min(8, rows), temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    uniform_N = torch.rand(rows, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def sample() -> None:
        next_N, logp_N = sample_next_tokens(start.logits_NV, sampling, uniform_N)
        next_N.tolist(), logp_N.tolist()  # the decode loop reads both on the host every step

    sample()
    sampling_ms = 1e3 * seconds_of(lambda: [sample() for _ in range(steps)], device) / steps
    decoder, cache = start.decoder, start.cache
    timings, reference = graph_step_ms(decoder, cache, start, steps) if device.type == "cuda" else ({}, None)
    record = {"rows": rows, "capacity": cache.capacity, "graph_ms": timings.get("graph_ms"),
              "first_step_s": timings.get("first_step_s"), "sampling_ms": sampling_ms,
              **eager_operators(decoder, cache, start, device)}
    variants = {"sdpa": with_sdpa_attention}
    if device.type == "cuda" and compile_too:
        variants["compiled"] = compiled
    record["variants"] = {name: variant_record(start, change, reference, steps) for name, change in variants.items()}
    return record


class Prefilled:
    """The state every measurement starts from: `rows` rows of random prompts prefilled into a fresh
    cache, and the logits of their last position; `decoder` and `cache` are the first such pair, the
    step's own (`fresh` makes more, for the variants)."""

    def __init__(self, model, rows: int, prompt_tokens: int, new_tokens: int, device: torch.device):
        generator = torch.Generator().manual_seed(0)
        self.model, self.capacity = model, prompt_tokens + new_tokens
        self.prompt_NP = torch.randint(0, model.config.vocab_size, (rows, prompt_tokens), generator=generator).to(device)
        self.positions_NP = torch.arange(prompt_tokens, device=device).expand(rows, -1)
        self.decoder, self.cache = self.fresh()
        self.tokens_N = self.logits_NV.argmax(dim=-1)
        self.position_N = torch.full((rows,), prompt_tokens, device=device)

    def fresh(self):
        """A new decoder and its cache holding the prefilled prompts (also sets `logits_NV`)."""
        from reasonrl.rollout.fused import FusedDecoder

        decoder = FusedDecoder(self.model)
        cache = decoder.new_cache(len(self.prompt_NP), self.capacity)
        self.logits_NV = decoder.forward(self.prompt_NP, self.positions_NP, torch.ones_like(self.prompt_NP,
                                                                                               dtype=torch.bool), cache)
        return decoder, cache


def graph_step_ms(decoder, cache, start: Prefilled, steps: int) -> tuple[dict[str, float], torch.Tensor]:
    """Milliseconds per replay of the captured step and seconds of the first step (the capture, and
    any compilation before it), and the logits of that first step."""
    from reasonrl.rollout.cuda_graph import CapturedDecode

    device = start.tokens_N.device
    captured = CapturedDecode(decoder, cache)
    first: list[torch.Tensor] = []
    first_step_s = seconds_of(lambda: first.append(captured.step(start.tokens_N, start.position_N).clone()), device)
    replay_s = seconds_of(lambda: [captured.step(start.tokens_N, start.position_N) for _ in range(steps)], device)
    return {"graph_ms": 1e3 * replay_s / steps, "first_step_s": first_step_s}, first[0]


def eager_step(decoder, cache, start: Prefilled) -> torch.Tensor:
    column_1 = torch.full((1,), cache.length, dtype=torch.long, device=start.tokens_N.device)
    return decoder.decode_in_place(start.tokens_N[:, None], start.position_N[:, None], column_1, cache)


def variant_record(start: Prefilled, change, reference: torch.Tensor | None, steps: int) -> dict[str, Any]:
    """A variant's graph timings (on CUDA) and how far its first step's logits are from the step's
    own; on a CPU, one eager step of each. A variant that fails records its error."""
    try:
        decoder, cache = start.fresh()
        change(decoder)
        if reference is None:
            got = eager_step(decoder, cache, start)
            expected = eager_step(*start.fresh(), start)
            return {"graph_ms": None, "max_logit_diff": (got.float() - expected.float()).abs().max().item()}
        timings, first = graph_step_ms(decoder, cache, start, steps)
        return timings | {"max_logit_diff": (first.float() - reference.float()).abs().max().item()}
    except Exception as error:  # noqa: BLE001 (an exploratory variant must not stop the measurements after it)
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def with_sdpa_attention(decoder) -> None:
    """The decoder's attention as one `scaled_dot_product_attention` call: the R query heads that
    share a key head stay grouped as R query rows, and the additive mask becomes a boolean one, made
    by the step's first layer and reused by the others (the mask is one tensor per step)."""
    converted: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def attend(self, q_BRD, keys_NKSD, values_NKSD, mask_BRS):
        n, k, columns, d = keys_NKSD.shape
        key = (mask_BRS.data_ptr(), tuple(mask_BRS.shape))
        if key not in converted:
            converted.clear()
            converted[key] = mask_BRS == 0
        context = F.scaled_dot_product_attention(q_BRD.view(n, k, -1, d), keys_NKSD, values_NKSD,
                                                 attn_mask=converted[key].view(n, k, -1, columns), scale=self.scaling)
        return context.reshape(n * k, -1, d)

    decoder._attend = types.MethodType(attend, decoder)


def compiled(decoder) -> None:
    """The decode step through torch.compile (inductor's default mode, static shapes), still captured
    by CapturedDecode: the compilation happens in the first step, whose seconds are recorded."""
    decoder.decode_in_place = torch.compile(decoder.decode_in_place, dynamic=False)


def eager_operators(decoder, cache, start: Prefilled, device: torch.device, steps: int = 3) -> dict[str, Any]:
    """The eager decode step (the graph's kernels, launched one by one) under the profiler: kernels per
    step, their total time per step, and the operators that take most of it."""
    from torch.profiler import ProfilerActivity, profile

    column_1 = torch.full((1,), cache.length, dtype=torch.long, device=device)

    def step() -> None:
        decoder.decode_in_place(start.tokens_N[:, None], start.position_N[:, None], column_1, cache)

    step()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    time_of = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    operators = [e for e in profiler.key_averages() if e.key.startswith("aten::") and time_of(e) > 0]
    operators.sort(key=time_of, reverse=True)
    kernels = [e for e in profiler.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "kernels_per_step": len(kernels) / steps if cuda else None,
        "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3 / steps if cuda else None,
        "operators": [{"name": e.key, "calls": e.count / steps, "ms": time_of(e) / 1e3 / steps}
                      for e in operators[:TOP_OPERATORS]],
    }
