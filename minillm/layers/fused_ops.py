"""Fused Triton kernels for the decoder's small operations, which decode makes launch-bound.

At batch 1 a decode step moves a few kilobytes of activations per operation, so what it costs is
the number of kernels, not their bytes: in PyTorch, RMSNorm is about 8 elementwise kernels,
rotary about 10 per layer, and SwiGLU's silu and multiply 2 more. Each kernel here does one of
those groups in one launch, with the same arithmetic as the readable PyTorch code in
minillm.model, which stays the reference (and the CPU default); the tests run both, the kernels
under Triton's interpreter. LlamaForCausalLM.fuse switches a model to them (on CUDA by default).

Every kernel reads in the model's dtype, computes in fp32 and rounds to the dtype wherever the
PyTorch reference rounds (after each elementwise op), so the two agree to the last bit but for
the order of a sum; hence a fused model keeps transformers parity.
Importing this module imports triton, which decides then whether kernels run interpreted
(TRITON_INTERPRET=1): minillm.model imports it only when a model is fused.
Shapes: T tokens in the step, E hidden size, H query heads, K KV heads, D head dim, F MLP width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SILU_BLOCK = 1024  # elements of one token's F per program: wide enough to stream, few programs
ROTARY_WARPS = 1  # a rotary program holds D/2 pairs (32 or 64): one warp's worth


def norm_num_warps(block_e: int) -> int:
    """Warps for one RMSNorm row of block_e values: ~16 fp32 per thread (E = 2048 -> 4 warps,
    8192 -> 16), so a long row neither spills registers nor leaves threads idle."""
    return max(1, min(16, block_e // 512))


@triton.jit
def add_rms_norm_kernel(
    x_ptr, residual_ptr,  # (T, E) each, contiguous; residual unread without HAS_RESIDUAL
    weight_ptr,  # (E,)
    out_ptr, sum_ptr,  # (T, E) each: the normalised rows, and x + residual (unwritten without)
    E, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_E: tl.constexpr,  # E rounded up to a power of two: one program holds a whole row
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    mask = cols < E
    x = tl.load(x_ptr + t * E + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + t * E + cols, mask=mask, other=0.0).to(tl.float32)
        # Rounded as PyTorch's add rounds it: the next layer adds to exactly this value.
        total = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + t * E + cols, total, mask=mask)
        x = total.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / E + eps)
    h = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)  # cast back, then scale
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * E + cols, (w * h).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x + residual in one launch: (normalised (T, E), x + residual (T, E)).

    Without a residual it normalises x and returns x itself as the sum. Must match
    minillm.model.RMSNorm.forward.
    """
    T, E = x.shape
    for name, t in (("x", x), ("residual", residual)):
        if t is not None and (t.shape != (T, E) or t.dtype != x.dtype or not t.is_contiguous()):
            raise ValueError(f"{name} must be contiguous ({T}, {E}) {x.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype} strides {t.stride()}")
    if weight.shape != (E,) or weight.dtype != x.dtype:
        raise ValueError(f"weight must be ({E},) {x.dtype}, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
    out = torch.empty_like(x)
    total = x if residual is None else torch.empty_like(x)
    if T > 0:
        block_e = triton.next_power_of_2(E)
        add_rms_norm_kernel[(T,)](x, x if residual is None else residual, weight, out, total,
                                  E, eps, HAS_RESIDUAL=residual is not None, BLOCK_E=block_e,
                                  num_warps=norm_num_warps(block_e))
    return out, total


@triton.jit
def rotate_half_pair(x1, x2, cos, sin, dtype: tl.constexpr):
    """(x1 cos - x2 sin, x2 cos + x1 sin), rounding to dtype after each product and sum."""
    a = (x1 * cos).to(dtype).to(tl.float32)
    b = (x2 * sin).to(dtype).to(tl.float32)
    c = (x2 * cos).to(dtype).to(tl.float32)
    d = (x1 * sin).to(dtype).to(tl.float32)
    return (a - b).to(dtype), (c + d).to(dtype)


@triton.jit
def qkv_rotary_kernel(
    qkv_ptr,  # (T, (H + 2K) * D) contiguous: the merged projection's output
    rope_ptr,  # (T, D) contiguous: each token's cos (first D/2) and sin (last D/2)
    q_ptr, k_ptr, v_ptr,  # (T, H, D), (T, K, D), (T, K, D) contiguous outputs
    H, K,
    HALF: tl.constexpr,  # D / 2: head dimension i pairs with i + D/2 (Hugging Face's layout)
    BLOCK_HALF: tl.constexpr,  # HALF rounded up to a power of two
):
    # One program per (token, head) over the H + 2K heads of the row: q heads, k heads, v heads.
    t, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    mask = i < HALF
    src = qkv_ptr + (t * (H + 2 * K) + head) * 2 * HALF
    x1 = tl.load(src + i, mask=mask, other=0.0)
    x2 = tl.load(src + HALF + i, mask=mask, other=0.0)
    if head >= H + K:  # a v head: copied out as it is
        dst = v_ptr + (t * K + head - H - K) * 2 * HALF
        tl.store(dst + i, x1, mask=mask)
        tl.store(dst + HALF + i, x2, mask=mask)
    else:
        cos = tl.load(rope_ptr + t * 2 * HALF + i, mask=mask, other=0.0).to(tl.float32)
        sin = tl.load(rope_ptr + t * 2 * HALF + HALF + i, mask=mask, other=0.0).to(tl.float32)
        o1, o2 = rotate_half_pair(x1.to(tl.float32), x2.to(tl.float32), cos, sin,
                                  q_ptr.dtype.element_ty)
        if head < H:
            dst = q_ptr + (t * H + head) * 2 * HALF
        else:
            dst = k_ptr + (t * K + head - H) * 2 * HALF
        tl.store(dst + i, o1, mask=mask)
        tl.store(dst + HALF + i, o2, mask=mask)


def qkv_rotary(qkv: torch.Tensor, rope: torch.Tensor, num_heads: int, num_kv_heads: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split qkv (T, (H + 2K) D) into q (T, H, D), k and v (T, K, D), rotating q and k by rope
    (T, D) (cos | sin halves, in qkv's dtype), in one launch; all three come out contiguous.
    Must match minillm.model.split_qkv_rotary."""
    T, D = rope.shape
    H, K = num_heads, num_kv_heads
    if qkv.shape != (T, (H + 2 * K) * D) or not qkv.is_contiguous():
        raise ValueError(f"qkv must be contiguous ({T}, {(H + 2 * K) * D}) for H={H}, K={K}, "
                         f"D={D}; got {tuple(qkv.shape)} strides {qkv.stride()}")
    if D % 2 or rope.dtype != qkv.dtype or not rope.is_contiguous():
        raise ValueError(f"rope must be contiguous (T, D) {qkv.dtype} with D even, got "
                         f"{tuple(rope.shape)} {rope.dtype} strides {rope.stride()}")
    q = qkv.new_empty(T, H, D)
    k, v = qkv.new_empty(T, K, D), qkv.new_empty(T, K, D)
    if T > 0:
        qkv_rotary_kernel[(T, H + 2 * K)](qkv, rope, q, k, v, H, K, HALF=D // 2,
                                          BLOCK_HALF=triton.next_power_of_2(D // 2),
                                          num_warps=ROTARY_WARPS)
    return q, k, v


@triton.jit
def silu_and_mul_kernel(
    gate_up_ptr,  # (T, 2F) contiguous: gate in columns :F, up in F:
    out_ptr,  # (T, F)
    F,
    BLOCK: tl.constexpr,
):
    t, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    gate = tl.load(gate_up_ptr + t * 2 * F + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * 2 * F + F + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t * F + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up in one launch: gate_up (T, 2F) -> (T, F).
    Must match minillm.model.MLP's F.silu(gate) * up."""
    T, F2 = gate_up.shape
    if F2 % 2 or not gate_up.is_contiguous():
        raise ValueError(f"gate_up must be contiguous (T, 2F), got {tuple(gate_up.shape)} "
                         f"strides {gate_up.stride()}")
    out = gate_up.new_empty(T, F2 // 2)
    if T > 0:
        silu_and_mul_kernel[(T, triton.cdiv(F2 // 2, SILU_BLOCK))](gate_up, out, F2 // 2,
                                                                   BLOCK=SILU_BLOCK)
    return out
