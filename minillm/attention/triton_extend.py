"""Paged prefill/extend attention in Triton: variable-length chunks of new tokens per request.

Request b's n = query_lens[b] new tokens are rows query_start_loc[b]:[b+1] of q, at positions
seq_len - n .. seq_len - 1 of its context. Query i sees every key up to its own position: the
cached prefix (positions < seq_len - n, all visible) and the new tokens causally.

Algorithm (flash attention over a paged cache):
- One program per (query head, request, tile of BLOCK_M new tokens). Query head h reads KV
  head h // G, G = H / K. The head varies fastest in the launch order, so the G heads that
  read one KV head run side by side and find its tiles in L2.
- The program walks keys 0 .. (position of its last query) in tiles of BLOCK_N, gathering each
  tile through the block table as decode does (load_kv_tile), and folds each into an fp32
  base-2 online softmax (online_softmax_step). Keys up to the tile's first query are visible
  to every row, so those whole tiles skip the mask; only the tiles that cross the diagonal
  apply key_pos <= query_pos.
- Key 0 is in the first tile and visible to every row, so no row's running max stays -inf.
- A request's last query tile sees the most keys: programs take their tiles last first, so
  the heaviest are dispatched first and the light ones fill the GPU's tail.
- Rows past n (padding of the last query tile) are computed but never stored.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minillm.attention.paged_inputs import check_paged_inputs, head_dim_block
from minillm.attention.tiles import tiles_for
from minillm.attention.triton_decode import LOG2_E, load_kv_tile, load_scales, online_softmax_step
from minillm.attention.triton_write_kv import kv_dtype_name, scale_pointers
from minillm.device import dot_precision, interpreting


@triton.jit
def extend_kernel(
    q_ptr,  # (T, H, D) the step's queries, contiguous
    k_cache_ptr, v_cache_ptr,  # (N, P, K, D) each: the two halves of the layer's cache
    k_scale_ptr, v_scale_ptr,  # (K,) fp32 per-head scales of a quantized cache; else unused
    block_tables_ptr,  # (B, max_blocks) int32
    query_start_loc_ptr,  # (B + 1,) int32: request b's rows are [b] .. [b + 1] - 1
    seq_lens_ptr,  # (B,) int32 context length, this step's tokens included
    seq_ids_ptr,  # (E,) int32 the requests this launch covers
    out_ptr,  # (T, H, D); rows of requests outside seq_ids are left alone
    max_blocks, qk_scale, H, K, D,
    P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, KV_DTYPE: tl.constexpr,
):
    head, b = tl.program_id(0), tl.load(seq_ids_ptr + tl.program_id(1))
    q_start = tl.load(query_start_loc_ptr + b)
    n = tl.load(query_start_loc_ptr + b + 1) - q_start
    query_tile = tl.cdiv(n, BLOCK_M) - 1 - tl.program_id(2)  # the last (heaviest) one first
    if query_tile < 0:
        return  # this request has fewer query tiles than the longest one in the launch
    first = query_tile * BLOCK_M
    seq_len = tl.load(seq_lens_ptr + b)
    i, d = first + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D)
    query_pos = seq_len - n + i  # (BLOCK_M,) position of each query in the context
    rows = (q_start + i) * H + head  # rows of (T * H, D)
    row_mask = (i < n)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + rows[:, None] * D + d[None, :], mask=row_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)  # (BLOCK_M, BLOCK_D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table, kv_head = block_tables_ptr + b * max_blocks, head // (H // K)
    k_scale, v_scale = load_scales(k_scale_ptr, v_scale_ptr, kv_head, KV_DTYPE)
    end = tl.minimum(seq_len, seq_len - n + first + BLOCK_M)  # 1 past the tile's last query
    full_end = (seq_len - n + first + 1) // BLOCK_N * BLOCK_N  # keys <= the first query's
    for tile in range(0, full_end, BLOCK_N):  # seen by every row: no mask on the scores
        pos = tile + tl.arange(0, BLOCK_N)
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, pos, pos < end, kv_head, d, K, D,
                            P, UPCAST, k_scale, v_scale, q.dtype, KV_DTYPE)
        m, l, acc = online_softmax_step(q, k, v, None, m, l, acc, qk_scale, False, DOT_PRECISION)
    for tile in range(full_end, end, BLOCK_N):  # the tiles that cross the causal diagonal
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, pos, valid, kv_head, d, K, D, P,
                            UPCAST, k_scale, v_scale, q.dtype, KV_DTYPE)
        visible = valid[None, :] & (pos[None, :] <= query_pos[:, None])  # (BLOCK_M, BLOCK_N)
        m, l, acc = online_softmax_step(q, k, v, visible, m, l, acc, qk_scale, True,
                                        DOT_PRECISION)
    out = acc / l[:, None]
    tl.store(out_ptr + rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask)


def extend_attention(q: torch.Tensor, kv_cache: torch.Tensor, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, block_tables: torch.Tensor, max_query_len: int,
                     seq_ids: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each request's new tokens over its paged context: (T, H, D).

    Must match minillm.attention.torch_ref.extend_attention applied to each request b, on rows
    query_start_loc[b]:[b + 1] with block_tables[b] and seq_lens[b]. kv_cache (2, N, P, K, D);
    query_start_loc (B + 1,), seq_lens (B,), block_tables (B, max_blocks), all int32.
    max_query_len bounds the query tiles launched per request. seq_ids (E,) int32 picks the
    requests to compute (default: all B); their rows are written into out (default: new).
    kv_scales (2, K) fp32 go with an int8 or fp8 cache (minillm.quant.kv).
    """
    H, K, D, P = check_paged_inputs(q, kv_cache, block_tables, seq_lens, kv_scales)
    B = seq_lens.shape[0]
    if query_start_loc.shape != (B + 1,) or query_start_loc.dtype != torch.int32:
        raise ValueError(f"query_start_loc must be ({B + 1},) int32, "
                         f"got {tuple(query_start_loc.shape)} {query_start_loc.dtype}")
    if seq_ids is None:
        seq_ids = torch.arange(B, dtype=torch.int32, device=q.device)
    if seq_ids.dim() != 1 or seq_ids.dtype != torch.int32:
        raise ValueError(f"seq_ids must be (E,) int32, got {tuple(seq_ids.shape)} {seq_ids.dtype}")
    if out is None:
        out = torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(q.shape)} {q.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype} strides {out.stride()}")
    if seq_ids.numel() == 0 or max_query_len == 0:
        return out
    tiles = tiles_for(q.device, D, q.dtype).extend
    grid = (H, seq_ids.numel(), triton.cdiv(max_query_len, tiles.block_m))
    k_scale, v_scale = scale_pointers(kv_cache, kv_scales)
    extend_kernel[grid](
        q, kv_cache[0], kv_cache[1], k_scale, v_scale, block_tables, query_start_loc, seq_lens,
        seq_ids, out,
        block_tables.shape[1], LOG2_E / math.sqrt(D), H, K, D,
        P=P, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=head_dim_block(D),
        DOT_PRECISION=dot_precision(q.dtype), UPCAST=interpreting(),
        KV_DTYPE=kv_dtype_name(kv_cache), num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out
