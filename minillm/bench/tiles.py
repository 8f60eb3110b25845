"""Sweep the attention kernels' tile sizes on this GPU and print what each candidate achieves.

minillm.attention.tiles holds one choice per GPU generation, reasoned and checked to compile
without spills, not measured. This measures candidates on the GPU at hand, on the shapes of
`bench kernels` (Llama-3-8B heads, bf16): the prefill (extend) kernel in TFLOP/s over one
prompt, the decode kernel in GB/s over a batch of contexts. The table's own choice is marked,
so a reader with another GPU can see whether its entry is the best one there. CUDA only.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Iterator

import torch

from minillm.attention import tiles as tile_table
from minillm.attention import triton_decode, triton_extend
from minillm.bench import kernels

PREFILL = [tile_table.ExtendTiles(m, n, w, s) for m, n, w, s in itertools.product(
    (64, 128), (32, 64, 128), (4, 8), (2, 3)) if not (m == 128 and n == 128)]
DECODE = [tile_table.DecodeTiles(n, w, s) for n, w, s in itertools.product(
    (32, 64, 128), (4, 8), (2, 3))]


@contextlib.contextmanager
def using(tiles: tile_table.KernelTiles) -> Iterator[None]:
    """Run both kernels with these tiles, whatever the table says, inside the block."""
    saved = triton_extend.tiles_for, triton_decode.tiles_for
    triton_extend.tiles_for = triton_decode.tiles_for = lambda *_: tiles
    try:
        yield
    finally:
        triton_extend.tiles_for, triton_decode.tiles_for = saved


def sweep(args: argparse.Namespace) -> list[tuple[str, str, float, bool]]:
    """(kernel, candidate, measured, is the table's choice) for every candidate that runs."""
    device = torch.device("cuda")
    shape = kernels.LLAMA_3_8B
    chosen = tile_table.tiles_for(device, shape.head_dim, shape.dtype)
    rows = []
    for kind, candidates in (("prefill", PREFILL), ("decode", DECODE)):
        if args.kernel not in (kind, "both"):
            continue
        for cand in candidates:
            tiles = (tile_table.KernelTiles(chosen.decode, cand) if kind == "prefill"
                     else tile_table.KernelTiles(cand, chosen.extend))
            try:
                with using(tiles):
                    figure = (kernels.prefill_figures(shape, args.prefill_tokens, 1.0, device)
                              if kind == "prefill" else
                              kernels.decode_figures(shape, args.batch, args.context, 1.0,
                                                     device))[0]
            except Exception as err:  # a candidate that does not fit the chip: say so, go on
                print(f"{kind:7s} {cand}: failed ({type(err).__name__}: {str(err)[:80]})")
                continue
            is_chosen = cand == (chosen.extend if kind == "prefill" else chosen.decode)
            rows.append((kind, str(cand), figure.value, is_chosen))
            print(f"{kind:7s} {cand}: {figure.value:8.1f} {figure.unit}"
                  f"{'   <- the table' if is_chosen else ''}", flush=True)
            torch.cuda.empty_cache()
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", choices=("prefill", "decode", "both"), default="both")
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("bench tiles measures the kernels on a GPU: no CUDA device here")
        return 1
    print(f"{torch.cuda.get_device_name()}: compute capability "
          f"{torch.cuda.get_device_capability()}")
    rows = sweep(args)
    for kind in ("prefill", "decode"):
        mine = [r for r in rows if r[0] == kind]
        if mine:
            best = max(mine, key=lambda r: r[2])
            table = next((r for r in mine if r[3]), None)
            print(f"best {kind}: {best[1]} {best[2]:.1f}"
                  + (f"; the table's {table[1]} {table[2]:.1f} ({table[2] / best[2]:.2f} of it)"
                     if table else ""))
    return 0
