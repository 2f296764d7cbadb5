"""The HBM bound of benchmarks/gpu_sizes.py, against bytes counted by hand for a tiny Qwen2 shape."""

from __future__ import annotations

import pytest
import torch
from benchmarks.gpu_sizes import hbm_bound_s, kv_bytes_per_position, qwen_config, random_model, weight_bytes_per_step

# hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16, vocabulary 100.
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
# Per layer: q 64x64 + 64 bias, k and v 64x32 + 32 bias each, o 64x64, gate/up/down 3 x 64x128, two norms of 64.
LAYER = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
READ_PER_STEP = 2 * (2 * LAYER + 64 + 100 * 64)  # bf16: the layers, the final norm, the head (100 x 64)


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_step_reads_every_matrix_and_the_head_but_not_the_embedding_table(tied):
    model = random_model(qwen_config(SHAPE | {"tie_word_embeddings": tied}, vocab=100), torch.bfloat16,
                         torch.device("cpu"))
    # Tied or not, a step reads the same bytes: the table once, as the head.
    assert weight_bytes_per_step(model) == READ_PER_STEP == 161_408


def test_the_bound_adds_each_rows_cache_at_its_length():
    model = random_model(qwen_config(SHAPE | {"tie_word_embeddings": True}, vocab=100), torch.bfloat16,
                         torch.device("cpu"))
    per_position = 2 * 2 * 2 * 16 * 2  # layers x (K, V) x KV heads x head size x 2 bytes
    assert kv_bytes_per_position(model.config, torch.bfloat16) == per_position == 256
    # 2 rows, prompts of 3, 2 new tokens: the steps read 3 and 4 positions a row.
    cache = 2 * (3 + 4) * per_position
    assert hbm_bound_s(model, rows=2, prompt_tokens=3, new_tokens=2, bandwidth=1e6) == pytest.approx(
        (2 * READ_PER_STEP + cache) / 1e6)
