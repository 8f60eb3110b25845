"""The Triton attention backend: the same forward as TorchAttention, run by the Triton kernels.

One launch per layer: a decode-only step goes to the decode kernel, which shares each K/V tile
across the query heads of a group (and splits long contexts); any step with a prompt or a chunk
of one goes to the extend kernel whole, its decodes as extends of one token.

Importing this module defines the kernels, and triton.jit decides then, once, whether they are
compiled for CUDA or run by the CPU interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os

import torch
import triton

from minillm.attention.triton_decode import decode_attention, decode_kernel
from minillm.attention.triton_extend import extend_attention
from minillm.attention.triton_write_kv import write_kv
from minillm.batch import AttentionMetadata


def triton_available(device: torch.device) -> None:
    """Raise a RuntimeError that says what to do unless the Triton kernels can run on device:
    a CUDA GPU, or the CPU through Triton's interpreter."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("attention_backend='triton' on CUDA, but no CUDA device is visible")
        return
    if device.type != "cpu":
        raise RuntimeError(f"the triton attention backend runs on 'cuda' or, interpreted, on "
                           f"'cpu'; not on {device.type!r}: use attention_backend='torch'")
    how = ("set TRITON_INTERPRET=1 in the environment before triton or minillm is imported: "
           "`TRITON_INTERPRET=1 python ...`, or os.environ['TRITON_INTERPRET'] = '1' as the first "
           "line of the script (or use attention_backend='torch')")
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the triton attention backend on CPU needs Triton's interpreter: {how}")
    if isinstance(decode_kernel, triton.runtime.JITFunction):
        raise RuntimeError("TRITON_INTERPRET=1 was set after minillm's Triton kernels were "
                           f"imported, so they were built for CUDA: {how}")


class TritonAttention:
    """Writes K/V into the paged cache, then attends through it, with the Triton kernels."""

    name = "triton"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, kv_scales: torch.Tensor | None = None) -> torch.Tensor:
        """q (T, H, D), k and v (T, K, D), kv_cache (2, N, P, K, D) -> (T, H, D); kv_scales
        (2, K) fp32 for an int8 or fp8 cache (minillm.quant.kv), None for one in q's dtype."""
        write_kv(k, v, kv_cache, meta.slot_mapping, kv_scales)
        if meta.max_query_len == 1:  # all decode: row b is request b
            return decode_attention(q, kv_cache, meta.block_tables, meta.seq_lens,
                                    kv_scales=kv_scales)
        # Prompts and chunks, and in a mixed step its decodes too, in one launch: a decode is an
        # extend of one token (SGLang's mixed batches do the same). Splitting the step between
        # the two kernels would need per-layer index tensors and gather/scatter launches.
        return extend_attention(q, kv_cache, meta.query_start_loc, meta.seq_lens,
                                meta.block_tables, meta.max_query_len, kv_scales=kv_scales)
