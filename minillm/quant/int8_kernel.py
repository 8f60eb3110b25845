"""A Triton GEMM/GEMV of activations by weight-only int8 weights: out = (x @ q^T) * scale + bias.

Decode is bandwidth-bound: a step reads every weight once to multiply it by a handful of token
rows, so its time is the weights' bytes over the memory bandwidth. Int8 weights halve those
bytes against bf16 (a quarter of fp32); the kernel reads the int8 values as they are stored and
widens them in registers, so the bytes saved are bytes never moved. The per-output-channel
scale is common to a whole output column, so it factors out of the sum over K: the kernel
accumulates x . q in fp32 and scales once per output element at the end.

On a GPU the int8 values widen to the activations' dtype (exact: |q| <= 127 fits bf16's 8-bit
significand) and go to the tensor cores with x, accumulating in fp32; Triton's CPU interpreter
has no bf16 arithmetic, so there (UPCAST) both operands widen to fp32 after each load.
The reference it must match: minillm.quant.int8.Int8Linear's dequantize-then-matmul path.
Importing this module imports triton: minillm.quant.int8 imports it only on CUDA (or in tests).
Shapes: M token rows, K input features, N output features (channels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minillm.device import dot_precision, interpreting

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def int8_matmul_kernel(
    x_ptr,  # (M, K) contiguous: activations in the model's dtype
    w_ptr,  # (N, K) contiguous int8: one row per output channel, as nn.Linear stores weights
    scale_ptr,  # (N,) fp32: each output channel's step
    bias_ptr,  # (N,) in the model's dtype; unread without HAS_BIAS
    out_ptr,  # (M, N) contiguous, in the model's dtype
    M, N, K,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,  # widen both operands to fp32 (the interpreter's only arithmetic)
    DOT_PRECISION: tl.constexpr,  # for fp32 operands: "ieee" for fp32 models (exact products)
):
    # One program per (BLOCK_M rows, BLOCK_N channels) tile of the output, looping over K.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * K  # (BLOCK_M, 1) row starts
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K  # (BLOCK_N, 1) row starts
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0)
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        else:
            w = w.to(x.dtype)  # exact: int8 values are integers of at most 7 bits
        # (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N) -> (BLOCK_M, BLOCK_N), summed in fp32
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
    out = acc * scale[None, :]  # the scale is per column, so it comes out of the sum over K
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_rows = out_ptr + rows.to(tl.int64)[:, None] * N
    tl.store(out_rows + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@dataclass(frozen=True)
class Int8Tiles:
    """One launch's tile shape and warps. tl.dot needs every block at least 16."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4


# Decode (M <= 16 rows): a GEMV in effect, bandwidth-bound, so narrow column tiles give more
# programs to stream the weights in parallel, and a long K tile gives each load many bytes.
GEMV_TILES = Int8Tiles(block_m=16, block_n=32, block_k=128)
# Prefill: a real GEMM, where wider tiles reuse each loaded weight tile across more rows.
GEMM_TILES = Int8Tiles(block_m=64, block_n=64, block_k=64)
# Untuned: chosen by these rules of thumb, not timed on a GPU yet.


def tiles_for_rows(M: int) -> Int8Tiles:
    """The tiles a launch of M token rows uses (what the AOT compile test compiles)."""
    return GEMV_TILES if M <= GEMV_TILES.block_m else GEMM_TILES


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ dequantized weights^T: (M, N) in x's dtype, with weights qweight (N, K) int8
    times scale (N,) fp32 per row, plus bias (N,) if given. Must match
    minillm.quant.int8.Int8Linear's reference path (dequantize, then F.linear)."""
    if x.dim() != 2 or x.dtype not in ACTIVATION_DTYPES or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous (M, K) fp32, fp16 or bf16 tensor, got "
                         f"{tuple(x.shape)} {x.dtype} strides {tuple(x.stride())}")
    M, K = x.shape
    if qweight.dim() != 2 or qweight.shape[1] != K or qweight.dtype != torch.int8 \
            or not qweight.is_contiguous():
        raise ValueError(f"qweight must be contiguous (N, {K}) int8, got {tuple(qweight.shape)} "
                         f"{qweight.dtype} strides {tuple(qweight.stride())}")
    N = qweight.shape[0]
    if scale.shape != (N,) or scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"scale must be contiguous ({N},) fp32, got {tuple(scale.shape)} "
                         f"{scale.dtype}")
    if bias is not None and (bias.shape != (N,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be ({N},) {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    tiles = tiles_for_rows(M)
    grid = (triton.cdiv(M, tiles.block_m), triton.cdiv(N, tiles.block_n))
    int8_matmul_kernel[grid](
        x, qweight, scale, x if bias is None else bias, out, M, N, K,
        HAS_BIAS=bias is not None, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, UPCAST=interpreting(), DOT_PRECISION=dot_precision(x.dtype),
        num_warps=tiles.num_warps)
    return out
