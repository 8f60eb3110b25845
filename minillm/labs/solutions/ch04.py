"""Reference solutions of chapter 04's graded exercises."""

from __future__ import annotations

from collections.abc import Sequence


def slot_of(position: int, block_table: Sequence[int], block_size: int) -> int:
    """04.1: the logical block position // P is looked up in the table; the offset stays."""
    return block_table[position // block_size] * block_size + position % block_size


def kv_waste(token_counts: Sequence[int], block_size: int, reserved_len: int
             ) -> tuple[float, float]:
    """04.2: the fraction of allocated KV slots that hold no token, (paged, contiguous).

    Paged: each sequence holds ceil(n / P) blocks of P slots. Contiguous: each holds reserved_len
    slots. Both pooled over the sequences: empty slots / allocated slots.
    """
    tokens = sum(token_counts)
    paged = sum(-(-n // block_size) * block_size for n in token_counts)
    contiguous = reserved_len * len(token_counts)
    return 1 - tokens / paged, 1 - tokens / contiguous


def grow_table(block_table: list[int], num_tokens: int, block_size: int,
               free_blocks: list[int]) -> bool:
    """04.3: append ceil(num_tokens / P) - len(table) blocks from the front of the free list,
    all or nothing."""
    needed = -(-num_tokens // block_size) - len(block_table)
    if needed > len(free_blocks):
        return False
    for _ in range(max(needed, 0)):
        block_table.append(free_blocks.pop(0))
    return True


SOLUTIONS = {"04.1": slot_of, "04.2": kv_waste, "04.3": grow_table}
