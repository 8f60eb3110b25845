"""The simulated deployment's KV pool: how many blocks a GPU (or each GPU of a TP x PP layout)
holds after the weights, as vLLM sizes its pool, and the EngineConfig that results.

minillm.simulator, minillm.fleet and minillm.disaggregation build their replicas' configs here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from minillm.calc import parallel, roofline, sizing
from minillm.calc.sizing import kv_cache_block_bytes
from minillm.config import EngineConfig
from minillm.model_config import ModelConfig


def resolve_config(model: ModelConfig, hw: roofline.Hardware, dtype_bytes: int,
                   gpu_memory_utilization: float, engine_kwargs: dict[str, Any],
                   kv_dtype_bytes: float | None = None, draft: ModelConfig | None = None,
                   layout: parallel.ParallelConfig | None = None) -> EngineConfig:
    """EngineConfig with max_model_len (default: the model's context) and num_kv_blocks set
    (on several GPUs, by parallel.num_kv_blocks: what every GPU of the layout holds)."""
    config = EngineConfig(gpu_memory_utilization=gpu_memory_utilization, **engine_kwargs)
    max_len = config.max_model_len or model.max_position_embeddings
    sharded = layout is not None and layout.world_size > 1
    blocks = config.num_kv_blocks or (
        parallel.num_kv_blocks(model, hw, layout, config.block_size, dtype_bytes,
                               gpu_memory_utilization, kv_dtype_bytes) if sharded else
        num_kv_blocks_for_memory(model, hw, config.block_size, dtype_bytes,
                                 gpu_memory_utilization, kv_dtype_bytes, draft))
    return dataclasses.replace(config, max_model_len=max_len, num_kv_blocks=blocks)


def num_kv_blocks_for_memory(model: ModelConfig, hw: roofline.Hardware, block_size: int,
                             dtype_bytes: int, gpu_memory_utilization: float,
                             kv_dtype_bytes: float | None = None,
                             draft: ModelConfig | None = None) -> int:
    """KV blocks in gpu_memory_utilization * hw.memory bytes less the weights (vLLM's rule);
    weights at dtype_bytes, blocks at kv_dtype_bytes per number (None: dtype_bytes). A draft
    model for speculative decoding takes its weights and its own K/V in every block too."""
    weights = sum(sizing.weight_bytes(m, dtype_bytes) for m in (model, draft) if m is not None)
    budget = hw.memory * gpu_memory_utilization - weights
    block = block_bytes(model, block_size, dtype_bytes, kv_dtype_bytes, draft)
    if budget < block:
        raise ValueError(
            f"the weights ({weights / 1e9:.1f} GB at {dtype_bytes} bytes) leave no room for KV "
            f"blocks in gpu_memory_utilization={gpu_memory_utilization} of {hw.name}'s "
            f"{hw.memory / 1e9:.1f} GB; pick a bigger GPU, a smaller dtype or a smaller model")
    return int(budget // block)


def block_bytes(model: ModelConfig, block_size: int, dtype_bytes: float,
                 kv_dtype_bytes: float | None, draft: ModelConfig | None = None) -> float:
    """Bytes of one KV block: K and V of block_size tokens, every layer, at the KV's dtype (a
    draft model's too: its cache follows the same block table)."""
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    if not 0 < kv_bytes < float("inf"):
        raise ValueError(f"kv_dtype_bytes must be a positive number or None, got {kv_bytes!r}")
    return sum(kv_cache_block_bytes(m.num_hidden_layers, block_size, m.num_key_value_heads,
                                    m.head_dim, kv_bytes) for m in (model, draft) if m is not None)
