"""Paged decode attention in Triton: one new query token per request over its whole context.

Algorithm (flash-decoding with grouped-query attention):
- One program per (request b, KV head, split). The G = H / K query heads that read this KV head
  are the rows of one (BLOCK_G, D) query tile, padded with zero rows to at least 16 because
  tl.dot needs M, N, K >= 16, so each K/V tile loaded is used by all G heads at once.
- The program walks its share of the context in tiles of BLOCK_N positions. Position pos sits in
  slot table[pos // P] * P + pos % P, so tiles need not line up with blocks and any P works.
- Per tile: scores = q @ k^T * scale, then online softmax in fp32: a running max m, a running
  sum l of exp(score - m) and acc = sum of exp(score - m) * v, rescaled whenever m grows.
- Without splits a program owns a request's whole context and writes acc / l. With splits
  (long contexts at small batch, see choose_num_splits) each program writes its partial output
  and log-sum-exp lse = m + log(l), and merge_splits_kernel combines them:
  out = sum_s exp(lse_s - max lse) * out_s / sum_s exp(lse_s - max lse).
- A split that starts at or past seq_len is empty: its loop runs zero times, it writes 0 with
  lse -inf and weighs 0 in the merge. Split 0 always holds position 0, so the max is finite.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from minillm.attention.triton_write_kv import check_kv_cache

BLOCK_N = 32  # context positions per tile
MIN_SPLIT_TOKENS = 256  # a shorter split costs more (partial store and merge) than it saves
MAX_SPLITS = 16


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, pos, valid, kv_head, d, K, D,
                 P: tl.constexpr, UPCAST: tl.constexpr):
    """K and V (BLOCK_N, BLOCK_D) at context positions pos, read through one request's block
    table; zero where not valid and past D. In the cache's dtype (tensor cores take fp16 and
    bf16 as they are), or in fp32 with UPCAST (the CPU interpreter has no bf16 arithmetic)."""
    block = tl.load(table_ptr + pos // P, mask=valid, other=0).to(tl.int64)
    slot = block * P + pos % P  # (BLOCK_N,)
    rows = (slot * K + kv_head) * D  # row (slot, kv_head) of a (N * P, K, D) cache half
    offsets = rows[:, None] + d[None, :]  # (BLOCK_N, BLOCK_D)
    mask = valid[:, None] & (d < D)[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    return k, v


@triton.jit
def online_softmax_step(q, k, v, visible, m, l, acc, scale, DOT_PRECISION: tl.constexpr):
    """Fold one tile of keys into the running softmax of each query row.

    q (M, BLOCK_D), k and v (BLOCK_N, BLOCK_D), visible (M or 1, BLOCK_N); m and l (M,), acc
    (M, BLOCK_D). Each row must see a key in its first tile: then m is finite from there on
    and exp(m - m_new) is never exp(-inf + inf) = NaN.
    """
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (M, BLOCK_N)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
    p = tl.exp(scores - m_new[:, None])  # (M, BLOCK_N)
    l = l * alpha + tl.sum(p, 1)
    # p is rounded to v's dtype for the second product, as flash attention does on GPUs.
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)  # (M, BLOCK_D)
    acc = acc * alpha[:, None] + pv
    return m_new, l, acc


@triton.jit
def decode_kernel(
    q_ptr,  # (B, H, D) one query token per request, contiguous
    k_cache_ptr, v_cache_ptr,  # (N, P, K, D) each: the two halves of the layer's cache
    block_tables_ptr,  # (B, max_blocks) int32
    seq_lens_ptr,  # (B,) int32 context length, this token included
    out_ptr,  # (B, H, D); with SPLIT, the (B, H, num_splits, D) fp32 partial outputs
    lse_ptr,  # with SPLIT, (B, H, num_splits) fp32 log-sum-exp of each split; else unused
    max_blocks, num_splits, split_len, scale, H, K, D,
    P: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G = H // K
    g, d = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
    rows = b * H + kv_head * G + g  # rows of (B * H, D): the query heads reading this KV head
    row_mask = (g < G)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + rows[:, None] * D + d[None, :], mask=row_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)  # (BLOCK_G, BLOCK_D)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)  # start >= end: an empty split
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr + b * max_blocks, pos,
                            valid, kv_head, d, K, D, P, UPCAST)
        m, l, acc = online_softmax_step(q, k, v, valid[None, :], m, l, acc, scale, DOT_PRECISION)
    if SPLIT:
        # An empty split has acc = 0, l = 0 and m = -inf: with l = 1 it stores 0 and lse -inf.
        l = tl.where(l > 0, l, 1.0)
        part = rows * num_splits + split  # rows of (B * H * num_splits, D)
        tl.store(out_ptr + part[:, None] * D + d[None, :], acc / l[:, None], mask=row_mask)
        tl.store(lse_ptr + part, m + tl.log(l), mask=g < G)
    else:
        out = acc / l[:, None]
        tl.store(out_ptr + rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_mask)


@triton.jit
def merge_splits_kernel(
    part_ptr,  # (B, H, num_splits, D) fp32 partial outputs
    lse_ptr,  # (B, H, num_splits) fp32 log-sum-exp of each split, -inf for an empty one
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
    weight = tl.exp(lse - tl.max(lse, 0))  # split 0 is never empty: the max is finite
    out = tl.sum(weight[:, None] * part, 0) / tl.sum(weight, 0)  # (BLOCK_D,)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, num_splits: int | None = None) -> torch.Tensor:
    """One query token per request over its paged context: q (B, H, D) -> (B, H, D).

    Must match minillm.attention.torch_ref.decode_attention. kv_cache (2, N, P, K, D),
    block_tables (B, max_blocks) int32, seq_lens (B,) int32. num_splits=None lets
    choose_num_splits pick; every count >= 1 gives the same result up to rounding.
    """
    H, K, D, P = check_paged_inputs(q, kv_cache, block_tables, seq_lens)
    B = seq_lens.shape[0]
    if q.shape[0] != B:
        raise ValueError(f"q must hold one token per request: {B} rows, got {q.shape[0]}")
    out = torch.empty_like(q)
    if B == 0:
        return out
    max_seq_len = block_tables.shape[1] * P  # a bound known without reading seq_lens back
    if num_splits is None:
        num_splits = choose_num_splits(B, K, max_seq_len, num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    split_len = triton.cdiv(triton.cdiv(max_seq_len, num_splits), BLOCK_N) * BLOCK_N
    split = num_splits > 1
    part, lse = out, out  # written straight into out without splits
    if split:
        part = q.new_empty(B, H, num_splits, D, dtype=torch.float32)
        lse = q.new_empty(B, H, num_splits, dtype=torch.float32)
    decode_kernel[(B, K, num_splits)](
        q, kv_cache[0], kv_cache[1], block_tables, seq_lens, part, lse,
        block_tables.shape[1], num_splits, split_len, 1 / math.sqrt(D), H, K, D,
        P=P, BLOCK_G=max(16, triton.next_power_of_2(H // K)), BLOCK_N=BLOCK_N,
        BLOCK_D=head_dim_block(D), SPLIT=split, DOT_PRECISION=dot_precision(q.dtype),
        UPCAST=interpreting())
    if split:
        merge_splits_kernel[(B * H,)](part, lse, out, num_splits, D,
                                      BLOCK_S=triton.next_power_of_2(num_splits),
                                      BLOCK_D=head_dim_block(D))
    return out


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


def head_dim_block(D: int) -> int:
    """D padded to a power of two (tl.arange needs one) and to at least 16 (tl.dot needs it);
    the padding lanes are masked: zeros in q, k and v, never stored."""
    return max(16, triton.next_power_of_2(D))


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter, which needs fp32 arithmetic."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 operands. An fp32 model needs exact products ("ieee"); fp16
    and bf16 values upcast to fp32 (interpreter only) are exact in tf32. On a GPU, fp16 and bf16
    operands go to the tensor cores as they are and this setting does not apply to them."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_paged_inputs(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor) -> tuple[int, int, int, int]:
    """(H, K, D, P) after checking q (., H, D) against the cache (2, N, P, K, D) and the
    per-request block_tables (B, max_blocks) and seq_lens (B,), all int32 and contiguous."""
    _, _, P, K, D = check_kv_cache(kv_cache)
    if q.dim() != 3 or q.shape[2] != D or q.shape[1] % K != 0:
        raise ValueError(f"q must be (., H, {D}) with H a multiple of K = {K}, "
                         f"got {tuple(q.shape)}")
    if q.dtype != kv_cache.dtype or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"q and kv_cache must share one of fp32, fp16, bf16, "
                        f"got {q.dtype} and {kv_cache.dtype}")
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
