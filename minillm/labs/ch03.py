"""Graded exercises of chapter 03 (KV-cache sizing)."""

from __future__ import annotations

from numbers import Real
from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable

GB = 1e9


def _kv_cases() -> list[tuple[Any, int, int, float]]:
    """(ModelConfig, seq_len, batch, dtype_bytes): the primer's 512 MiB first, then shapes where
    each common slip changes the answer (batch > 1, H != K, head_dim != hidden / heads)."""
    from minillm.calc import models

    return [(models.get("llama-3-8b"), 4096, 1, 2), (models.get("llama-3-8b"), 8192, 16, 1),
            (models.get("qwen2.5-7b"), 32768, 4, 2), (models.get("llama-3-70b"), 8192, 8, 2),
            (models.get("qwen3-0.6b"), 40960, 2, 2), (models.get("mistral-7b"), 1000, 3, 4)]


def _kv_hint(got: float, want: float, config: Any, seq_len: int, batch: int) -> str:
    """Name the slip that turns the right answer into got, if it is a common one."""
    H, K, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    slips = [  # the head-dim slip first: on Qwen3 it halves the answer, as forgetting the 2 does
        (want * config.hidden_size / (H * D),
         "use config.head_dim: hidden_size / heads is not the head dim of every model "
         "(Qwen3's is 128, not 64)"),
        (want / 2, "K and V are both cached: the formula starts with 2"),
        (want * H / K, f"cache the KV heads (num_key_value_heads = {K}), not the query heads "
                       f"(num_attention_heads = {H}): with GQA/MQA query heads share KV heads"),
        (want * 8, "dtype_bytes is already bytes per element: multiplying by 8 counts bits"),
        (want / 8, "dtype_bytes is already bytes per element: do not divide it by 8"),
        (want / batch, "every one of the batch's sequences has its own cache: multiply by batch"),
        (want / config.num_hidden_layers, "every layer caches its own K and V: multiply by the "
                                          "number of layers"),
        (want / (seq_len * batch), "that is the bytes of one token: multiply by seq_len and batch"),
    ]
    return next((f" ({hint})" for wrong, hint in slips if wrong != want and close(got, wrong)),
                "")


def _engine_pool_bytes(num_blocks: int = 4) -> tuple[Any, int, int, int]:
    """The shipped model's config, and the bytes, token slots and element size of a KV pool that
    minillm's own allocator (quant.kv_pool.allocate_kv_cache, as the engine calls it) hands out."""
    import torch

    from minillm.llm import default_model_path
    from minillm.model_config import ModelConfig
    from minillm.quant.kv_pool import allocate_kv_cache

    c = ModelConfig.from_pretrained(default_model_path())
    block_size = 16
    pool = allocate_kv_cache(c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads,
                             c.head_dim, torch.float32, "cpu")  # (L, 2, N, P, K, D)
    return c, pool.untyped_storage().nbytes(), num_blocks * block_size, pool.element_size()


def grade_kv_bytes(kv_bytes: Any) -> str:
    expect_callable(kv_bytes, "kv_bytes(config, seq_len, batch, dtype_bytes) -> bytes")
    for config, seq_len, batch, dtype_bytes in _kv_cases():
        got = kv_bytes(config, seq_len, batch, dtype_bytes)
        assert got is not None, "kv_bytes returned None"
        assert isinstance(got, Real), f"return the bytes as a number, got {got!r}"
        L, K, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        want = 2 * L * K * D * seq_len * batch * dtype_bytes
        assert close(got, want), (
            f"L={L} layers, H_kv={K}, D={D}, {seq_len:,} tokens, batch {batch}, "
            f"{dtype_bytes:g} bytes per element: the KV cache holds {want:,} bytes, "
            f"you returned {got!r}{_kv_hint(got, want, config, seq_len, batch)}")
    config, allocated, slots, element = _engine_pool_bytes()
    got = kv_bytes(config, slots, 1, element)
    assert close(got, allocated), (
        f"minillm's allocator gives the shipped model's {slots}-token pool {allocated:,} bytes, "
        f"your formula says {got!r}")
    return ("KV bytes = 2 · L · H_kv · D · S · B · bytes: 512 MiB for 4096 tokens of Llama-3-8B, "
            "and exactly what minillm allocates")


def _wall_cases() -> list[tuple[float, float, float, int, str]]:
    """(memory, weights, KV bytes per sequence, answer, what the case is)."""
    from minillm.calc import models
    from minillm.calc.sizing import kv_cache_bytes, weight_bytes

    llama, big = models.get("llama-3-8b"), models.get("llama-3-70b")
    w8, kv8 = weight_bytes(llama), kv_cache_bytes(llama, 8192)
    return [(80 * GB, w8, kv8, 59, "Llama-3-8B, 8k tokens, BF16, 80 GB"),
            (0.9 * 80 * GB, w8, kv8, 52, "the same at gpu_memory_utilization 0.9"),
            (80 * GB, w8, kv8 / 2, 119, "the same with an FP8 KV cache"),
            (24 * GB, w8, kv8, 7, "Llama-3-8B, 8k tokens on a 24 GB GPU"),
            (80 * GB, weight_bytes(big), kv_cache_bytes(big, 8192), 0,
             "Llama-3-70B in BF16 on one 80 GB GPU"),
            (141 * GB, 0.0, 1024.0, 137_695_312, "an empty pool of 141 GB, 1 kB sequences")]


def _wall_hint(got: float, memory: float, weights: float, per_seq: float) -> str:
    free = memory - weights
    if free > 0 and close(got, round(free / per_seq)) and not close(got, free // per_seq):
        return " (round down: a sequence that only partly fits does not fit)"
    if free > 0 and close(got, free / per_seq):
        return " (a count of whole sequences: floor the quotient)"
    if close(got, memory // per_seq) or close(got, memory / per_seq):
        return " (the weights are loaded first: only memory - weights is left for the KV cache)"
    if free <= 0 and got < 0:
        return " (the weights alone do not fit: no sequence fits, return 0)"
    return ""


def grade_max_sequences(max_sequences: Any) -> str:
    expect_callable(max_sequences,
                    "max_sequences(memory_bytes, weight_bytes, kv_bytes_per_sequence) -> int")
    for memory, weights, per_seq, want, what in _wall_cases():
        got = max_sequences(memory, weights, per_seq)
        assert got is not None, "max_sequences returned None"
        assert isinstance(got, Real), f"return a number of sequences, got {got!r}"
        assert got == want, (
            f"{what}: {memory / GB:g} GB - {weights / GB:.2f} GB of weights leaves room for "
            f"{want} sequences of {per_seq / GB:.4g} GB, you returned {got!r}"
            f"{_wall_hint(got, memory, weights, per_seq)}")
    predicted, peak = _engine_wall(max_sequences)
    assert predicted == peak, (
        f"minillm ran {peak} sequences at once in that pool, you predicted {predicted}")
    return (f"floor((memory - weights) / KV per sequence); the engine agrees: {peak} sequences "
            "of 128 tokens ran at once in a 44-block pool")


def _engine_wall(max_sequences: Any) -> tuple[int, int]:
    """The reader's prediction for a 44-block pool of the shipped model, and the most requests
    the real engine ran at once in it, offered twice as many 128-token requests."""
    import random

    from minillm import LLM, SamplingParams
    from minillm.calc.sizing import kv_cache_bytes

    llm = LLM(num_kv_blocks=44, max_model_len=128)
    pool = llm.engine.runner.kv_cache
    per_seq = kv_cache_bytes(llm.model.config, 128, 1, pool.element_size())
    predicted = max_sequences(pool.untyped_storage().nbytes(), 0, per_seq)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 4000) for _ in range(113)] for _ in range(2 * int(predicted))]
    llm.generate(prompts, SamplingParams(max_tokens=15, temperature=0, ignore_eos=True),
                 use_tqdm=False)
    return predicted, max(len(step.scheduled) for step in llm.trace)


EXERCISES = [
    Exercise("03.1", "The KV-cache formula",
             "Write kv_bytes(config, seq_len, batch, dtype_bytes) -> bytes of the KV cache of "
             "`batch` sequences of `seq_len` tokens for a ModelConfig.", grade_kv_bytes),
    Exercise("03.2", "The KV wall",
             "Write max_sequences(memory_bytes, weight_bytes, kv_bytes_per_sequence) -> how many "
             "whole sequences fit at once.", grade_max_sequences),
]

