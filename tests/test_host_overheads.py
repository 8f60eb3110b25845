"""Per-step host work that must not grow with the KV pool (minillm.engine, kv_cache, trace).

A GPU-sized pool holds ~10^5 blocks (a 1B model on an H200: ~235k), a chapter's a few thousand.
A step's bookkeeping (scheduler, block manager, trace record) must cost O(scheduled requests),
so a step must never pass over the pool's block lists: counting the cached free blocks once did,
and made a 200k-block pool's steps ~12x slower. These tests count the entries of the pool's
lists that steps visit; what that costs in seconds is `python -m minillm.bench host`'s to
measure, side by side, never a unit test's to assert.
"""

from __future__ import annotations

import re

import pytest

from minillm.bench import host
from minillm.bench.__main__ import main as bench_main
from minillm.bench.host import BIG_POOL, SMALL_POOL, add_requests, make_engine
from minillm.config import TRACE_BLOCKS_MAX_POOL, EngineConfig
from minillm.kv_cache import BlockManager


def test_a_step_visits_no_entry_of_the_pool_whatever_its_size() -> None:
    # Full traces on both (the widgets' setting): the cached free blocks are still counted and
    # copied every step, which must not mean a pass over the whole free list.
    small, big = host.decoding_engine(SMALL_POOL), host.decoding_engine(BIG_POOL)
    assert big.block_manager.num_cached_free_blocks == small.block_manager.num_cached_free_blocks
    assert small.block_manager.num_cached_free_blocks > 0  # there is something to count
    for engine in (small, big):
        host.count_pool_visits(engine)
        for _ in range(20):  # decodes, across a block boundary: blocks are taken from the list
            engine.step()
    assert host.pool_visits(small) == host.pool_visits(big) == 0
    assert small.trace[-1].block_tables and big.trace[-1].block_tables
    assert small.trace[-1].cached_blocks == big.trace[-1].cached_blocks != []


def test_the_count_sees_a_pass_over_the_free_list(monkeypatch: pytest.MonkeyPatch) -> None:
    # The old way of counting the cached free blocks: a scan of the free list, every step.
    monkeypatch.setattr(BlockManager, "cached_free_blocks",
                        lambda self: [b for b in self.free_blocks if self.is_cached(b)])
    engine = host.decoding_engine(SMALL_POOL)
    host.count_pool_visits(engine)
    engine.step()
    free = engine.block_manager.num_free_blocks
    assert host.pool_visits(engine) == free > SMALL_POOL - 100  # every free block, once


def test_bench_host_prints_both_pools_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["host", "--steps", "4", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    for pool in (SMALL_POOL, BIG_POOL):  # each pool's median step, and no entry visited
        assert re.search(rf"^ +{pool:,} +\d+\.\d{{3}} +0$", out, re.MULTILINE), out
    assert re.search(rf"step over {BIG_POOL:,} blocks / over {SMALL_POOL:,}: "
                     r"\d+\.\d\dx median of 2 rounds \(range \d+\.\d\d-\d+\.\d\dx\)", out)


def test_by_default_only_small_pools_copy_block_data_into_the_trace() -> None:
    for num_blocks, full in ((SMALL_POOL, True), (TRACE_BLOCKS_MAX_POOL, True),
                             (TRACE_BLOCKS_MAX_POOL + 1, False)):
        engine = make_engine(num_blocks)
        add_requests(engine, 2, max_tokens=3)
        while engine.has_unfinished_requests():
            engine.step()
        assert bool(engine.trace[0].block_tables) == full
        assert bool(engine.trace[-1].cached_blocks) == full
        # The schedule itself is always recorded.
        assert [e.request_id for e in engine.trace[0].scheduled] == ["0", "1"]


@pytest.mark.parametrize("limit", [1, 4])
def test_max_trace_steps_bounds_the_trace_and_keeps_the_latest_steps(limit: int) -> None:
    engine = make_engine(SMALL_POOL, max_trace_steps=limit)
    add_requests(engine, 2, max_tokens=25)
    while engine.has_unfinished_requests():
        engine.step()
        assert limit <= len(engine.trace) < 2 * limit or engine.num_steps < limit
    steps = [r.step for r in engine.trace]
    assert steps == list(range(engine.num_steps - len(steps), engine.num_steps))
    assert engine.num_steps == 25  # one prefill step and 24 decodes, all counted


def test_max_trace_steps_is_validated() -> None:
    with pytest.raises(ValueError, match="max_trace_steps"):
        EngineConfig(max_trace_steps=0)
    with pytest.raises(ValueError, match="trace_block_tables"):
        EngineConfig(trace_block_tables=1)  # type: ignore[arg-type]
