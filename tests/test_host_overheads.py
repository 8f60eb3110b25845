"""Per-step host work that must not grow with the KV pool (minillm.engine, kv_cache, trace).

A GPU-sized pool holds ~10^5 blocks (a 1B model on an H200: ~235k), a chapter's a few thousand.
A step's bookkeeping (scheduler, block manager, trace record) must cost O(scheduled requests),
so a step over a 200k-block pool costs what it costs over a 2k-block pool. The two engines'
steps are timed interleaved, one after the other, so that a busy neighbour slows both alike,
and compared as a ratio of medians with a generous margin: scanning the pool once a step (what
counting the cached free blocks used to do) makes the big pool's steps several times slower.
"""

from __future__ import annotations

import statistics
import time

import pytest

from minillm.config import TRACE_BLOCKS_MAX_POOL, EngineConfig
from minillm.engine import Engine
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams

# Small enough that a step is mostly host work, which is what this file measures.
SHAPE = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=8)
SMALL_POOL, BIG_POOL = 2_000, 200_000
PREFIX = list(range(1, 40))  # shared by every request: two full blocks for the prefix cache


def make_engine(num_blocks: int, **config: object) -> Engine:
    settings = dict(num_kv_blocks=num_blocks, max_model_len=512, attention_backend="torch",
                    enable_prefix_caching=True, enable_cuda_graphs=False)
    settings.update(config)
    return Engine(LlamaForCausalLM.random(SHAPE), None, EngineConfig(**settings))  # type: ignore


def add_requests(engine: Engine, num: int, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(num):
        engine.add_request(PREFIX + [i % 60 + 1] * (i + 1), params)


def timed_step(engine: Engine) -> float:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


def test_a_step_costs_the_same_with_a_200k_block_pool_as_with_a_2k_block_pool() -> None:
    # Full traces on both (the widgets' setting): the cached free blocks are still counted and
    # copied every step, which must not mean a pass over the whole free list.
    small = make_engine(SMALL_POOL, trace_block_tables=True)
    big = make_engine(BIG_POOL, trace_block_tables=True)
    for engine in (small, big):
        add_requests(engine, 4, max_tokens=8)  # finish first: their blocks stay cached, free
        while engine.has_unfinished_requests():
            engine.step()
        add_requests(engine, 8, max_tokens=200)
        for _ in range(3):  # prefill and the first decodes
            engine.step()
    assert big.block_manager.num_cached_free_blocks == small.block_manager.num_cached_free_blocks
    times: dict[int, list[float]] = {SMALL_POOL: [], BIG_POOL: []}
    for _ in range(60):
        for engine in (small, big):
            times[engine.config.num_kv_blocks].append(timed_step(engine))  # type: ignore
    small_s, big_s = (statistics.median(times[n]) for n in (SMALL_POOL, BIG_POOL))
    ratio = big_s / small_s
    print(f"median step: {small_s * 1e3:.2f} ms with {SMALL_POOL:,} blocks, "
          f"{big_s * 1e3:.2f} ms with {BIG_POOL:,}: ratio {ratio:.2f}")
    assert ratio < 1.6, f"a {BIG_POOL:,}-block pool's step costs {ratio:.2f}x a {SMALL_POOL:,}'s"
    assert small.trace[-1].block_tables and big.trace[-1].block_tables


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
