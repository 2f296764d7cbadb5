"""Where one decode step of reasonrl's engine spends its time, in three parts that add up to the step:
the captured decode graph (rollout/cuda_graph.py), drawing the next tokens from the logits
(rollout/next_token.py, with the copy of the tokens to the host that the decode loop waits for), and
what is left of the engine's measured step, the host's own work between steps. Inside the graph, the
same step run eagerly under torch's profiler gives each operator's device time and the number of
kernels a step launches, which is what a graph replays.

Why by hand: the engine's step is measured end to end by benchmarks/gpu_sizes.py; this splits it.
The profiler alone would hide the split, since it cannot attribute time inside a graph replay to
the operators that were captured.

`profile_decode_step(model, rows, prompt_tokens, new_tokens, device)` is one record of
benchmarks/gpu_sizes.py's `profile` part; on a CPU (its smoke run) there is no graph, and the
profile reads CPU time.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import seconds_of

TOP_OPERATORS = 12


def profile_decode_step(model, rows: int, prompt_tokens: int, new_tokens: int, device: torch.device,
                        steps: int = 32) -> dict[str, Any]:
    """Milliseconds per decode step of the graph and of sampling at `rows` rows, a cache of the
    capacity the engine gives (prompt + new tokens: a captured step attends to all of it), and the
    eager step's operators by device time."""
    from reasonrl.rollout.fused import FusedDecoder
    from reasonrl.rollout.next_token import sample_next_tokens
    from reasonrl.types import SamplingParams

    decoder = FusedDecoder(model)
    cache = decoder.new_cache(rows, prompt_tokens + new_tokens)
    generator = torch.Generator(device="cpu").manual_seed(0)
    prompt_NP = torch.randint(0, model.config.vocab_size, (rows, prompt_tokens), generator=generator).to(device)
    positions_NP = torch.arange(prompt_tokens, device=device).expand(rows, -1)
    logits_NV = decoder.forward(prompt_NP, positions_NP, torch.ones_like(prompt_NP, dtype=torch.bool), cache)
    tokens_N = logits_NV.argmax(dim=-1)
    position_N = torch.full((rows,), prompt_tokens, device=device)
    sampling = SamplingParams(n=min(8, rows), temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    uniform_N = torch.rand(rows, generator=generator, dtype=torch.float64)

    def sample() -> None:
        next_N, logp_N = sample_next_tokens(logits_NV, sampling, uniform_N)
        next_N.tolist(), logp_N.tolist()  # the decode loop reads both on the host every step

    sample()
    sampling_ms = 1e3 * seconds_of(lambda: [sample() for _ in range(steps)], device) / steps
    graph_ms = None
    if device.type == "cuda":
        from reasonrl.rollout.cuda_graph import CapturedDecode

        captured = CapturedDecode(decoder, cache)
        captured.step(tokens_N, position_N)  # captures
        graph_ms = 1e3 * seconds_of(lambda: [captured.step(tokens_N, position_N) for _ in range(steps)], device) / steps
    return {"rows": rows, "capacity": cache.capacity, "graph_ms": graph_ms, "sampling_ms": sampling_ms,
            **eager_operators(decoder, cache, tokens_N, position_N, device)}


def eager_operators(decoder, cache, tokens_N: torch.Tensor, position_N: torch.Tensor, device: torch.device,
                    steps: int = 3) -> dict[str, Any]:
    """The eager decode step (the graph's kernels, launched one by one) under the profiler: kernels per
    step, their total time per step, and the operators that take most of it."""
    from torch.profiler import ProfilerActivity, profile

    column_1 = torch.full((1,), cache.length, dtype=torch.long, device=device)
    step = lambda: decoder.decode_in_place(tokens_N[:, None], position_N[:, None], column_1, cache)
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
