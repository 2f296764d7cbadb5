"""How many problems one engine call samples during evaluation, in training and in `reasonrl eval`.

A call decodes until its longest completion ends, so more rows share that tail: 200 problems x 1
sample took 35 s in chunks of 16 sequences and 24 s in chunks of 64 (SmolLM2-135M, 2 CPU cores).
"""

from __future__ import annotations

CHUNK_ROWS = 64  # sequences per engine call


def problems_per_chunk(samples: int, rows: int = CHUNK_ROWS) -> int:
    """Problems of `samples` completions each that make about `rows` sequences (at least one)."""
    return max(1, rows // samples)
