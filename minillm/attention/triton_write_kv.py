"""KV write (reshape-and-cache) in Triton: scatter the step's K and V rows into the paged cache.

Token t's K and V (K heads of D values each) go to slot slot_mapping[t] = block * P + offset of
the layer's cache (2, N, P, K, D). Seen as rows of D values, head h of slot s is row s * K + h,
so one program copies one (token, head) row. A negative slot marks a padding token (a batch
padded to a fixed size, as CUDA graphs need) and is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr,  # (T, K, D) the step's keys and values, contiguous
    k_cache_ptr, v_cache_ptr,  # (N, P, K, D) each: the two halves of the layer's cache
    slot_mapping_ptr,  # (T,) int64 cache slot of each token, negative for padding
    K, D,
    BLOCK_D: tl.constexpr,  # D rounded up to a power of two
):
    token, head = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return  # a padding token owns no slot
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    src = (token * K + head) * D + d  # row (token, head) of (T, K, D)
    dst = (slot * K + head) * D + d  # row (slot, head) of (N * P, K, D)
    # A plain copy: the values keep their dtype, so nothing is rounded.
    tl.store(k_cache_ptr + dst, tl.load(k_ptr + src, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dst, tl.load(v_ptr + src, mask=mask), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
             ) -> None:
    """Store k and v (T, K, D) in the layer's cache (2, N, P, K, D) at slot_mapping (T,).

    Must match minillm.attention.torch_ref.write_kv on every slot >= 0; slots < 0 are skipped.
    """
    _, _, _, K, D = check_kv_cache(kv_cache)
    T = k.shape[0]
    for name, x in (("k", k), ("v", v)):
        if x.shape != (T, K, D):
            raise ValueError(f"{name} must be (T, K, D) = {(T, K, D)} to match the cache, "
                             f"got {tuple(x.shape)}")
        if x.dtype != kv_cache.dtype:
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
    write_kv_kernel[(T, K)](k, v, kv_cache[0], kv_cache[1], slot_mapping, K, D,
                            BLOCK_D=triton.next_power_of_2(D))


def check_kv_cache(kv_cache: torch.Tensor) -> tuple[int, int, int, int, int]:
    """The (2, N, P, K, D) shape of one layer's cache, after checking it is laid out as such."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be one layer's (2, N, P, K, D), "
                         f"got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be contiguous, got strides {kv_cache.stride()}")
    return tuple(kv_cache.shape)  # type: ignore[return-value]
