"""Reference solutions of chapter 03's graded exercises."""

from __future__ import annotations

import math

from minillm.model_config import ModelConfig


def kv_bytes(config: ModelConfig, seq_len: int, batch: int, dtype_bytes: float) -> float:
    """03.1: K and V, per layer, per KV head, per head dimension, per token, per sequence."""
    return (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
            * seq_len * batch * dtype_bytes)


def max_sequences(memory_bytes: float, weight_bytes: float, kv_bytes_per_sequence: float) -> int:
    """03.2: whole sequences in what the weights leave; none when the weights do not fit."""
    free = memory_bytes - weight_bytes
    return max(math.floor(free / kv_bytes_per_sequence), 0)


SOLUTIONS = {"03.1": kv_bytes, "03.2": max_sequences}
