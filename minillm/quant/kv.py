"""KV-cache quantization: K and V stored in one byte each (kv_cache_dtype "int8" or "fp8").

Decode reads the whole context's K and V every step, so at long contexts or big batches the
KV bytes rival or pass the weights'. One byte per number instead of two (bf16) or four (fp32)
halves or quarters them, and the same pool holds 2x or 4x the tokens.

The scheme (static per-head scales, as vLLM's k_scale / v_scale, but one per KV head):
- The pool keeps its (L, 2, N, P, K, D) layout in torch.int8 or torch.float8_e4m3fn, next to a
  float32 scales tensor (L, 2, K): one scale per layer, K-or-V and KV head.
- Write: q = x / scale; int8 rounds to the nearest integer and clamps to [-127, 127]; fp8 (e4m3)
  clamps to +-448, its largest finite value, and rounds in the cast. Values beyond the range
  saturate instead of overflowing (e4m3 has no infinity: an overflow would be NaN).
- Read (inside attention, every backend): load, upcast to fp32, multiply by the scale.
- The scales are calibrated once, when the engine is built: one forward of the model in its own
  dtype over a fixed passage, recording amax |K| and |V| per layer and head; then
  scale = amax * CALIBRATION_MARGIN / qmax, so the largest value seen lands at 1 / margin of
  the range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

KV_STORAGE_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
# The largest magnitude each storage type holds: int8 uses +-127 (symmetric, -128 unused);
# 448 is e4m3's largest finite number.
KV_QMAX = {"int8": 127.0, "fp8": 448.0}
# amax is measured on one passage; other text (longer contexts, other speakers) can reach past
# it. 1.25 leaves 25% headroom: int8 gives up a quarter of its 127 steps (about 0.3 bits) and
# fp8, whose relative precision is the same across its range, gives up almost nothing; anything
# still beyond saturates at the range's edge rather than wrapping or turning NaN.
CALIBRATION_MARGIN = 1.25
CALIBRATION_TEXT = Path(__file__).resolve().parent.parent / "assets" / "shakespeare_prompts.txt"
CALIBRATION_MAX_TOKENS = 1024


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's torch dtype for a kv_cache_dtype name: "auto" is the model's own dtype."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in KV_STORAGE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'auto', 'int8' or 'fp8', got {kv_cache_dtype!r}")
    return KV_STORAGE_DTYPES[kv_cache_dtype]


def is_quantized(kv_cache: torch.Tensor) -> bool:
    """Whether a pool (or one layer's cache) stores quantized K and V that need scales."""
    return kv_cache.dtype in KV_STORAGE_DTYPES.values()


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (T, K, D) in any float dtype, scale (K,) fp32 -> (T, K, D) in dtype (int8 or fp8)."""
    y = x.float() / scale[:, None]  # (T, K, D) / (K, 1)
    if dtype == torch.int8:
        return y.round().clamp(-KV_QMAX["int8"], KV_QMAX["int8"]).to(torch.int8)
    if dtype == torch.float8_e4m3fn:
        return y.clamp(-KV_QMAX["fp8"], KV_QMAX["fp8"]).to(torch.float8_e4m3fn)
    raise TypeError(f"quantized KV is stored as int8 or float8_e4m3fn, not {dtype}")


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q (..., K, D) int8 or fp8, scale (K,) fp32 -> the same shape in dtype (the queries')."""
    return (q.float() * scale[:, None]).to(dtype)  # (..., K, D) * (K, 1)


def scales_from_amax(amax: torch.Tensor, kv_cache_dtype: str,
                     margin: float = CALIBRATION_MARGIN) -> torch.Tensor:
    """Scales (L, 2, K) fp32 from the calibration's amax |K| and |V| (L, 2, K). A head whose
    values were all 0 gets scale 1 rather than 0, which would divide by zero on write."""
    if margin < 1:
        raise ValueError(f"margin must be >= 1 (it is headroom above the calibrated amax), "
                         f"got {margin}")
    scale = amax.float() * margin / KV_QMAX[kv_cache_dtype]
    return torch.where(scale > 0, scale, torch.ones_like(scale))


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
    from minillm.attention.torch_ref import TorchAttention
    from minillm.batch import build_batch
    from minillm.kv_cache import allocate_kv_cache
    from minillm.request import Request
    from minillm.sampling import SamplingParams
    from minillm.scheduler import ScheduledRequest

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
    from minillm.kv_cache import allocate_kv_cache

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
    from minillm.kv_cache import kv_cache_block_bytes

    mc = model.config
    if config.kv_cache_dtype == "auto":
        number_bytes = model.lm_head.weight.element_size()
    else:
        number_bytes = kv_storage_dtype(config.kv_cache_dtype, torch.float32).itemsize
    return kv_cache_block_bytes(mc.num_hidden_layers, config.block_size, mc.num_key_value_heads,
                                mc.head_dim, number_bytes)
