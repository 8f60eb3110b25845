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
- The scales are calibrated once, when the engine is built (minillm.quant.kv_pool): one forward
  of the model in its own dtype over a fixed passage, recording amax |K| and |V| per layer and
  head; then scale = amax * CALIBRATION_MARGIN / qmax (scales_from_amax), so the largest value
  seen lands at 1 / margin of the range.

This module is the codec alone (it imports no engine module), so attention can stand on it.
"""

from __future__ import annotations

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
