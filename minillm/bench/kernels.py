"""The paged attention kernels against the GPU's own limits, measured side by side in one run.

- Decode is memory-bound, so its figure is achieved bandwidth: the bytes it must move (K and V
  of every context token, the queries read, the output written) over its time, against a
  device-to-device copy of the same run (which reads and writes each byte: 2 x size / time).
- Prefill is compute-bound, so its figure is TFLOP/s of causal attention over one S-token
  prompt (QK^T and PV over the S(S+1)/2 visible pairs: 4 D H S(S+1)/2 FLOP), against a dense
  bf16 matmul of the same run.
- Both also against torch's scaled_dot_product_attention on contiguous (unpaged) K/V.
- The int8 weight GEMV (minillm.quant.int8_kernel, one token's row through a Llama-3-8B MLP
  weight, 14336 x 4096): achieved bandwidth against the copy, and its time against a bf16
  GEMV of the same weight, which reads twice the bytes (the ideal is 2x).
Shapes are Llama-3-8B's attention (H 32 query heads, K 8 KV heads, D 128, bf16; blocks of P 16).
Every time is the median of several CUDA-event timings after a warm-up. CUDA only.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

# The Triton kernels are imported inside the functions that time them: importing triton fixes
# whether kernels are compiled or interpreted, and the CLI imports this module on any machine.


@dataclass(frozen=True)
class Figure:
    """One measured figure beside a baseline measured in the same run.

    ratio: measured / baseline for rates, baseline / measured for times, so higher is better:
    the fraction of a hardware limit reached, or the speed-up over another implementation.
    target: the ratio the issue asks for, or None for a figure shown for context.
    """

    name: str
    value: float
    unit: str
    baseline_name: str
    baseline: float
    ratio: float
    target: float | None = None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "met": self.met}


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int = 32  # H
    num_kv_heads: int = 8  # K
    head_dim: int = 128  # D
    block_size: int = 16  # P
    dtype: torch.dtype = torch.bfloat16


LLAMA_3_8B = AttentionShape()


def cuda_time(fn: Callable[[], object], repeats: int = 10, calls: int = 10) -> float:
    """Median seconds per call of fn on the GPU. Each of the repeats times `calls` calls
    queued back to back between two CUDA events, so the host's launch cost overlaps."""
    for _ in range(3):  # warm-up: Triton compiles, cuBLAS picks its kernels, caches fill
        fn()
    events = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 / calls for s, e in events)


def copy_bandwidth(device: torch.device, nbytes: int = 2**31) -> float:
    """Bytes per second that a device-to-device copy moves, counting each byte read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / cuda_time(lambda: dst.copy_(src))


def matmul_flops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16
                 ) -> float:
    """FLOP per second of a dense (n, n) x (n, n) matmul in dtype (bf16; fp16 on a GPU without
    bf16 tensor cores, such as a T4): 2 n^3 FLOP per product."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / cuda_time(lambda: a @ b)


def paged_context(shape: AttentionShape, num_seqs: int, seq_len: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's cache (2, N, P, K, D) holding num_seqs contexts of seq_len random tokens in
    shuffled blocks, their block tables (B, S / P) int32 and seq_lens (B,) int32."""
    P, K, D = shape.block_size, shape.num_kv_heads, shape.head_dim
    blocks = -(-seq_len // P)
    N = num_seqs * blocks
    cache = torch.randn(2, N, P, K, D, device=device, dtype=shape.dtype)
    tables = torch.randperm(N, device=device).view(num_seqs, blocks).to(torch.int32)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
    return cache, tables, seq_lens


def contiguous_kv(cache: torch.Tensor, tables: torch.Tensor, seq_len: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same contexts unpaged, as SDPA takes them: K and V (B, K, S, D) each."""
    k = cache[0][tables.long()].flatten(1, 2)[:, :seq_len]  # (B, n, P, K, D) -> (B, S, K, D)
    v = cache[1][tables.long()].flatten(1, 2)[:, :seq_len]
    return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()


def decode_figures(shape: AttentionShape, batch: int, context: int, copy_bw: float,
                   device: torch.device) -> list[Figure]:
    """The decode kernel at batch x context against the copy and against SDPA."""
    from minillm.attention.triton_decode import decode_attention

    H, K, D = shape.num_heads, shape.num_kv_heads, shape.head_dim
    cache, tables, seq_lens = paged_context(shape, batch, context, device)
    q = torch.randn(batch, H, D, device=device, dtype=shape.dtype)
    # K and V of every context token read, the queries read and the output written.
    nbytes = (2 * batch * context * K + 2 * batch * H) * D * cache.element_size()
    paged = cuda_time(lambda: decode_attention(q, cache, tables, seq_lens))
    k, v = contiguous_kv(cache, tables, context)
    q4 = q[:, :, None]  # (B, H, 1, D)
    dense = cuda_time(lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True))
    name = f"decode B={batch} S={context}"
    gbs = nbytes / paged / 1e9
    return [
        Figure(f"{name}: paged Triton kernel", gbs, "GB/s", "device-to-device copy",
               copy_bw / 1e9, gbs * 1e9 / copy_bw, target=0.70),
        Figure(f"{name}: paged Triton kernel", gbs, "GB/s", "SDPA on contiguous K/V",
               nbytes / dense / 1e9, dense / paged),
    ]


def prefill_figures(shape: AttentionShape, tokens: int, matmul: float, device: torch.device
                    ) -> list[Figure]:
    """The prefill (extend) kernel on one prompt of `tokens` against the matmul and SDPA."""
    from minillm.attention.triton_extend import extend_attention

    H, D = shape.num_heads, shape.head_dim
    cache, tables, seq_lens = paged_context(shape, 1, tokens, device)
    q = torch.randn(tokens, H, D, device=device, dtype=shape.dtype)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    flop = 4 * D * H * tokens * (tokens + 1) / 2  # causal: the visible (query, key) pairs
    paged = cuda_time(lambda: extend_attention(q, cache, starts, seq_lens, tables, tokens))
    k, v = contiguous_kv(cache, tables, tokens)
    q4 = q.transpose(0, 1)[None].contiguous()  # (T, H, D) -> (1, H, T, D)
    dense = cuda_time(
        lambda: F.scaled_dot_product_attention(q4, k, v, is_causal=True, enable_gqa=True))
    name = f"prefill S={tokens}"
    tflops = flop / paged / 1e12
    return [
        Figure(f"{name}: paged Triton kernel", tflops, "TFLOP/s", "dense bf16 matmul",
               matmul / 1e12, tflops * 1e12 / matmul, target=0.40),
        Figure(f"{name}: paged Triton kernel", tflops, "TFLOP/s", "SDPA on contiguous K/V",
               flop / dense / 1e12, dense / paged),
    ]


def int8_gemv_figures(out_features: int, in_features: int, copy_bw: float, device: torch.device
                      ) -> list[Figure]:
    """One row x an int8 (N, K) weight with per-row scales: the bytes it must move (the int8
    weight, its fp32 scales, the bf16 row in and out) over its time, against the copy; and
    against torch's bf16 GEMV on the same weight dequantized."""
    from minillm.quant.int8 import dequantize, quantize_per_channel
    from minillm.quant.int8_kernel import int8_matmul

    N, K = out_features, in_features
    weight = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K**0.5
    qweight, scale = quantize_per_channel(weight)
    dense = dequantize(qweight, scale, torch.bfloat16)
    x = torch.randn(1, K, device=device, dtype=torch.bfloat16)
    nbytes = N * K + 4 * N + 2 * (K + N)
    int8 = cuda_time(lambda: int8_matmul(x, qweight, scale))
    bf16 = cuda_time(lambda: F.linear(x, dense))
    name = f"int8 GEMV {N}x{K}"
    gbs = nbytes / int8 / 1e9
    return [
        Figure(f"{name}: Triton int8 kernel", gbs, "GB/s", "device-to-device copy",
               copy_bw / 1e9, gbs * 1e9 / copy_bw, target=0.60),
        Figure(f"{name}: Triton int8 kernel", int8 * 1e6, "us", "bf16 GEMV (cuBLAS)",
               bf16 * 1e6, bf16 / int8),
    ]


@dataclass(frozen=True)
class Baselines:
    copy_bandwidth: float  # bytes/s, read + write
    matmul_flops: float  # FLOP/s, in the kernels' dtype (bf16 unless told)


def measure_baselines(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Baselines:
    return Baselines(copy_bandwidth(device), matmul_flops(device, dtype=dtype))


def kernel_figures(args: argparse.Namespace, base: Baselines, device: torch.device
                   ) -> list[Figure]:
    figures = decode_figures(LLAMA_3_8B, args.batch, args.context, base.copy_bandwidth, device)
    torch.cuda.empty_cache()
    figures += prefill_figures(LLAMA_3_8B, args.prefill_tokens, base.matmul_flops, device)
    torch.cuda.empty_cache()
    figures += int8_gemv_figures(14336, 4096, base.copy_bandwidth, device)
    torch.cuda.empty_cache()
    return figures


def format_table(figures: list[Figure]) -> str:
    """A Markdown table: figure, measured, baseline, ratio (higher is better), target."""
    lines = ["| figure | measured | baseline | ratio | target |", "|---|---:|---|---:|---|"]
    for f in figures:
        target = "" if f.target is None else f"≥ {f.target:.2f} {'met' if f.met else 'MISSED'}"
        lines.append(f"| {f.name} | {number(f.value)} {f.unit} | {f.baseline_name}: "
                     f"{number(f.baseline)} {f.unit} | {f.ratio:.2f} | {target} |")
    return "\n".join(lines)


def number(x: float) -> str:
    """Three significant digits, without an exponent for the magnitudes shown here."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64, help="decode batch size")
    parser.add_argument("--context", type=int, default=4096, help="decode context length")
    parser.add_argument("--prefill-tokens", type=int, default=4096)


def main(args: argparse.Namespace) -> int:
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}: Llama-3-8B attention (H 32, K 8, D 128), bf16")
    base = measure_baselines(device)
    print(format_table(kernel_figures(args, base, device)))
    return 0
