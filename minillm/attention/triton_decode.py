"""Paged decode attention in Triton: one new query token per request over its whole context.

Algorithm (flash-decoding with grouped-query attention):
- One program per (request b, KV head, split). The G = H / K query heads that read this KV head
  are the rows of one (BLOCK_G, D) query tile, padded with zero rows to at least 16 because
  tl.dot needs M, N, K >= 16, so each K/V tile loaded is used by all G heads at once.
- The program walks its share of the context in tiles of BLOCK_N positions. Position pos sits in
  slot table[pos // P] * P + pos % P, so tiles need not line up with blocks and any P works.
- Per tile: scores = q @ k^T, then online softmax in fp32 in base 2: a running max m, a running
  sum l of 2^(score * scale * log2(e) - m) and acc = the same weights times v, rescaled whenever
  m grows. exp2 is the GPU's native instruction (exp costs a multiply more), and the softmax
  scale rides in the same multiply-add that subtracts m.
- Without splits a program owns a request's whole context and writes acc / l. With splits
  (long contexts at small batch, see choose_num_splits) each program writes its partial output
  and log-sum-exp lse = m + log2(l) (base 2), and merge_splits_kernel combines them:
  out = sum_s 2^(lse_s - max lse) * out_s / sum_s 2^(lse_s - max lse).
- Each program cuts the split from its own request's seq_len, read on the device (split_range):
  the launch (grid, arguments) depends only on shapes, so a CUDA graph captured once stays
  valid, and a 1k-token context under a 131k-token max_model_len is spread over all splits
  instead of landing in split 0. A split that starts at or past seq_len is empty: its loop runs
  zero times, it writes 0 with lse -inf and weighs 0 in the merge. Split 0 always holds
  position 0, so the max is finite.

Layout: the cache stays (N, P, K, D), position-major as in vLLM, not head-major (N, K, P, D).
Each position's K (or V) row of one head is D contiguous values, 128 to 256 bytes at D = 64 to
128 in 16 bits, so a tile's loads are already whole memory transactions; head-major would make
a block's P rows of one head contiguous, which only pays with bulk copies (TMA) of tiles that
are exactly one block, tying BLOCK_N to P, while the KV write, the PyTorch reference, the
prefix cache's block copies and the chapters all read (N, P, K, D).

An int8 or fp8 cache (KV_DTYPE, minillm.quant.kv) is dequantized right after each tile's load:
upcast to fp32, times the KV head's scale (one per program, loaded once), then in the queries'
dtype, so the rest of the kernel runs as for an unquantized cache. KV_DTYPE="auto" compiles
without any of it.

The inputs are checked on the host before a launch by paged_inputs.py, which the extend kernel
(triton_extend.py) shares.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minillm.attention.paged_inputs import check_paged_inputs, head_dim_block
from minillm.attention.tiles import tiles_for
from minillm.attention.triton_write_kv import dequantize, kv_dtype_name, scale_pointers
from minillm.device import dot_precision, interpreting

MIN_SPLIT_TOKENS = 256  # a shorter split costs more (partial store and merge) than it saves
MAX_SPLITS = 16
LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e))


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, pos, valid, kv_head, d, K, D,
                 P: tl.constexpr, UPCAST: tl.constexpr, k_scale, v_scale, dtype: tl.constexpr,
                 KV_DTYPE: tl.constexpr):
    """K and V (BLOCK_N, BLOCK_D) at context positions pos, read through one request's block
    table; zero where not valid and past D. In the cache's dtype (tensor cores take fp16 and
    bf16 as they are), or in fp32 with UPCAST (the CPU interpreter has no bf16 arithmetic).
    An int8 or fp8 cache (KV_DTYPE) is dequantized with k_scale and v_scale into dtype."""
    block = tl.load(table_ptr + pos // P, mask=valid, other=0).to(tl.int64)
    slot = block * P + pos % P  # (BLOCK_N,)
    rows = (slot * K + kv_head) * D  # row (slot, kv_head) of a (N * P, K, D) cache half
    offsets = rows[:, None] + d[None, :]  # (BLOCK_N, BLOCK_D)
    mask = valid[:, None] & (d < D)[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    if KV_DTYPE != "auto":
        k, v = dequantize(k, k_scale, dtype), dequantize(v, v_scale, dtype)
    return k, v


@triton.jit
def online_softmax_step(q, k, v, visible, m, l, acc, qk_scale, MASKED: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """Fold one tile of keys into the running base-2 softmax of each query row.

    q (M, BLOCK_D), k and v (BLOCK_N, BLOCK_D); m and l (M,), acc (M, BLOCK_D); qk_scale is
    the softmax scale times log2(e), so 2^(score * qk_scale) = e^(score * scale). With MASKED,
    visible (M or 1, BLOCK_N) hides keys; without it (a tile every row sees whole) the mask is
    not even computed. Each row must see a key in its first tile: then m is finite from there
    on and exp2(m - m_new) is never exp2(-inf + inf) = NaN.
    """
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (M, BLOCK_N)
    if MASKED:
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1) * qk_scale)
    alpha = tl.exp2(m - m_new)  # rescales what was summed under the old max
    p = tl.exp2(scores * qk_scale - m_new[:, None])  # (M, BLOCK_N), one multiply-add each
    l = l * alpha + tl.sum(p, 1)
    # p is rounded to v's dtype for the second product, as flash attention does on GPUs.
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)  # (M, BLOCK_D)
    acc = acc * alpha[:, None] + pv
    return m_new, l, acc


@triton.jit
def load_scales(k_scale_ptr, v_scale_ptr, kv_head, KV_DTYPE: tl.constexpr):
    """The K and V scales of one KV head of a quantized cache; 1.0 (never used) for "auto"."""
    if KV_DTYPE == "auto":
        k_scale, v_scale = 1.0, 1.0
    else:
        k_scale, v_scale = tl.load(k_scale_ptr + kv_head), tl.load(v_scale_ptr + kv_head)
    return k_scale, v_scale


@triton.jit
def split_range(seq_len, split, num_splits, min_split_len, BLOCK_N: tl.constexpr):
    """Positions [start, end) of one split of a context of seq_len positions: num_splits
    equal runs of whole tiles, each at least min_split_len long (so a short context uses fewer
    splits and the rest are empty, start >= end)."""
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    split_len = tl.maximum(split_len, min_split_len)
    start = split * split_len
    return start, tl.minimum(start + split_len, seq_len)


@triton.jit
def decode_kernel(
    q_ptr,  # (B, H, D) one query token per request, contiguous
    k_cache_ptr, v_cache_ptr,  # (N, P, K, D) each: the two halves of the layer's cache
    k_scale_ptr, v_scale_ptr,  # (K,) fp32 per-head scales of a quantized cache; else unused
    block_tables_ptr,  # (B, max_blocks) int32
    seq_lens_ptr,  # (B,) int32 context length, this token included
    out_ptr,  # (B, H, D); with SPLIT, the (B, H, num_splits, D) fp32 partial outputs
    lse_ptr,  # with SPLIT, (B, H, num_splits) fp32 base-2 log-sum-exp per split; else unused
    max_blocks, num_splits, min_split_len, qk_scale, H, K, D,
    P: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    KV_DTYPE: tl.constexpr,
):
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G = H // K
    g, d = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
    rows = b * H + kv_head * G + g  # rows of (B * H, D): the query heads reading this KV head
    row_mask = (g < G)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + rows[:, None] * D + d[None, :], mask=row_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)  # (BLOCK_G, BLOCK_D)
    start, end = split_range(tl.load(seq_lens_ptr + b), split, num_splits, min_split_len,
                             BLOCK_N)
    table = block_tables_ptr + b * max_blocks
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    k_scale, v_scale = load_scales(k_scale_ptr, v_scale_ptr, kv_head, KV_DTYPE)
    # One loop, every tile masked: a decode split has at most one partial tile, and a second
    # loop for it would double the body's registers (ptxas spills 1.6 KB on sm_75 then).
    for tile in range(start, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, pos, valid, kv_head, d, K, D, P,
                            UPCAST, k_scale, v_scale, q.dtype, KV_DTYPE)
        m, l, acc = online_softmax_step(q, k, v, valid[None, :], m, l, acc, qk_scale, True,
                                        DOT_PRECISION)
    if SPLIT:
        # An empty split has acc = 0, l = 0 and m = -inf: with l = 1 it stores 0 and lse -inf.
        l = tl.where(l > 0, l, 1.0)
        part = rows * num_splits + split  # rows of (B * H * num_splits, D)
        tl.store(out_ptr + part[:, None] * D + d[None, :], acc / l[:, None], mask=row_mask)
        tl.store(lse_ptr + part, m + tl.log2(l), mask=g < G)
    else:
        out = acc / l[:, None]
        tl.store(out_ptr + rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_mask)


@triton.jit
def merge_splits_kernel(
    part_ptr,  # (B, H, num_splits, D) fp32 partial outputs
    lse_ptr,  # (B, H, num_splits) fp32 base-2 log-sum-exp of each split, -inf if empty
    out_ptr,  # (B, H, D)
    num_splits, D,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # one (request, head) row of (B * H, D)
    s, d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
    mask = (s < num_splits)[:, None] & (d < D)[None, :]
    part = tl.load(part_ptr + (row * num_splits + s)[:, None] * D + d[None, :], mask=mask,
                   other=0.0)  # (BLOCK_S, BLOCK_D)
    weight = tl.exp2(lse - tl.max(lse, 0))  # split 0 is never empty: the max is finite
    out = tl.sum(weight[:, None] * part, 0) / tl.sum(weight, 0)  # (BLOCK_D,)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, num_splits: int | None = None,
                     min_split_len: int = MIN_SPLIT_TOKENS,
                     kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per request over its paged context: q (B, H, D) -> (B, H, D).

    Must match minillm.attention.torch_ref.decode_attention. kv_cache (2, N, P, K, D),
    block_tables (B, max_blocks) int32, seq_lens (B,) int32. num_splits=None lets
    choose_num_splits pick from the shapes alone; each request's context is then cut into
    that many splits of at least min_split_len positions by the kernel, from its own seq_len.
    Every count >= 1 gives the same result up to rounding. kv_scales (2, K) fp32 go with an
    int8 or fp8 cache (minillm.quant.kv).
    """
    H, K, D, P = check_paged_inputs(q, kv_cache, block_tables, seq_lens, kv_scales)
    B = seq_lens.shape[0]
    if q.shape[0] != B:
        raise ValueError(f"q must hold one token per request: {B} rows, got {q.shape[0]}")
    out = torch.empty_like(q)
    if B == 0:
        return out
    if num_splits is None:
        max_seq_len = block_tables.shape[1] * P  # a bound known without reading seq_lens back
        num_splits = choose_num_splits(B, K, max_seq_len, num_sms(q.device))
    if num_splits == 1:
        launch_decode(q, kv_cache, block_tables, seq_lens, out, out, 1, min_split_len,
                      kv_scales=kv_scales)
        return out
    part, lse = decode_splits(q, kv_cache, block_tables, seq_lens, num_splits, min_split_len,
                              kv_scales)
    merge_splits_kernel[(B * H,)](part, lse, out, num_splits, D,
                                  BLOCK_S=triton.next_power_of_2(num_splits),
                                  BLOCK_D=head_dim_block(D))
    return out


def decode_splits(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, num_splits: int, min_split_len: int = MIN_SPLIT_TOKENS,
                  kv_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The splits before their merge: partial outputs (B, H, num_splits, D) fp32, each the
    softmax-weighted mean of V over its split, and their base-2 log-sum-exps (B, H,
    num_splits) fp32, -inf for an empty split. With q = 0 every score is 0, so 2^lse is the
    number of positions a split read: how the tests count the work of each split."""
    H, K, D, _ = check_paged_inputs(q, kv_cache, block_tables, seq_lens, kv_scales)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    B = seq_lens.shape[0]
    part = q.new_empty(B, H, num_splits, D, dtype=torch.float32)
    lse = q.new_empty(B, H, num_splits, dtype=torch.float32)
    launch_decode(q, kv_cache, block_tables, seq_lens, part, lse, num_splits, min_split_len,
                  split=True, kv_scales=kv_scales)
    return part, lse


def launch_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, num_splits: int,
                  min_split_len: int, split: bool = False,
                  kv_scales: torch.Tensor | None = None) -> None:
    """decode_kernel over (B, K, num_splits) programs with the device's tiles. Every argument
    comes from shapes, never from the values of seq_lens: a CUDA graph can replay it."""
    B, H, D = q.shape
    K = kv_cache.shape[3]
    tiles = tiles_for(q.device, D, q.dtype).decode
    k_scale, v_scale = scale_pointers(kv_cache, kv_scales)
    decode_kernel[(B, K, num_splits)](
        q, kv_cache[0], kv_cache[1], k_scale, v_scale, block_tables, seq_lens, out, lse,
        block_tables.shape[1], num_splits, max(min_split_len, 1), LOG2_E / math.sqrt(D), H, K, D,
        P=kv_cache.shape[2], BLOCK_G=max(16, triton.next_power_of_2(H // K)),
        BLOCK_N=tiles.block_n, BLOCK_D=head_dim_block(D), SPLIT=split,
        DOT_PRECISION=dot_precision(q.dtype), UPCAST=interpreting(),
        KV_DTYPE=kv_dtype_name(kv_cache), num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many splits of the context each (request, KV head) program gets.

    Split only when the B * K programs would leave streaming multiprocessors idle, into enough
    splits to give each SM a program, but never below MIN_SPLIT_TOKENS positions per split.
    """
    programs = num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    to_fill_gpu = triton.cdiv(num_sms, programs)
    by_length = max(1, max_seq_len // MIN_SPLIT_TOKENS)
    return min(to_fill_gpu, by_length, MAX_SPLITS)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 for the CPU interpreter, which runs the
    programs one after another, so splitting there only adds work."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
