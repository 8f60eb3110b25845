"""The attention kernels' tiles (minillm.attention.tiles) and the work each program does.

The table picks tiles per GPU generation (tests/test_kernels.py compiles each for its chip and
checks it fits). Here, under Triton's CPU interpreter, the kernels' per-tile softmax step is
counted per program: in prefill/extend only the tiles that cross the causal diagonal pay for
the mask, and the heaviest query tiles go to the first programs.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
from collections import Counter

import pytest
import torch

from minillm.attention import tiles, torch_ref, triton_extend

pytestmark = pytest.mark.kernels

K, D, P = 1, 16, 16  # KV heads, head dim, block size: small, the interpreter runs every program


def test_each_generation_gets_its_own_tiles_and_newer_ones_their_generations() -> None:
    for capability, entry in tiles.TILES.items():
        assert tiles.tiles_for_capability(capability) == entry
        assert capability in tiles.SHARED_MEMORY_BYTES
    assert tiles.tiles_for_capability((10, 0)) == tiles.TILES[(9, 0)]  # B200: Hopper's tiles
    assert tiles.tiles_for_capability((12, 1)) == tiles.TILES[(12, 0)]
    assert tiles.tiles_for_capability((7, 0)) == tiles.TILES[(7, 5)]  # older: the oldest entry
    assert tiles.tiles_for(torch.device("cpu"), 128, torch.bfloat16) == tiles.INTERPRETER
    # The ~100 KB parts share one entry, so compiling it for sm_86 checks sm_89 and sm_120.
    assert tiles.TILES[(8, 6)] is tiles.TILES[(8, 9)] is tiles.TILES[(12, 0)]


def test_rows_over_256_bytes_get_smaller_tiles() -> None:
    for capability in tiles.TILES:
        usual = tiles.tiles_for_capability(capability, 128, element_size=2)
        big = tiles.tiles_for_capability(capability, 256, element_size=2)
        assert big == tiles.tiles_for_capability(capability, 128, element_size=4)  # fp32
        assert big.extend.block_m <= usual.extend.block_m
        assert big.extend.block_n <= 16 and big.decode.block_n <= 32


def paged(seq_lens: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A cache (2, N, P, K, D) holding each context in consecutive blocks, its block tables
    (B, max_blocks) and seq_lens (B,)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-s // P) for s in seq_lens]
    cache = torch.randn(2, sum(blocks), P, K, D, generator=gen)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    for b, n in enumerate(blocks):
        tables[b, :n] = torch.arange(sum(blocks[:b]), sum(blocks[:b + 1]))
    return cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


def count_softmax_steps(monkeypatch: pytest.MonkeyPatch, module: object) -> Counter:
    """Counts calls of online_softmax_step in module's kernel by (program id, masked)."""
    from triton.runtime import interpreter

    steps: Counter = Counter()
    step = module.online_softmax_step

    def counted(q, k, v, visible, m, l, acc, qk_scale, MASKED, DOT_PRECISION):  # noqa: E741
        steps[interpreter.interpreter_builder.grid_idx, bool(MASKED)] += 1
        return step(q, k, v, visible, m, l, acc, qk_scale, MASKED, DOT_PRECISION)

    monkeypatch.setattr(module, "online_softmax_step", counted)
    return steps


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts programs in the CPU interpreter")
def test_extend_masks_only_diagonal_tiles_and_starts_with_the_heaviest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(100, 200), (0, 70), (5, 3)]  # (cached prefix, new tokens) per request
    cache, tables, seq_lens = paged([prefix + n for prefix, n in rows])
    starts = torch.tensor([0, 200, 270, 273], dtype=torch.int32)
    q = torch.randn(273, 2 * K, D, generator=torch.Generator().manual_seed(1))
    steps = count_softmax_steps(monkeypatch, triton_extend)
    out = triton_extend.extend_attention(q, cache, starts, seq_lens, tables, max_query_len=200)
    ref = torch.cat([torch_ref.extend_attention(q[starts[b]:starts[b + 1]], cache[0], cache[1],
                                                 tables[b], int(seq_lens[b])) for b in range(3)])
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)

    extend = tiles.INTERPRETER.extend
    num_query_tiles = -(-200 // extend.block_m)
    diagonal = extend.block_m // extend.block_n + 1  # tiles a block_m-row diagonal can cross
    for head in range(2):
        for b, (prefix, n) in enumerate(rows):
            work = [steps[(head, b, z), False] + steps[(head, b, z), True]
                    for z in range(num_query_tiles)]
            masked = [steps[(head, b, z), True] for z in range(num_query_tiles)]
            assert all(0 < m <= diagonal for m, w in zip(masked, work) if w), (b, masked)
            assert sum(masked) < sum(work) or prefix + n <= extend.block_n
            # A GPU starts programs in order of their linear id, axis 2 slowest: z = 0 first.
            assert work == sorted(work, reverse=True), (b, work)
            assert work[0] == -(-(prefix + n) // extend.block_n)  # the last tile, all the keys
