"""What the paged-attention kernels (triton_decode.py, triton_extend.py) ask of their inputs on
the host, before any launch: the shapes, dtypes, devices and contiguity of q, the paged cache,
its block tables and the context lengths, checked with errors that name the tensor; and the
head dimension padded to the block their tiles use.
"""

from __future__ import annotations

import torch
import triton

from minillm.attention.triton_write_kv import check_kv_cache


def head_dim_block(D: int) -> int:
    """D padded to a power of two (tl.arange needs one) and to at least 16 (tl.dot needs it);
    the padding lanes are masked: zeros in q, k and v, never stored."""
    return max(16, triton.next_power_of_2(D))


def check_paged_inputs(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, kv_scales: torch.Tensor | None = None
                       ) -> tuple[int, int, int, int]:
    """(H, K, D, P) after checking q (., H, D) against the cache (2, N, P, K, D) (and an int8
    or fp8 cache's kv_scales (2, K)) and the per-request block_tables (B, max_blocks) and
    seq_lens (B,), all int32 and contiguous."""
    _, _, P, K, D = check_kv_cache(kv_cache, kv_scales)
    if q.dim() != 3 or q.shape[2] != D or q.shape[1] % K != 0:
        raise ValueError(f"q must be (., H, {D}) with H a multiple of K = {K}, "
                         f"got {tuple(q.shape)}")
    cache_dtype = q.dtype if kv_scales is not None else kv_cache.dtype  # int8/fp8: any q
    if q.dtype != cache_dtype or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"q and kv_cache must share one of fp32, fp16, bf16 (or the cache be "
                        f"int8 or fp8 with kv_scales), got {q.dtype} and {kv_cache.dtype}")
    if not q.is_contiguous():
        raise ValueError(f"q must be contiguous, got strides {q.stride()}")
    B = seq_lens.shape[0]
    for name, x, dims in (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
        if x.dim() != dims or x.shape[0] != B or x.dtype != torch.int32 or not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous int32 with {dims} dims and {B} rows, "
                             f"got {tuple(x.shape)} {x.dtype} strides {x.stride()}")
    for name, x in (("kv_cache", kv_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens)):
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    return q.shape[1], K, D, P
