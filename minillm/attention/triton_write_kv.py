"""KV write (reshape-and-cache) in Triton: scatter the step's K and V rows into the paged cache.

Token t's K and V (K heads of D values each) go to slot slot_mapping[t] = block * P + offset of
the layer's cache (2, N, P, K, D). Seen as rows of D values, head h of slot s is row s * K + h,
so one program copies one (token, head) row. A negative slot marks a padding token (a batch
padded to a fixed size, as CUDA graphs need) and is skipped.

An int8 or fp8 cache (KV_DTYPE "int8" or "fp8", minillm.quant.kv) is written quantized: the row
is divided by its head's scale in fp32, then int8 rounds to nearest and clamps to +-127, fp8
clamps to +-448 and rounds in the cast. KV_DTYPE="auto" compiles to the plain copy.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from minillm.attention.torch_ref import check_kv_scales
from minillm.device import has_fp8_kv


@triton.jit
def round_to_e4m3(y):
    """y (within +-448) rounded to the nearest fp8 e4m3 value, in fp32: 3 mantissa bits, and
    below 2^-6 the subnormals' fixed step 2^-9. Only for Triton's CPU interpreter (3.9), whose
    fp32 -> e4m3 cast drops the carry when a value rounds up to the next power of two
    (31.6 -> 16, not 32); after this the cast is exact. GPUs cast in hardware."""
    exponent = tl.maximum(tl.floor(tl.log2(tl.abs(y))), -6.0)
    step = tl.exp2(exponent - 3.0)
    return tl.floor(y / step + 0.5) * step


@triton.jit
def quantize(x, scale, KV_DTYPE: tl.constexpr, EXACT_FP8_CAST: tl.constexpr):
    """x / scale in fp32, rounded and clamped into int8 or fp8 e4m3 (KV_DTYPE)."""
    y = x.to(tl.float32) / scale
    # if/else, not an early return: Triton would still compile the fp8 cast after one, and
    # GPUs before sm_89 have no e4m3.
    if KV_DTYPE == "int8":
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        # The cast truncates toward zero: adding +-0.5 first rounds to nearest (ties away).
        q = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int8)
    else:
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        if EXACT_FP8_CAST:
            y = round_to_e4m3(y)
        q = y.to(tl.float8e4nv)
    return q


@triton.jit
def dequantize(x, scale, dtype: tl.constexpr):
    """An int8 or fp8 tile upcast to fp32, times its head's scale, in dtype (the queries')."""
    return (x.to(tl.float32) * scale).to(dtype)


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr,  # (T, K, D) the step's keys and values, contiguous
    k_cache_ptr, v_cache_ptr,  # (N, P, K, D) each: the two halves of the layer's cache
    slot_mapping_ptr,  # (T,) int64 cache slot of each token, negative for padding
    k_scale_ptr, v_scale_ptr,  # (K,) fp32 per-head scales of a quantized cache; else unused
    K, D,
    BLOCK_D: tl.constexpr,  # D rounded up to a power of two
    KV_DTYPE: tl.constexpr,  # "auto" (the cache is in k's dtype), "int8" or "fp8"
    EXACT_FP8_CAST: tl.constexpr,  # round to e4m3 in fp32 before the cast (the interpreter)
):
    token, head = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return  # a padding token owns no slot
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    src = (token * K + head) * D + d  # row (token, head) of (T, K, D)
    dst = (slot * K + head) * D + d  # row (slot, head) of (N * P, K, D)
    k = tl.load(k_ptr + src, mask=mask)
    v = tl.load(v_ptr + src, mask=mask)
    if KV_DTYPE != "auto":
        k = quantize(k, tl.load(k_scale_ptr + head), KV_DTYPE, EXACT_FP8_CAST)
        v = quantize(v, tl.load(v_scale_ptr + head), KV_DTYPE, EXACT_FP8_CAST)
    # Otherwise a plain copy: the values keep their dtype, so nothing is rounded.
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scales: torch.Tensor | None = None) -> None:
    """Store k and v (T, K, D) in the layer's cache (2, N, P, K, D) at slot_mapping (T,);
    quantized with kv_scales (2, K) fp32 when the cache is int8 or fp8.

    Must match minillm.attention.torch_ref.write_kv on every slot >= 0; slots < 0 are skipped.
    (A quantized value may differ by one step where x / scale sits at a halfway point: the
    kernel rounds ties away from zero, torch to even, and a GPU's fp32 division may be off by
    an ulp there.)
    """
    _, _, _, K, D = check_kv_cache(kv_cache, kv_scales)
    T = k.shape[0]
    for name, x in (("k", k), ("v", v)):
        if x.shape != (T, K, D):
            raise ValueError(f"{name} must be (T, K, D) = {(T, K, D)} to match the cache, "
                             f"got {tuple(x.shape)}")
        if x.dtype != kv_cache.dtype and kv_scales is None:
            raise TypeError(f"{name} is {x.dtype} but the cache is {kv_cache.dtype}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {x.stride()}")
    if slot_mapping.shape != (T,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be ({T},) int32 or int64, "
                         f"got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    for name, x in (("k", k), ("v", v), ("slot_mapping", slot_mapping)):
        if x.device != kv_cache.device:
            raise ValueError(f"{name} is on {x.device} but kv_cache is on {kv_cache.device}")
    if T == 0:
        return
    k_scale, v_scale = scale_pointers(kv_cache, kv_scales)
    write_kv_kernel[(T, K)](k, v, kv_cache[0], kv_cache[1], slot_mapping, k_scale, v_scale, K, D,
                            BLOCK_D=triton.next_power_of_2(D), KV_DTYPE=kv_dtype_name(kv_cache),
                            EXACT_FP8_CAST=os.environ.get("TRITON_INTERPRET") == "1")


def check_kv_cache(kv_cache: torch.Tensor, kv_scales: torch.Tensor | None = None
                   ) -> tuple[int, int, int, int, int]:
    """The (2, N, P, K, D) shape of one layer's cache, after checking it is laid out as such and
    that an int8 or fp8 cache comes with its scales (2, K) fp32 (and only such a cache)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be one layer's (2, N, P, K, D), "
                         f"got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be contiguous, got strides {kv_cache.stride()}")
    check_kv_scales(kv_cache, kv_scales)
    if (kv_cache.dtype == torch.float8_e4m3fn and kv_cache.is_cuda
            and not has_fp8_kv(torch.cuda.get_device_capability(kv_cache.device))):
        raise RuntimeError(
            f"kv_cache_dtype='fp8' needs fp8 e4m3 conversions, which Triton supports on compute "
            f"capability 8.9 (Ada, Hopper) and up; this GPU is sm_"
            f"{''.join(map(str, torch.cuda.get_device_capability(kv_cache.device)))}: use "
            "kv_cache_dtype='int8' (same bytes) or attention_backend='torch'")
    return tuple(kv_cache.shape)  # type: ignore[return-value]


def kv_dtype_name(kv_cache: torch.Tensor) -> str:
    """The kernels' KV_DTYPE for a cache: "int8", "fp8", or "auto" (the activations' dtype)."""
    return {torch.int8: "int8", torch.float8_e4m3fn: "fp8"}.get(kv_cache.dtype, "auto")


def scale_pointers(kv_cache: torch.Tensor, kv_scales: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V scales (K,) to pass a kernel; for an unquantized cache, which reads none, the
    cache halves stand in so that the launch's arguments keep their types."""
    if kv_scales is None:
        return kv_cache[0], kv_cache[1]
    return kv_scales[0], kv_scales[1]
