"""KV-cache, weight and cost arithmetic (minillm.sizing), against the seed texts' worked examples
and against the bytes minillm really allocates.

Tolerances: the formula examples are exact (512 MiB, 131,072 bytes a token); "1.07 GB" and the
dollar figures are printed to 2-3 significant digits, so they get 1-2%; the KV wall is stated as
a range, "~50-60 sequences", and is checked as that range.
"""

from __future__ import annotations

import pytest

import minillm
from minillm.calc import models
from minillm.calc.roofline import HARDWARE
from minillm.calc.sizing import (
    cost_per_million_tokens,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrency,
    weight_bytes,
)
from minillm.kv_cache import kv_cache_block_bytes

pytestmark = pytest.mark.ch03  # KV sizing

# The primer's example: 32 layers, 8 KV heads, head dim 128 (any model with that KV shape).
PRIMER_SHAPE = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "hidden_size": 4096, "model_type": "gemma"}


def test_512_mib_example():
    """2 * 32 * 8 * 128 * 4096 tokens * 1 sequence * 2 bytes = 512 MiB, exactly."""
    assert kv_cache_bytes(PRIMER_SHAPE, seq_len=4096, batch=1, dtype_bytes=2) == 512 * 2**20


def test_llama_3_8b_per_token_and_per_sequence():
    """'2*32*8*128*2 ~ 131 KB' a token (128 KiB); an 8k sequence '~1.07 GB'."""
    assert kv_bytes_per_token("llama-3-8b") == 131_072 == 128 * 2**10
    assert kv_cache_bytes("llama-3-8b", 8192) == pytest.approx(1.07e9, rel=0.01)


def test_formula_is_linear_in_every_factor():
    base = kv_cache_bytes("llama-3-8b", 1000, batch=3, dtype_bytes=2)
    assert kv_cache_bytes("llama-3-8b", 2000, batch=3) == 2 * base
    assert kv_cache_bytes("llama-3-8b", 1000, batch=6) == 2 * base
    assert kv_cache_bytes("llama-3-8b", 1000, batch=3, dtype_bytes=1) == base / 2  # fp8 KV


def test_gqa_shrinks_the_cache():
    """Llama-3-8B's 8 KV heads for 32 query heads: a quarter of the multi-head cache."""
    mha = dict(PRIMER_SHAPE, num_key_value_heads=32)
    assert kv_cache_bytes(mha, 4096) == 4 * kv_cache_bytes("llama-3-8b", 4096)


def test_every_model_spelling_agrees():
    from transformers import LlamaConfig

    hf = {k: v for k, v in models.HF_CONFIGS["llama-3-8b"].items() if not k.startswith("_")}
    expected = kv_cache_bytes("llama-3-8b", 4096, batch=2)
    assert kv_cache_bytes(models.get("llama-3-8b"), 4096, batch=2) == expected
    assert kv_cache_bytes(hf, 4096, batch=2) == expected
    assert kv_cache_bytes(LlamaConfig(**hf), 4096, batch=2) == expected
    # Qwen3 states head_dim (128) apart from hidden / heads (64).
    assert kv_bytes_per_token("qwen3-0.6b") == 2 * 28 * 8 * 128 * 2


def test_matches_the_bytes_minillm_allocates():
    """The formula is what the engine's paged pool really holds: 8 blocks of 16 tokens, fp32."""
    llm = minillm.LLM(num_kv_blocks=8, block_size=16, device="cpu", dtype="float32")
    config = llm.model.config
    per_token = kv_bytes_per_token(config, dtype_bytes=4)
    assert llm.engine.runner.kv_cache.nbytes == 8 * 16 * per_token
    assert kv_cache_block_bytes(config.num_hidden_layers, 16, config.num_key_value_heads,
                                config.head_dim, 4) == 16 * per_token
    pool = llm.engine.runner.kv_cache
    assert kv_cache_bytes(config, seq_len=16 * 8, dtype_bytes=4) == pool.nbytes


def test_weight_bytes():
    assert weight_bytes("llama-3-8b") == 2 * 8_030_261_248
    assert weight_bytes("llama-3-70b", dtype_bytes=1) == pytest.approx(70.6e9, rel=0.01)


def test_kv_wall_llama_3_8b_at_8k_on_80_gb():
    """'~16 GB of weights, ~50-60 sequences of 8k before OOM' on an 80 GB GPU."""
    for gpu in ("A100-80GB", "H100-SXM"):
        for utilization in (1.0, 0.9):
            assert 50 <= max_concurrency("llama-3-8b", gpu, 8192, utilization) <= 60
    assert max_concurrency("llama-3-8b", "H100-SXM", 8192) == 59


def test_kv_wall_formula_and_edges():
    hw = HARDWARE["H200"]
    free = hw.memory * 0.9 - weight_bytes("llama-3-8b")
    assert max_concurrency("llama-3-8b", hw, 4096, 0.9) == int(
        free // kv_cache_bytes("llama-3-8b", 4096))
    assert max_concurrency("llama-3-70b", "H100-SXM", 4096) == 0  # 141 GB of weights > 80 GB
    assert max_concurrency("llama-3-70b", "H100-SXM", 4096, dtype_bytes=0.5) > 0  # int4
    assert max_concurrency("llama-3-8b", "h100-sxm", 1024) > max_concurrency(
        "llama-3-8b", "H100-SXM", 2048)


def test_cost_per_million_tokens_examples():
    """$2/hr: 2,200 tokens/s -> '~$0.25/M'; 5,000 tokens/s -> '~$0.11/M'."""
    assert cost_per_million_tokens(2.0, 2200) == pytest.approx(0.25, rel=0.02)
    assert cost_per_million_tokens(2.0, 5000) == pytest.approx(0.11, rel=0.02)
    assert cost_per_million_tokens(2.0, 2 * 2200) == cost_per_million_tokens(2.0, 2200) / 2
    assert cost_per_million_tokens(3.6, 1000) == pytest.approx(1.0)  # 3.6M tokens an hour


@pytest.mark.parametrize("call,match", [
    (lambda: kv_cache_bytes("llama-3-8b", 0), "seq_len must be a positive int, got 0"),
    (lambda: kv_cache_bytes("llama-3-8b", 16, batch=-1), "batch must be a positive int, got -1"),
    (lambda: kv_cache_bytes("llama-3-8b", 16, dtype_bytes=0), "dtype_bytes must be a positive"),
    (lambda: kv_cache_bytes("llama-9", 16), "unknown model name 'llama-9'"),
    (lambda: kv_cache_bytes({"num_hidden_layers": 2}, 16), "no 'num_attention_heads'"),
    (lambda: max_concurrency("llama-3-8b", "H100", 16), "unknown hardware 'H100'"),
    (lambda: max_concurrency("llama-3-8b", "H200", 16, 1.5), "gpu_memory_utilization"),
    (lambda: cost_per_million_tokens(2.0, 0), "tokens_per_second must be a positive"),
    (lambda: cost_per_million_tokens(-1, 10), "dollars_per_hour must be a positive"),
])
def test_bad_values_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
