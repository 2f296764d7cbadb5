"""AdamW's state in float32 and in 8 bits (`train.optimizer_state`): bytes held and seconds per
optimizer step for SmolLM2-135M-Instruct's weights, on this machine.

Each state's optimizer steps the model's parameters (float32, as the learner keeps them) with
random gradients: `--repeats` timed steps after an untimed first one, which makes the state. The
bytes are the state's tensors after the steps (reasonrl.training.optimizers.state_bytes), beside
what the formula for the model's shapes gives. The step times alternate between the two states
over `--rounds` rounds, so that a machine whose speed drifts shows in both. Writes
benchmarks/results/optimizer_state.json.

    python -m benchmarks.optimizer_state [--repeats 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

from benchmarks.common import code_version, machine, write_report
from reasonrl.models import SMOLLM2_ID, load_model
from reasonrl.training.optimizers import MIN_8BIT_SIZE, STATES, adamw, state_bytes

GIB = 1024**3


def expected_bytes(params: list[torch.nn.Parameter], state: str) -> int:
    """Two moments a weight: 4 bytes each in float32; in 8 bits, for tensors of MIN_8BIT_SIZE values
    or more, 1 byte each plus a float32 scale per block of 256 and a 256-entry float32 map per moment.
    The 4-byte step counter torch keeps per tensor is counted too."""
    total = 0
    for p in params:
        n = p.numel()
        if state == "8bit" and n >= MIN_8BIT_SIZE:
            total += 2 * n + 2 * 4 * math.ceil(n / 256) + 2 * 256 * 4
        else:
            total += 8 * n + (4 if state == "float32" else 0)
    return total


def step_seconds(optimizer: torch.optim.Optimizer, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    model = load_model(SMOLLM2_ID, dtype=torch.float32, device=torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizers = {state: adamw(params, lr=1e-7, betas=(0.9, 0.999), weight_decay=0.0, state=state,
                               device=torch.device("cpu")) for state in STATES}
    for optimizer in optimizers.values():
        optimizer.step()  # makes the state
    seconds: dict[str, list[float]] = {state: [] for state in STATES}
    for _ in range(args.rounds):
        for state, optimizer in optimizers.items():
            seconds[state] += step_seconds(optimizer, args.repeats)
    results = {state: {"state_gib": state_bytes(optimizers[state]) / GIB,
                       "formula_gib": expected_bytes(params, state) / GIB,
                       "step_s_median": statistics.median(seconds[state]), "step_s": seconds[state]}
               for state in STATES}
    report = {"what": __doc__.split("\n\n")[0], "parameters": sum(p.numel() for p in params),
              "settings": {"repeats": args.repeats, "rounds": args.rounds, "min_8bit_size": MIN_8BIT_SIZE},
              **results,
              "state_ratio": results["8bit"]["state_gib"] / results["float32"]["state_gib"],
              "state_saved_gib": results["float32"]["state_gib"] - results["8bit"]["state_gib"],
              "step_s_added": results["8bit"]["step_s_median"] - results["float32"]["step_s_median"],
              "commit": code_version(), "machine": machine()}
    write_report("optimizer_state", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
