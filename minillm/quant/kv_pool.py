"""An engine's K/V pool: allocated in its K/V dtype, a quantized pool's scales, its block bytes.

The codec (quantize on write, dequantize inside attention) is minillm.quant.kv; this module
builds on the engine's pieces (the paged pool, a batch, the reference attention) to run the one
calibration forward that fixes the scales.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from minillm.attention.torch_ref import TorchAttention
from minillm.batch import build_batch
from minillm.calc.sizing import kv_cache_block_bytes
from minillm.quant.kv import CALIBRATION_MARGIN, kv_storage_dtype, scales_from_amax
from minillm.request import Request, ScheduledRequest
from minillm.sampling import SamplingParams

CALIBRATION_TEXT = Path(__file__).resolve().parent.parent / "assets" / "shakespeare_prompts.txt"
CALIBRATION_MAX_TOKENS = 1024


def allocate_kv_cache(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device | str,
) -> torch.Tensor:
    """The whole KV pool, zeroed so that padded slots never hold NaN: (L, 2, N, P, K, D)."""
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def calibration_token_ids(tokenizer: Any, vocab_size: int,
                          max_tokens: int = CALIBRATION_MAX_TOKENS) -> list[int]:
    """The fixed calibration passage: the Shakespeare prompt set (never the held-out Tempest,
    on which perplexity is measured), or ids cycling over the vocabulary for a model without a
    tokenizer. At most max_tokens ids."""
    if tokenizer is None:
        return [(7 * i + 1) % vocab_size for i in range(max_tokens)]
    lines = CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines()
    text = "\n".join(line for line in lines if not line.startswith("#") and line != "---")
    return list(tokenizer.encode(text))[:max_tokens]


class AmaxRecorder:
    """An attention backend that records amax |K| and |V| per layer and KV head, then attends
    with the wrapped backend on an unquantized pool: the model runs exactly as it would."""

    def __init__(self, backend: Any, num_layers: int, num_kv_heads: int, device: torch.device):
        self.backend, self.name = backend, backend.name
        self.amax = torch.zeros(num_layers, 2, num_kv_heads, device=device)  # (L, 2, K)
        self.layer = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: Any) -> torch.Tensor:
        layer = self.layer % self.amax.shape[0]  # the model calls layers in order
        for i, x in enumerate((k, v)):  # x (T, K, D) -> (K,)
            seen = x.detach().abs().float().amax(dim=(0, 2))
            self.amax[layer, i] = torch.maximum(self.amax[layer, i], seen)
        self.layer += 1
        return self.backend.forward(q, k, v, kv_cache, meta)


@torch.no_grad()
def calibrate_kv_scales(model: Any, tokenizer: Any, kv_cache_dtype: str, block_size: int,
                        max_tokens: int = CALIBRATION_MAX_TOKENS,
                        margin: float = CALIBRATION_MARGIN) -> torch.Tensor:
    """Scales (L, 2, K) fp32 for a quantized pool, from one forward of model (in its own dtype,
    through the reference attention on a pool of its own) over calibration_token_ids."""
    mc, device = model.config, model.lm_head.weight.device
    max_tokens = min(max_tokens, mc.max_position_embeddings)
    ids = calibration_token_ids(tokenizer, mc.vocab_size, max_tokens)
    num_blocks = -(-len(ids) // block_size)
    pool = allocate_kv_cache(mc.num_hidden_layers, num_blocks, block_size,
                             mc.num_key_value_heads, mc.head_dim, model.lm_head.weight.dtype,
                             device)
    req = Request("kv-calibration", ids, SamplingParams(), 0.0)
    req.block_table = list(range(num_blocks))
    batch = build_batch([ScheduledRequest(req, len(ids), 0, "prefill")], block_size, device)
    recorder = AmaxRecorder(TorchAttention(), mc.num_hidden_layers, mc.num_key_value_heads,
                            device)
    model(batch.input_ids, batch.positions, pool, batch.attn, recorder)
    return scales_from_amax(recorder.amax, kv_cache_dtype, margin)


def allocate_kv_pool(model: Any, tokenizer: Any, config: Any
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An engine's KV pool (L, 2, N, P, K, D) in config.kv_cache_dtype's storage dtype, and its
    scales (L, 2, K) fp32, calibrated here, for "int8" and "fp8" (None for "auto")."""
    mc, weight = model.config, model.lm_head.weight
    dtype = kv_storage_dtype(config.kv_cache_dtype, weight.dtype)
    kv_cache = allocate_kv_cache(mc.num_hidden_layers, config.num_kv_blocks, config.block_size,
                                 mc.num_key_value_heads, mc.head_dim, dtype, weight.device)
    if config.kv_cache_dtype == "auto":
        return kv_cache, None
    return kv_cache, calibrate_kv_scales(model, tokenizer, config.kv_cache_dtype,
                                         config.block_size)


def kv_pool_block_bytes(model: Any, config: Any) -> int:
    """Bytes of one block of an engine's pool, all layers, K and V, in the pool's own dtype:
    the model's for kv_cache_dtype="auto", one byte for "int8" and "fp8" (so the same memory
    holds 2x the blocks of a bf16 pool, 4x those of an fp32 one). The scales, L * 2 * K
    floats for the whole pool, are not counted."""
    mc = model.config
    if config.kv_cache_dtype == "auto":
        number_bytes = model.lm_head.weight.element_size()
    else:
        number_bytes = kv_storage_dtype(config.kv_cache_dtype, torch.float32).itemsize
    return kv_cache_block_bytes(mc.num_hidden_layers, config.block_size, mc.num_key_value_heads,
                                mc.head_dim, number_bytes)
