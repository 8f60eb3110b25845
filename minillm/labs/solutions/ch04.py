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

MODEL_ANSWERS: dict[str, str] = {
    "04.4": """\
**Model answer.** A sequence of *S* tokens holds ceil(*S* / *P*) blocks, so its table has about
*S* / *P* + 1/2 entries and its last block leaves about (*P* - 1) / 2 slots empty: the waste is
about (*P* - 1) / (2 *S*) of the slots held, and the two costs move in opposite directions with
*P*. Section 2's workload (a running request holds *S* = 320 tokens on average) measured on the
shipped model (the counts do not depend on the machine; every run is token-for-token the same):

| *P* | paged waste | table entries per request |
|---|---|---|
| 1 | 0.0% | 320 |
| 4 | 0.5% | 80.5 |
| 16 | 2.3% | 20.5 |
| 64 | 9.1% | 5.5 |
| 256 | 28.6% | 1.8 |

Waste under 4% needs (*P* - 1) / 640 < 0.04, i.e. *P* <= 26: among powers of two, *P* = 16 is
the block size with the shortest tables that keeps it (32 would waste ~4.8%). That is vLLM's
default.

Ten times longer requests (*S* ~ 3,200) divide both costs by ten at a given *P*, so the answer
moves up about tenfold: *P* < 2 * 0.04 * 3200 + 1 = 257. In the simulator (Llama-3-8B on an
H100-SXM, the same closed loop with lengths times ten) *P* = 64 wastes 1.0% with 49 entries,
*P* = 256 just meets it (4.0%, 12.5 entries), *P* = 128 with room to spare (~2%, ~25
entries). What the formula leaves
out and a good answer mentions: on a GPU a block of *P* rows is read in whole memory transactions,
so very small blocks also cost kernel efficiency; prefix caching shares only full blocks, so a
large *P* shares less of a common prefix; and a table of a few entries is already free to copy,
so past ~*P* = 16 the shorter table buys little while the waste keeps growing.

**Rubric (10 points).**
- 3: a plot or table of measured waste against mean table entries for the five block sizes, with
  the waste read from the trace (tokens held / block slots in the tables), not assumed.
- 2: the pick (*P* = 16 for this workload) with the reason: the largest *P* whose waste stays
  under 4%, or the formula (*P* - 1) / (2 *S*) < 0.04.
- 2: the scaling argument for ten times longer requests (both costs fall as 1 / *S*, the
  threshold *P* grows about tenfold) and a simulator run that checks it.
- 2: at least one cost the waste formula does not count (kernel memory transactions, prefix
  sharing at block granularity, per-step table copies) and which way it pushes *P*.
- 1: figures labelled measured (this machine's engine) or modelled (the simulator).
""",
}
