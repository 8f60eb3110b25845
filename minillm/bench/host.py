"""A step's host work over a GPU-sized KV pool against a chapter-sized one, side by side.

A GPU-sized pool holds ~10^5 blocks (a 1B model on an H200: ~235k), a chapter's a few thousand.
A step's bookkeeping (scheduler, block manager, trace record) must cost O(scheduled requests),
so a step over a 200k-block pool should cost what it costs over a 2k-block one: a pass over the
free list every step (what counting the cached free blocks once did) made the big pool's steps
about 12x slower.

Two engines serve the same requests with a model small enough that a step is mostly host work.
Their steps are timed interleaved, one of each in turn, so that a busy neighbour slows both
alike; the report is each engine's median step and their ratio per round, as a median with its
spread. Next to the times it prints what does not depend on the machine: how many entries of
the pool's block lists the steps visited, which tests/test_host_overheads.py asserts is the
same for both pools.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import OrderedDict
from collections.abc import Iterator

from minillm.bench.engine import Ratio
from minillm.calc import machine
from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams

# Small enough that a step is mostly host work, which is what this benchmark measures.
SHAPE = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=8)
SMALL_POOL, BIG_POOL = 2_000, 200_000
PREFIX = list(range(1, 40))  # shared by every request: two full blocks for the prefix cache


class CountedFreeList(OrderedDict):
    """The block manager's free list, counting the entries any pass over it visits (lazily:
    taking the first free block visits one). Its O(1) operations (pop, popitem, move_to_end,
    len) visit none."""

    visited = 0

    def __iter__(self) -> Iterator[int]:
        for block_id in super().__iter__():
            self.visited += 1
            yield block_id

    def __reversed__(self) -> Iterator[int]:
        for block_id in super().__reversed__():
            self.visited += 1
            yield block_id

    def keys(self):  # type: ignore[override]
        return list(iter(self))

    def items(self):  # type: ignore[override]
        return [(block_id, None) for block_id in self]

    def values(self):  # type: ignore[override]
        return [None for _ in self]


class CountedBlocks(list):
    """The block manager's list of every block, counting the entries a pass or a slice visits;
    indexing one block visits none."""

    visited = 0

    def __iter__(self):
        for block in super().__iter__():
            self.visited += 1
            yield block

    def __getitem__(self, index):
        if isinstance(index, slice):
            self.visited += len(range(*index.indices(len(self))))
        return super().__getitem__(index)


def count_pool_visits(engine: Engine) -> None:
    """Swap engine's free list and block list for counting ones (same contents, same order)."""
    bm = engine.block_manager
    bm.free_blocks = CountedFreeList(bm.free_blocks)
    bm.blocks = CountedBlocks(bm.blocks)


def pool_visits(engine: Engine) -> int:
    """Entries of the pool's block lists visited since count_pool_visits(engine)."""
    bm = engine.block_manager
    return bm.free_blocks.visited + bm.blocks.visited


def make_engine(num_blocks: int, **config: object) -> Engine:
    settings = dict(num_kv_blocks=num_blocks, max_model_len=512, attention_backend="torch",
                    enable_prefix_caching=True, enable_cuda_graphs=False)
    settings.update(config)
    return Engine(LlamaForCausalLM.random(SHAPE), None, EngineConfig(**settings))  # type: ignore


def add_requests(engine: Engine, num: int, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(num):
        engine.add_request(PREFIX + [i % 60 + 1] * (i + 1), params)


def decoding_engine(num_blocks: int, max_tokens: int = 200) -> Engine:
    """An engine with full traces (the widgets' setting: the cached free blocks are counted and
    copied every step) whose pool holds the cached prefix of four finished requests, and eight
    requests past their prefill, decoding."""
    engine = make_engine(num_blocks, trace_block_tables=True)
    add_requests(engine, 4, max_tokens=8)  # finish first: their blocks stay cached, free
    while engine.has_unfinished_requests():
        engine.step()
    add_requests(engine, 8, max_tokens=max_tokens)
    for _ in range(3):  # prefill and the first decodes
        engine.step()
    return engine


def timed_step(engine: Engine) -> float:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=3)


def main(args: argparse.Namespace) -> dict[str, object]:
    """Print and return the median step of each pool, the big/small ratio per round and the
    pool entries each engine's steps visited."""
    print(machine.describe())
    pools = (SMALL_POOL, BIG_POOL)
    print(f"{args.rounds} rounds of {args.steps} decode steps of 8 requests on each engine, "
          f"interleaved step by step; pools of {SMALL_POOL:,} and {BIG_POOL:,} blocks")
    medians: dict[int, list[float]] = {n: [] for n in pools}
    visits = dict.fromkeys(pools, 0)
    for _ in range(args.rounds):
        engines = {n: decoding_engine(n, max_tokens=args.steps + 8) for n in pools}
        for engine in engines.values():
            count_pool_visits(engine)
        times: dict[int, list[float]] = {n: [] for n in pools}
        for _ in range(args.steps):
            for n, engine in engines.items():
                times[n].append(timed_step(engine))
        for n in pools:
            medians[n].append(statistics.median(times[n]))
            visits[n] += pool_visits(engines[n])
    ratio = Ratio(tuple(big / small for small, big in zip(medians[SMALL_POOL],
                                                          medians[BIG_POOL])))
    print(f"{'pool (blocks)':>14}{'median step ms':>16}{'pool entries visited':>22}")
    for n in pools:
        print(f"{n:>14,}{statistics.median(medians[n]) * 1e3:>16.3f}{visits[n]:>22,}")
    print(f"step over {BIG_POOL:,} blocks / over {SMALL_POOL:,}: {ratio} (measured; 1.00x "
          f"means the pool's size costs nothing per step)")
    return {"ratio": ratio, "visits": visits}
