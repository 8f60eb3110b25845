"""Memory and money arithmetic: KV-cache bytes, weight bytes, the KV wall, $ per 1M tokens.

The KV cache holds a key and a value vector per layer, per KV head, per token:

    KV bytes = 2 (K and V) * L layers * H_kv heads * D head dim * S tokens * B sequences * bytes

Llama-3-8B (L=32, H_kv=8, D=128) in bfloat16 stores 131,072 bytes (128 KiB) a token, so an 8k
sequence holds 1.07 GB; that, not the roofline, usually caps the batch. A model is given as a
name ("llama-3-8b"), a ModelConfig, or a Hugging Face config (transformers or a config.json dict).

The KV cache need not share the weights' dtype: an fp8 or int8 cache (vLLM's kv_cache_dtype)
stores 1 byte a number next to bf16 weights, so the same memory holds twice the tokens. Where
both appear, dtype_bytes sizes the weights and kv_dtype_bytes the cache (None: the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from minillm.calc.models import ModelLike, as_config
from minillm.model_config import ModelConfig

if TYPE_CHECKING:
    from minillm.calc.roofline import Hardware


def kv_dims(model: ModelLike) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a model; any Hugging Face config with the usual fields
    works here, whatever its model_type (gemma, phi3, ...)."""
    if isinstance(model, (str, ModelConfig)):
        c = as_config(model)
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    hf = model if isinstance(model, Mapping) else getattr(model, "to_dict", lambda: None)()
    if not isinstance(hf, Mapping):
        as_config(model)  # raises the error that names the accepted kinds
    try:
        heads = hf["num_attention_heads"]
        kv_heads = hf.get("num_key_value_heads") or heads
        return hf["num_hidden_layers"], kv_heads, hf.get("head_dim") or hf["hidden_size"] // heads
    except KeyError as e:
        raise ValueError(f"the Hugging Face config has no {e.args[0]!r}; need num_hidden_layers, "
                         "num_attention_heads, hidden_size or head_dim") from None


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def _check_int(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


# Bytes per K or V number of each KV-cache dtype, by vLLM's kv_cache_dtype names ("auto" is the
# weights' dtype). int8 and fp8 (e4m3) caches also keep a scale per block or head, a few bytes
# next to thousands of numbers, which the sizing leaves out.
KV_CACHE_DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def kv_cache_dtype_bytes(kv_cache_dtype: str, dtype_bytes: float = 2) -> float:
    """Bytes per K or V number for a kv_cache_dtype name: "auto" is dtype_bytes (the weights'),
    else KV_CACHE_DTYPE_BYTES ("fp8" and "int8": 1, "bf16": 2, ...)."""
    if kv_cache_dtype == "auto":
        _check_positive(dtype_bytes=dtype_bytes)
        return dtype_bytes
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; choose 'auto' or one of "
                         f"{', '.join(KV_CACHE_DTYPE_BYTES)}")
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


def kv_bytes_per_token(model: ModelLike, dtype_bytes: float = 2) -> float:
    """Bytes of K and V one token occupies across all layers: 2 * L * H_kv * D * dtype_bytes.
    dtype_bytes: 2 for bf16/fp16, 1 for an fp8 or int8 cache, 4 for fp32."""
    _check_positive(dtype_bytes=dtype_bytes)
    layers, kv_heads, head_dim = kv_dims(model)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_cache_block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
) -> int:
    """Bytes of one block across all layers, K and V: 2 * L * P * K * D * bytes."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(model: ModelLike, seq_len: int, batch: int = 1, dtype_bytes: float = 2) -> float:
    """Bytes of the KV cache for `batch` sequences of `seq_len` tokens each:
    2 * L * H_kv * D * seq_len * batch * dtype_bytes (no paging slack, alignment or prefix
    sharing). An int when dtype_bytes is."""
    _check_int(seq_len=seq_len, batch=batch)
    return kv_bytes_per_token(model, dtype_bytes) * seq_len * batch


def weight_bytes(model: ModelLike, dtype_bytes: float = 2) -> float:
    """Bytes the weights occupy: num_params * dtype_bytes (tied embeddings stored once)."""
    _check_positive(dtype_bytes=dtype_bytes)
    return as_config(model).num_params * dtype_bytes


def max_concurrency(model: ModelLike, hw: Hardware | str, seq_len: int,
                    gpu_memory_utilization: float = 1.0, dtype_bytes: float = 2, *,
                    kv_dtype_bytes: float | None = None) -> int:
    """The KV wall: how many sequences of `seq_len` tokens fit at once on one device,
    floor((memory * gpu_memory_utilization - weight bytes) / KV bytes per sequence);
    0 when the weights alone do not fit. dtype_bytes sizes the weights, kv_dtype_bytes the
    KV cache (None: dtype_bytes, one dtype for both). An fp8 cache next to bf16 weights
    (kv_dtype_bytes=1, dtype_bytes=2) about doubles the wall, since the weights stay as they
    are. Activations and the CUDA context are left to the utilization headroom."""
    from minillm.calc.roofline import get_hardware

    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1], "
                         f"got {gpu_memory_utilization!r}")
    device = get_hardware(hw)
    if kv_dtype_bytes is not None:
        _check_positive(kv_dtype_bytes=kv_dtype_bytes)
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    per_sequence = kv_cache_bytes(model, seq_len, 1, kv_bytes)
    free = device.memory * gpu_memory_utilization - weight_bytes(model, dtype_bytes)
    if free <= 0:
        return 0
    return int(free // per_sequence)


def cost_per_million_tokens(dollars_per_hour: float, tokens_per_second: float) -> float:
    """Dollars per 1M tokens: dollars_per_hour / (tokens_per_second * 3600 / 1e6).
    At $2/hr, 2,200 tokens/s costs about $0.25 per million tokens."""
    _check_positive(dollars_per_hour=dollars_per_hour, tokens_per_second=tokens_per_second)
    return dollars_per_hour / (tokens_per_second * 3600 / 1e6)
