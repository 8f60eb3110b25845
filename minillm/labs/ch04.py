"""Graded exercises of chapter 04 (paged attention).

04.1 is checked against the engine's own batch building: a real BlockManager hands out blocks
(with a freed request's blocks reused, so tables are not in order) and build_batch computes the
slot of every token; the reader's function must give the same slots. 04.2 is checked against
the block tables of a run of the real scheduler and BlockManager (in the simulator). 04.3's
allocator is plugged into a real BlockManager that serves requests with the shipped model.
"""

from __future__ import annotations

import math
import random
from typing import Any

from minillm.kv_cache import BlockManager
from minillm.labs.exercise import Exercise, close, expect_callable


def _slot_hint(got: Any, position: int, table: list[int], P: int) -> str:
    block, offset = table[position // P], position % P
    if got == position:
        return (" (that is the position itself: the sequence's blocks are scattered over the "
                "pool, so look up its logical block position // block_size in the block table)")
    if got == block + offset:
        return (" (a block holds block_size slots: multiply the physical block id by "
                "block_size before adding the offset)")
    if got == block * P:
        return " (add the offset inside the block, position % block_size)"
    swapped = position % P  # the offset used as the logical block
    if swapped < len(table) and got == table[swapped] * P + position // P:
        return (" (the logical block is position // block_size and the offset is "
                "position % block_size: you swapped them)")
    if got == (position // P) * P + offset and position // P != block:
        return " (use the physical block id from the table, not the logical block number)"
    if isinstance(got, int) and got - (block * P + offset) in (1, -1):
        return " (off by one: positions, blocks and slots all count from 0)"
    return ""


def _engine_slots() -> tuple[list[tuple[str, int, list[int], int]], int]:
    """(request id, position, its block table, slot the engine computes) for every token of a
    real step, from a real BlockManager and build_batch; and the block size."""
    import torch

    from minillm.batch import build_batch
    from minillm.request import Request, ScheduledRequest
    from minillm.sampling import SamplingParams

    P = 4
    manager = BlockManager(num_blocks=8, block_size=P)
    a, b, c = (Request(rid, [1] * n, SamplingParams(), arrival_time=0.0)
               for rid, n in (("A", 20), ("B", 9), ("C", 5)))
    manager.allocate(a, 6)   # A: blocks 0, 1
    manager.allocate(b, 9)   # B: 2, 3, 4
    manager.allocate(c, 5)   # C: 5, 6
    manager.free(b)          # B leaves: 2, 3, 4 return to the free list (after 7)
    manager.allocate(a, 20)  # A grows to 5 blocks: 0, 1, 7, 4, 3
    scheduled = [ScheduledRequest(a, 14, 6, "prefill"), ScheduledRequest(c, 5, 0, "prefill")]
    batch = build_batch(scheduled, P, torch.device("cpu"))
    slots = batch.attn.slot_mapping.tolist()
    rows = [(s.request.request_id, p, list(s.request.block_table))
            for s in scheduled for p in range(s.num_computed_tokens,
                                              s.num_computed_tokens + s.num_tokens)]
    return [(rid, p, table, slot) for (rid, p, table), slot in zip(rows, slots)], P


def grade_slot_of(slot_of: Any) -> str:
    expect_callable(slot_of, "slot_of(position, block_table, block_size) -> slot index")
    table = [7, 2, 9, 5, 11]
    cases = [(0, table, 4), (3, table, 4), (4, table, 4), (9, table, 4), (19, table, 4),
             (17, [3, 0, 12], 16), (40, [3, 0, 12], 16), (5, [6], 8)]
    for position, table, P in cases:
        got = slot_of(position, list(table), P)
        assert got is not None, "slot_of returned None"
        assert isinstance(got, int) and not isinstance(got, bool), (
            f"return the slot as an int, got {got!r}")
        want = table[position // P] * P + position % P
        assert got == want, (
            f"position {position} with block table {table} and block_size {P} sits in slot "
            f"{want}, you returned {got!r}{_slot_hint(got, position, table, P)}")
    rows, P = _engine_slots()
    for rid, position, table, want in rows:
        got = slot_of(position, list(table), P)
        assert got == want, (
            f"in a real engine step (block_size {P}), build_batch writes token {position} of "
            f"request {rid} (block table {table}) to slot {want}; you returned {got!r}"
            f"{_slot_hint(got, position, table, P)}")
    return (f"your slots match the engine's slot_mapping for all {len(rows)} tokens of a real "
            "step: slot = block_table[p // P] * P + p % P")


def _waste_hint(got: tuple[float, float], counts: list[int], P: int, reserved: int) -> str:
    tokens = sum(counts)
    ceil_slots = sum(-(-n // P) * P for n in counts)
    floor_slots = sum(n // P * P for n in counts)
    plus_one_slots = sum((n // P + 1) * P for n in counts)
    paged, contiguous = 1 - tokens / ceil_slots, 1 - tokens / (reserved * len(counts))
    mean_paged = sum(1 - n / (-(-n // P) * P) for n in counts) / len(counts)
    g_paged, g_contig = got
    if close(g_paged, contiguous) and close(g_contig, paged) and not close(paged, contiguous):
        return " (return (paged, contiguous), in that order)"
    if close(g_paged, 1 - paged) or close(g_contig, 1 - contiguous):
        return " (return the empty fraction, 1 - tokens / slots, not the used fraction)"
    if floor_slots and close(g_paged, 1 - tokens / floor_slots):
        return (" (a partly filled block is still a whole block: a sequence of n tokens holds "
                "ceil(n / block_size) blocks, not n // block_size)")
    if close(g_paged, 1 - tokens / plus_one_slots):
        return (" (a sequence of exactly k * block_size tokens fills k blocks: use ceil(n / P), "
                "not n // P + 1)")
    if close(g_paged, mean_paged) and not close(mean_paged, paged):
        return (" (pool the counts: empty slots over allocated slots of all sequences, not the "
                "mean of each sequence's fraction; memory is what is wasted)")
    if close(g_paged, (ceil_slots - tokens) / tokens) or close(
            g_contig, (reserved * len(counts) - tokens) / tokens):
        return " (waste is a fraction of the slots allocated, not of the tokens stored)"
    return ""


def _simulated_steps() -> tuple[list[tuple[list[int], float]], int, int]:
    """(token counts of a step's requests, paged waste from its real block tables) for every
    step of a small run of the real scheduler and BlockManager; block size; max_model_len."""
    from minillm import simulate
    from minillm.workloads import streams as wl

    P, max_len = 8, 256
    work = wl.poisson(12, 50.0, prompt_len=(5, 90), output_len=(3, 40), seed=3)
    result = simulate("llama-3-8b", "H100-SXM", work, block_size=P, max_model_len=max_len,
                      max_num_seqs=6)
    steps = []
    for rec in result.trace:
        counts = [e.num_computed_tokens + e.num_tokens for e in rec.scheduled]
        slots = P * sum(len(t) for t in rec.block_tables.values())
        steps.append((counts, 1 - sum(counts) / slots))
    return steps, P, max_len


def grade_kv_waste(kv_waste: Any) -> str:
    expect_callable(kv_waste,
                    "kv_waste(token_counts, block_size, reserved_len) -> (paged, contiguous)")
    cases = [([17, 100, 5], 16, 2048), ([16, 32], 16, 64), ([1], 16, 16), ([1, 31, 64], 8, 128),
             ([300, 45, 1000, 2], 16, 1024), ([7], 1, 7)]
    for counts, P, reserved in cases:
        got = kv_waste(list(counts), P, reserved)
        assert got is not None, "kv_waste returned None"
        assert isinstance(got, tuple) and len(got) == 2, (
            f"return a tuple (paged_waste, contiguous_waste), got {got!r}")
        assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in got), (
            f"return two fractions (floats), got {got!r}")
        tokens = sum(counts)
        want = (1 - tokens / sum(-(-n // P) * P for n in counts),
                1 - tokens / (reserved * len(counts)))
        assert close(got[0], want[0], 1e-9) and close(got[1], want[1], 1e-9), (
            f"sequences of {counts} tokens, block_size {P}, reserving {reserved} tokens each: "
            f"waste is (paged {want[0]:.6g}, contiguous {want[1]:.6g}), you returned "
            f"({got[0]:.6g}, {got[1]:.6g}){_waste_hint(got, counts, P, reserved)}")
    steps, P, max_len = _simulated_steps()
    for i, (counts, want) in enumerate(steps):
        got = kv_waste(list(counts), P, max_len)
        assert abs(got[0] - want) < 1e-9, (
            f"step {i} of a run of the real scheduler and BlockManager (block_size {P}): "
            f"requests held {counts} tokens in blocks whose empty fraction is {want:.6g}; "
            f"your paged waste is {got[0]:.6g}{_waste_hint(got, counts, P, max_len)}")
    return (f"your paged waste matches the real BlockManager's tables at all {len(steps)} steps "
            "of a run: at most block_size - 1 empty slots per sequence")


def _grow_case(grow_table: Any, table: list[int], num_tokens: int, P: int, free: list[int]
               ) -> str:
    """Run one case; return the reader-facing error, or '' when right."""
    want_blocks = -(-num_tokens // P)
    needed = want_blocks - len(table)
    fits = needed <= len(free)
    want_table = table + free[:max(needed, 0)] if fits else list(table)
    got_table, got_free = list(table), list(free)
    got = grow_table(got_table, num_tokens, P, got_free)
    case = (f"block_table {table}, num_tokens {num_tokens}, block_size {P}, free_blocks {free}: "
            f"expected {fits} with block_table {want_table}")
    if got is None:
        return f"{case}; you returned None (return True, or False when the pool is short)"
    if got is not True and got is not False:
        return f"{case}; return True or False, you returned {got!r}"
    if got != fits:
        return f"{case}; you returned {got}" + (
            " (the pool has enough free blocks for the missing ones only: count the blocks "
            "the table still needs, not all of them)" if fits else
            " (not enough free blocks: return False)")
    if not fits:
        if got_table != table or got_free != free:
            return (f"{case}; you returned False but changed block_table to {got_table} or "
                    f"free_blocks to {got_free} (all or nothing: when the pool is short, change "
                    "nothing, so the scheduler can preempt a request and retry)")
        return ""
    if got_table[:len(table)] != table:
        return (f"{case}; you changed the blocks the table already held, got {got_table} "
                "(they hold the K/V already computed: only append)")
    if len(got_table) < len(want_table):
        return (f"{case}; you returned a table of {len(got_table)} blocks "
                f"(a partly filled block is still a block: ceil({num_tokens} / {P}) = "
                f"{want_blocks})")
    if len(got_table) > len(want_table):
        hint = (" (the table already holds blocks: add only the missing ones)" if
                len(got_table) == len(table) + want_blocks else
                f" (a table of k * block_size tokens needs k blocks: ceil({num_tokens} / {P}) = "
                f"{want_blocks})")
        return f"{case}; you returned a table of {len(got_table)} blocks{hint}"
    taken = got_table[len(table):]
    if any(b not in free for b in taken):
        return f"{case}; you added blocks {taken}, which are not all free"
    if any(b in got_free for b in taken):
        return (f"{case}; blocks {taken} are in the table but still in free_blocks {got_free} "
                "(remove the blocks you take: otherwise the next request gets the same block "
                "and overwrites this one's K/V)")
    return ""


def plugged_block_manager(grow_table: Any, num_blocks: int, block_size: int) -> Any:
    """A real BlockManager (no prefix cache) whose allocate calls the reader's grow_table.

    Swap it into an LLM: llm.engine.block_manager = llm.engine.scheduler.block_manager = it.
    It checks every call: blocks only appended, taken from the free list, enough of them.
    """

    class ReaderBlockManager(BlockManager):
        def allocate(self, req: Any, num_tokens: int, match: Any = None) -> bool:
            free, table = list(self.free_blocks), list(req.block_table)
            ok = grow_table(table, num_tokens, self.block_size, free)
            taken = table[len(req.block_table):]
            assert ok in (True, False) and table[:len(req.block_table)] == req.block_table, (
                f"in the engine, for request {req.request_id}: grow_table must only append "
                "blocks and return True or False")
            assert all(b in self.free_blocks for b in taken) and len(set(taken)) == len(taken), (
                f"in the engine, your allocator gave request {req.request_id} blocks {taken}, "
                "some of which are not free: two requests would write into one block")
            assert ok or not taken, "in the engine, grow_table returned False but added blocks"
            assert not ok or len(table) * self.block_size >= num_tokens, (
                f"in the engine, request {req.request_id} needs {num_tokens} tokens of room "
                f"but got {len(table)} blocks of {self.block_size}")
            for b in taken:
                del self.free_blocks[b]
                self.blocks[b].ref_count = 1
            req.block_table = table
            return bool(ok)

    return ReaderBlockManager(num_blocks, block_size)


def _serve_with(llm: Any, manager: Any, prompts: list[list[int]], params: Any
                ) -> tuple[list[list[int]], int]:
    """Generate on llm with its block manager swapped for manager: token ids, preemptions."""
    engine = llm.engine
    engine.block_manager = engine.scheduler.block_manager = manager
    before = engine.scheduler.num_preemptions
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.token_ids for o in outs], engine.scheduler.num_preemptions - before


def grade_grow_table(grow_table: Any) -> str:
    expect_callable(grow_table,
                    "grow_table(block_table, num_tokens, block_size, free_blocks) -> bool")
    cases = [([], 1, 16, [5, 3, 9]), ([], 32, 16, [1, 2, 3]), ([5], 16, 16, [3, 9]),
             ([5], 17, 16, [3, 9]), ([4, 1], 40, 16, [6]), ([5, 3], 100, 16, [9]),
             ([4], 9, 4, [0, 7, 2]), ([], 3, 1, [8, 6]), ([2, 0], 3, 1, [7, 1, 5, 4])]
    for table, num_tokens, P, free in cases:
        error = _grow_case(grow_table, table, num_tokens, P, free)
        assert not error, error
    from minillm import LLM, SamplingParams

    P, num_blocks = 8, 24
    llm = LLM(block_size=P, num_kv_blocks=num_blocks, max_num_seqs=6, device="cpu")
    rng = random.Random(4)
    prompts = [[rng.randrange(1, 4000) for _ in range(rng.randint(5, 40))] for _ in range(8)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want, _ = _serve_with(llm, BlockManager(num_blocks, P), prompts, params)
    got, preempted = _serve_with(llm, plugged_block_manager(grow_table, num_blocks, P),
                                 prompts, params)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (
            f"with your allocator in the engine, request {i} generated {g[:8]}... instead of "
            f"{w[:8]}...: its K/V were overwritten or read from the wrong blocks")
    return (f"the shipped model served {len(prompts)} requests through a {num_blocks}-block pool "
            f"with your allocator ({preempted} preemptions when it ran dry), token for token as "
            "with the engine's own")


EXERCISES = [
    Exercise("04.1", "The slot of a token through its block table",
             "Write slot_of(position, block_table, block_size) -> the physical slot (block * "
             "block_size + offset) where token `position` of a sequence keeps its K and V.",
             grade_slot_of),
    Exercise("04.2", "KV waste: paged vs contiguous",
             "Write kv_waste(token_counts, block_size, reserved_len) -> (paged, contiguous): "
             "the fraction of allocated KV slots that hold no token under each allocator.",
             grade_kv_waste),
    Exercise("04.3", "An on-demand block allocator in the engine",
             "Write grow_table(block_table, num_tokens, block_size, free_blocks) -> bool: grow "
             "the table in place with blocks taken from free_blocks until it holds num_tokens; "
             "False, changing nothing, when the pool is short.", grade_grow_table),
]
