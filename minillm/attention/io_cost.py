"""Attention as an IO problem: the bytes it moves, measured here and counted for a GPU.

peak_memory measures what a function allocates on this machine, from torch's own allocator
events. hbm_bytes_naive and hbm_bytes_tiled count the bytes a GPU moves between its HBM and its
on-chip SRAM for one attention forward pass, as the IO analysis of FlashAttention does (Dao et
al. 2022, section 3.2); attention_cost prices both on a Hardware's roofline. hbm_bytes_decode
counts one decode step's bytes, where the K/V stream, not the scores, is the traffic.
MEASURED_H200 records what our Triton kernels reached on an H200, and at which commit.

Symbols as on the book's notation page: a prefill of S tokens, T = S queries attending to S keys
(not causal: the count of the paper, which calls both N), D head dim, H query heads, K KV heads;
R the query rows of one tile, M the SRAM of one SM in elements. dtype_bytes is the size of one
element of Q, K, V, the scores and O.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.roofline import StepCost

# Shared memory (the SRAM a kernel's tiles live in) per streaming multiprocessor, in bytes.
# A100: 192 KB of L1/shared memory per SM, as FlashAttention's paper gives it (its section 2.1).
# Hopper (H100, H200): up to 228 KB of shared memory per SM (NVIDIA's Hopper Tuning Guide,
# docs.nvidia.com/cuda/hopper-tuning-guide).
SRAM_PER_SM: dict[str, int] = {
    "A100-40GB": 192 * 1024, "A100-80GB": 192 * 1024,
    "H100-SXM": 228 * 1024, "H100-PCIe": 228 * 1024, "H200": 228 * 1024,
}


def peak_memory(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """The most CPU memory fn(*args, **kwargs) holds at once, in bytes, above what was live
    when it started: the running maximum of torch's allocation (+) and free (-) events, taken
    in the order the profiler recorded them. Tensors allocated before the call (the inputs)
    do not count; the result does, while it is live. Exact for torch tensors, and the same on
    every run; memory outside torch's allocator (Python objects, NumPy) is not seen."""
    with _without_profiler_log(), profile(activities=[ProfilerActivity.CPU],
                                          profile_memory=True) as prof:
        fn(*args, **kwargs)
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def _without_profiler_log() -> Iterator[None]:
    """Drop the lines the profiler's C++ library (kineto) writes to file descriptor 2 at every
    start and stop, which no setting turns off; anything else written there is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines
                                     if not line.startswith(("USDT:", "STAGE:"))))


def _check(S: int, D: int, H: int, dtype_bytes: float) -> None:
    for name, value in (("S", S), ("D", D), ("H", H)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not dtype_bytes > 0:
        raise ValueError(f"dtype_bytes must be > 0 (2 for bf16), got {dtype_bytes!r}")


def hbm_bytes_naive(S: int, D: int, H: int, dtype_bytes: float) -> float:
    """Bytes standard attention moves through HBM for S tokens: 4·S·D + 4·S² elements per head.

    The three kernels of the paper's Algorithm 0: the scores Q Kᵀ read Q and K (2·S·D) and write
    the S x S scores (S²); the softmax reads them and writes the probabilities (2·S²); the
    output, probabilities x V, reads them and V (S² + S·D) and writes O (S·D). The S² terms
    dominate from S > D on.
    """
    _check(S, D, H, dtype_bytes)
    return H * dtype_bytes * (4 * S * D + 4 * S * S)


def tile_rows(D: int, dtype_bytes: float, sram_bytes: int) -> int:
    """Rows R of the square tiles a program holds in sram_bytes: the query tile Qᵢ, the key and
    value tiles Kⱼ, Vⱼ and the output accumulator Oᵢ, four R × D tiles (the R × R scores stay in
    registers). R = ⌊M / (4·D)⌋ for M = sram_bytes / dtype_bytes elements: the paper's M/(4d),
    its B_r and B_c."""
    rows = int(sram_bytes // (4 * D * dtype_bytes))
    if rows < 1:
        raise ValueError(f"{sram_bytes} bytes of SRAM cannot hold four 1 x {D} tiles of "
                         f"{dtype_bytes}-byte elements: give more SRAM or a smaller D")
    return rows


def hbm_bytes_tiled(S: int, D: int, H: int, dtype_bytes: float, sram_bytes: int) -> float:
    """Bytes tiled (flash) attention moves through HBM for S tokens, in our kernels' loop order.

    Each program owns one query tile of R rows (tile_rows): it reads Qᵢ once, streams every key
    and value tile past it, and writes Oᵢ once. Per head: S·D (Q) + S·D (O) + ⌈S/R⌉·2·S·D (K and
    V, read again by each of the ⌈S/R⌉ query tiles) elements. With R = M/(4D) the re-reads are
    8·S²·D²/M: Θ(S²·D²/M), FlashAttention's bound, D² included; the scores never reach HBM.
    Every re-read is counted as an HBM read: pessimistic on a GPU whose L2 cache keeps the K/V
    tiles between programs.
    """
    _check(S, D, H, dtype_bytes)
    query_tiles = math.ceil(S / tile_rows(D, dtype_bytes, sram_bytes))
    return H * dtype_bytes * (2 * S * D + query_tiles * 2 * S * D)


def hbm_bytes_decode(S: int, D: int, H: int, K: int, dtype_bytes: float,
                     materialized: bool = False) -> float:
    """Bytes one decode step's attention moves through HBM for one sequence: its one query
    token (H heads) over S cached positions of K KV heads.

    Either way it reads the K/V cache once, 2·S·K·D elements, and reads q and writes o, 2·H·D.
    materialized=True adds what standard attention does with the H x S scores: writes them,
    reads them for the softmax, writes the probabilities and reads them back, 4·H·S elements.
    Both are linear in S: the scores FlashAttention keeps on chip are 2·H/(K·D) of the K/V
    stream (6% at Llama-3's H/K = 4, D = 128), so tiling cannot be what relieves decode.
    """
    _check(S, D, H, dtype_bytes)
    if not isinstance(K, int) or K < 1 or H % K:
        raise ValueError(f"K (KV heads) must be a positive int dividing H = {H}, got {K!r}")
    elements = 2 * S * K * D + 2 * H * D + (4 * H * S if materialized else 0)
    return dtype_bytes * elements


def attention_flops(S: int, D: int, H: int) -> float:
    """FLOPs of the two matmuls, Q Kᵀ and probabilities x V: 2·S²·D each, per head (the
    softmax's few operations per score are left out, as the roofline's peak counts matmuls)."""
    _check(S, D, H, 1)
    return 4.0 * H * S * S * D


def sram_bytes_of(hw: Hardware | str) -> int:
    """SRAM_PER_SM of a GPU, with an error that names the known ones."""
    name = get_hardware(hw).name
    if name not in SRAM_PER_SM:
        raise ValueError(f"no SRAM size for {name!r}; known: {', '.join(SRAM_PER_SM)}. "
                         f"Pass sram_bytes explicitly")
    return SRAM_PER_SM[name]


def attention_cost(S: int, D: int, H: int, hw: Hardware | str, dtype_bytes: float = 2,
                   sram_bytes: int | None = None) -> tuple[StepCost, StepCost]:
    """(naive, tiled) costs of one forward pass of S x S attention on hw's roofline (modelled):
    roofline.StepCost, whose bytes are the HBM traffic counted above."""
    hw = get_hardware(hw)
    sram = sram_bytes_of(hw) if sram_bytes is None else sram_bytes
    flops = attention_flops(S, D, H)

    def cost(nbytes: float) -> StepCost:
        compute_time, memory_time = flops / hw.flops, nbytes / hw.bandwidth
        return StepCost(flops, nbytes, compute_time, memory_time, 0.0,
                        max(compute_time, memory_time))

    return (cost(hbm_bytes_naive(S, D, H, dtype_bytes)),
            cost(hbm_bytes_tiled(S, D, H, dtype_bytes, sram)))


@dataclass(frozen=True)
class KernelFigures:
    """What our Triton attention kernels reached on one GPU, measured there, and how: a record
    for a reader without that GPU, not a figure of the machine that reads it.

    decode_bandwidth: bytes/s of K/V the paged decode kernel read; prefill_flops: FLOP/s of the
    extend kernel on a whole (causal) prompt. workload, software and commit say what measured
    them, and when.
    """

    gpu: str
    decode_bandwidth: float
    prefill_flops: float
    workload: str
    software: str
    commit: str

    def fractions_of_peak(self) -> tuple[float, float]:
        """(decode bandwidth / datasheet bandwidth, prefill FLOP/s / datasheet FLOP/s)."""
        hw = get_hardware(self.gpu)
        return self.decode_bandwidth / hw.bandwidth, self.prefill_flops / hw.flops


# `python -m minillm.bench tiles` on an H200 chose the sm_90 tiles in minillm.attention.tiles
# with these figures (its docstring), at the commit that recorded them. The same commit's
# `bench kernels` run gave 4,427 GB/s (1.04 x a device-to-device copy of that run) and
# 338 TFLOP/s (0.47 x a dense bf16 matmul of that run).
MEASURED_H200 = KernelFigures(
    gpu="H200", decode_bandwidth=4431e9, prefill_flops=339e12,
    workload="Llama-3-8B heads (32 query, 8 KV, D = 128), bf16; decode: batch 64 x 4k "
             "context, 64-position tiles, 4 warps; prefill: one 4k prompt, 64 x 64 tiles, 4 warps",
    software="Triton 3.6", commit="4aef808e00013d023db4cd3c035b416a4e8b4b0d")
