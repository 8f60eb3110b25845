"""Paged attention in plain PyTorch: the readable reference every other backend must match.

Shapes: T tokens in the step, B requests, H query heads, K KV heads (H = G * K, grouped-query
attention), D head dim, N blocks of P slots, S context length.

A quantized pool (kv_cache_dtype "int8" or "fp8", minillm.quant.kv) comes with kv_scales
(2, K) for the layer: K and V are quantized as they are written and dequantized to the queries'
dtype as they are gathered, so the attention itself is unchanged. kv_scales=None: the pool is in
the activations' dtype and nothing is converted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.batch import AttentionMetadata
from minillm.quant.kv import dequantize_kv, is_quantized, quantize_kv


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scales: torch.Tensor | None = None) -> None:
    """Store the step's K and V (T, K, D) in the layer's cache (2, N, P, K, D) at their slots;
    quantized with kv_scales (2, K) when the cache is int8 or fp8."""
    _, N, P, K, D = kv_cache.shape
    if kv_scales is not None:
        k = quantize_kv(k, kv_scales[0], kv_cache.dtype)
        v = quantize_kv(v, kv_scales[1], kv_cache.dtype)
    if kv_cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no fp8 CPU kernel: copy bytes
        kv_cache, k, v = kv_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    kv_cache[0].view(N * P, K, D).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(N * P, K, D).index_copy_(0, slot_mapping, v)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One request's first seq_len K (or V) rows, in order: (N, P, K, D) -> (S, K, D)."""
    P = cache.shape[1]
    blocks = block_table[: -(-seq_len // P)]
    # index_select copies whole blocks row by row; cache[blocks] (advanced indexing) does the
    # same copy 3-4x slower on a CPU.
    return cache.index_select(0, blocks).flatten(0, 1)[:seq_len]  # (n, P, K, D) -> (S, K, D)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, kv_scales: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """One query token per request, all requests at once: (B, H, D) -> (B, H, D)."""
    B, H, D = q.shape
    _, _, P, K, _ = kv_cache.shape
    num_blocks = -(-int(seq_lens.max()) // P)
    blocks = block_tables[:, :num_blocks].flatten().long()  # every request's first n blocks
    k = kv_cache[0].index_select(0, blocks).view(B, num_blocks * P, K, D)  # (B, S, K, D)
    v = kv_cache[1].index_select(0, blocks).view(B, num_blocks * P, K, D)
    if kv_scales is not None:
        k, v = dequantize_kv(k, kv_scales[0], q.dtype), dequantize_kv(v, kv_scales[1], q.dtype)
    S = k.shape[1]
    visible = torch.arange(S, device=q.device)[None, :] < seq_lens[:, None]  # (B, S)
    # Grouped-query attention as G query rows per KV head: the H = K * G heads of one token
    # become a (K, G) grid, so each KV head's keys are read once for its G queries, where
    # enable_gqa would expand K and V to H heads first (about 1.5x slower on a CPU here).
    out = F.scaled_dot_product_attention(
        q.view(B, K, H // K, D),  # (B, K, G, D)
        k.transpose(1, 2), v.transpose(1, 2),  # (B, K, S, D)
        attn_mask=visible[:, None, None, :],  # (B, 1, 1, S)
    )
    return out.reshape(B, H, D)  # (B, K, G, D) -> (B, H, D)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_len: int,
                     kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """One request's n new tokens over its whole context, the new ones causally: (n, H, D).

    The first seq_len - n context tokens were cached by earlier steps (a prefix or earlier
    chunks); query i sits at position seq_len - n + i and sees every key up to it.
    """
    n = q.shape[0]
    k = gather_context(k_cache, block_table, seq_len)  # (S, K, D)
    v = gather_context(v_cache, block_table, seq_len)
    if kv_scales is not None:
        k, v = dequantize_kv(k, kv_scales[0], q.dtype), dequantize_kv(v, kv_scales[1], q.dtype)
    query_pos = torch.arange(seq_len - n, seq_len, device=q.device)
    visible = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]  # (n, S)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),  # (H, n, D)
        k.transpose(0, 1), v.transpose(0, 1),  # (K, S, D)
        attn_mask=visible, enable_gqa=True,
    )
    return out.transpose(0, 1)  # (H, n, D) -> (n, H, D)


class TorchAttention:
    """The reference backend: writes K/V into the paged cache, then attends through it."""

    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, kv_scales: torch.Tensor | None = None) -> torch.Tensor:
        """q (T, H, D), k and v (T, K, D), kv_cache (2, N, P, K, D) -> (T, H, D); kv_scales
        (2, K) fp32 for an int8 or fp8 cache (minillm.quant.kv), None for one in q's dtype."""
        check_kv_scales(kv_cache, kv_scales)
        write_kv(k, v, kv_cache, meta.slot_mapping, kv_scales)
        decodes = [b for b, n in enumerate(meta.query_lens) if n == 1]
        if len(decodes) == len(meta.query_lens):  # decode only: row b is request b's token
            return decode_attention(q, kv_cache, meta.block_tables, meta.seq_lens, kv_scales)
        out = torch.empty_like(q)
        starts = meta.query_start_cpu
        if decodes:
            rows = torch.tensor([starts[b] for b in decodes], device=q.device)
            seqs = torch.tensor(decodes, device=q.device)
            out[rows] = decode_attention(q[rows], kv_cache, meta.block_tables[seqs],
                                         meta.seq_lens[seqs], kv_scales)
        for b, n in enumerate(meta.query_lens):
            if n > 1:
                lo = starts[b]
                out[lo:lo + n] = extend_attention(q[lo:lo + n], kv_cache[0], kv_cache[1],
                                                  meta.block_tables[b].long(), meta.seq_lens_cpu[b],
                                                  kv_scales)
        return out


def check_kv_scales(kv_cache: torch.Tensor, kv_scales: torch.Tensor | None) -> None:
    """A quantized cache (2, N, P, K, D) needs its scales (2, K) fp32; one in the activations'
    dtype takes none. Raise a ValueError that says which is missing or wrong."""
    if not is_quantized(kv_cache):
        if kv_scales is not None:
            raise ValueError(f"kv_scales were given for a {kv_cache.dtype} cache: scales go with "
                             "an int8 or fp8 cache (kv_cache_dtype='int8' or 'fp8') only")
        return
    K = kv_cache.shape[3]
    if kv_scales is None:
        raise ValueError(f"a {kv_cache.dtype} KV cache needs kv_scales (2, {K}) fp32 to "
                         "dequantize: calibrate them with "
                         "minillm.quant.kv_pool.calibrate_kv_scales")
    if (kv_scales.shape != (2, K) or kv_scales.dtype != torch.float32
            or kv_scales.device != kv_cache.device):
        raise ValueError(f"kv_scales must be (2, {K}) float32 on {kv_cache.device}, got "
                         f"{tuple(kv_scales.shape)} {kv_scales.dtype} on {kv_scales.device}")
