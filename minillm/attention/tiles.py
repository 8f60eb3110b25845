"""Tile sizes of the attention kernels, per GPU generation (keyed by compute capability).

A tile size is a trade between the work a program does per loaded K/V tile and what fits on
the chip: registers (the fp32 score and accumulator tiles, and the 64-bit addresses of a
gathered K/V tile: each row comes through the block table), shared memory (the tl.dot operands)
and how many programs run per SM at once. The table holds one choice per generation, each
checked ahead of time against its chip: tests/test_kernels.py compiles it for that target and
asserts it fits the shared memory. Where no GPU of a generation has measured its candidates,
the entry is one that spills no registers, and those checks decided it:

- Decode: 64 positions per tile with 8 warps on sm_86 and newer parts not yet measured; sm_80
  and sm_75 keep 32 with 8 warps (on sm_80 Triton 3.6 spills 64 at any stage count; on sm_75
  4 warps spill). Decode reads each K/V byte once and is bound by bandwidth: what keeps bytes
  in flight is enough programs per SM (hence split-KV at small batch), not big tiles.
- Prefill/extend: 64 query rows with 8 warps. Key tiles of 32 on sm_80 and the ~100 KB parts
  (sm_86, sm_89, sm_120: A10, L4, RTX cards), of 16 on sm_75 (T4). Flash attention's usual
  128 x 64 spills there, as did the old 64 x 32 on sm_75 (744 bytes).
- num_stages is what the launcher asks Triton's software pipeliner for; the K/V loads are
  gathers through the block table, and the compiled kernels' shared memory does not grow with
  it, so today it changes little.

The CPU interpreter runs one program after another; its tiles only need to be small enough
for the tests to cross tile boundaries (32 positions, as the chapters and tests assume).
Where a GPU was at hand, measurement decided instead (MEASURED): `python -m minillm.bench
tiles` times every candidate on the GPU it runs on. On an H200 it overturned the spill rule:
one warpgroup (4 warps) beats 8 warps in both kernels although it spills (decode 64 x 4 warps:
4,431 GB/s against 3,223, with 24 bytes of stack; prefill 64 x 64 x 4 warps: 339 TFLOP/s
against 161, with 656 bytes). The other entries are reasoned starting points until measured.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeTiles:
    block_n: int  # context positions per K/V tile
    num_warps: int
    num_stages: int  # K/V tiles in flight (software pipelining; 1 = none)


@dataclass(frozen=True)
class ExtendTiles:
    block_m: int  # new tokens (query rows) per program
    block_n: int  # context positions per K/V tile
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class KernelTiles:
    decode: DecodeTiles
    extend: ExtendTiles


AMPERE = KernelTiles(DecodeTiles(32, 8, 3), ExtendTiles(64, 32, 8, 3))
SMALL_SHARED = KernelTiles(DecodeTiles(64, 8, 2), ExtendTiles(64, 32, 8, 2))  # ~100 KB parts
TILES: dict[tuple[int, int], KernelTiles] = {  # (major, minor) compute capability
    (7, 5): KernelTiles(DecodeTiles(32, 8, 2), ExtendTiles(64, 16, 8, 2)),
    (8, 0): AMPERE,
    (8, 6): SMALL_SHARED,
    (8, 9): SMALL_SHARED,
    (9, 0): KernelTiles(DecodeTiles(64, 4, 3), ExtendTiles(64, 64, 4, 2)),
    (12, 0): SMALL_SHARED,
}
# The entries chosen by timing the candidates on a GPU of that generation (bench tiles), with
# what measured them; the spill check does not apply to them.
MEASURED: dict[tuple[int, int], str] = {
    (9, 0): "H200, Triton 3.6, Llama-3-8B heads in bf16: decode B=64 x 4k, prefill 4k tokens",
}
INTERPRETER = KernelTiles(DecodeTiles(32, 4, 1), ExtendTiles(64, 32, 8, 1))

# The most shared memory one program may use (the opt-in limit per block), in bytes.
SHARED_MEMORY_BYTES = {(7, 5): 64 * 1024, (8, 0): 163 * 1024, (8, 6): 99 * 1024,
                       (8, 9): 99 * 1024, (9, 0): 227 * 1024, (12, 0): 99 * 1024}

# Rows of K and V longer than 256 bytes (head dims above 128 in 16 bits, as Gemma's 256, or
# above 64 in fp32) double every tile's registers: at D = 256 on sm_90, 64 x 32 prefill tiles
# spill 168 bytes, 32 x 16 none; fp32 decode tiles of 64 spill, and fp32 32 x 16 prefill tiles
# spill 24 bytes under Triton 3.6 with three stages, none with two (tests/test_kernels.py).
LARGE_ROW_BYTES = 256


def tiles_for_capability(capability: tuple[int, int], head_dim: int = 128,
                         element_size: int = 2) -> KernelTiles:
    """The tiles for a compute capability: its own entry, else the newest one below it (a
    newer minor version of a generation keeps its generation's tiles; an older GPU takes the
    oldest entry), shrunk for K/V rows (head_dim x element_size bytes) over LARGE_ROW_BYTES."""
    known = sorted(TILES)
    below = [cc for cc in known if cc <= tuple(capability)]
    tiles = TILES[below[-1] if below else known[0]]
    if head_dim * element_size > LARGE_ROW_BYTES:
        extend = tiles.extend
        tiles = KernelTiles(
            DecodeTiles(min(tiles.decode.block_n, 32), tiles.decode.num_warps,
                        tiles.decode.num_stages),
            ExtendTiles(min(extend.block_m, 32), min(extend.block_n, 16), extend.num_warps,
                        min(extend.num_stages, 2)))
    return tiles


@functools.cache
def tiles_for(device: torch.device, head_dim: int, dtype: torch.dtype) -> KernelTiles:
    """The tiles for the kernels on a device, for K/V of head_dim values of dtype: by its
    compute capability on CUDA, INTERPRETER elsewhere (Triton's CPU interpreter). Cached: a
    launch must not query the device."""
    if device.type != "cuda":
        return INTERPRETER
    return tiles_for_capability(torch.cuda.get_device_capability(device), head_dim,
                                dtype.itemsize)
