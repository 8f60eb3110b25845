"""Prefix caching end to end on the shipped tiny model: same outputs, hand-counted hits.

Caching only skips the prefill of K/V that were already computed, so the outputs with it off,
with the hash chain and with the radix tree must be the same token for token, greedy or seeded,
even when a small pool preempts requests and evicts cached blocks. The hit counters are checked
against values counted by hand on constructed workloads, in blocks and in tokens.
"""

from __future__ import annotations

import random

import pytest

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.simulator import simulate
from minillm.workload import RequestSpec

pytestmark = pytest.mark.ch08  # Prefix caching

DESIGNS = ("hash", "radix")


def make_llm(design: str | None, **kwargs: object) -> LLM:
    caching = {} if design is None else {"enable_prefix_caching": True, "prefix_caching": design}
    return LLM(device="cpu", max_model_len=128, **caching, **kwargs)  # type: ignore[arg-type]


def assert_all_released(bm: BlockManager) -> None:
    """After a run: every block free or cached free, and nothing holds any count."""
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)
    if bm.radix is not None:
        assert bm.radix.holders == {}
        assert all(node.ref_count == 0 for node in bm.radix.nodes())
        assert sorted(bm.cached_free_blocks()) == sorted(bm.radix.block_node)


def prefix_sharing_prompts(seed: int = 3) -> list[list[int]]:
    """Ten prompts: three shared openings of 13 to 22 tokens, each with its own tail."""
    rng = random.Random(seed)
    openings = [[rng.randrange(1, 2000) for _ in range(n)] for n in (13, 17, 22)]
    return [openings[i % 3] + [rng.randrange(1, 2000) for _ in range(rng.randint(1, 9))]
            for i in range(10)]


# ---- outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("num_kv_blocks", [120, 22])  # roomy, and small: preempts and evicts
def test_outputs_are_identical_with_caching_off_hash_and_radix(num_kv_blocks: int) -> None:
    prompts = prefix_sharing_prompts()
    greedy = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    seeded = [SamplingParams(max_tokens=14, temperature=0.9, top_k=40, seed=100 + i,
                             ignore_eos=True) for i in range(len(prompts))]
    results, stats = {}, {}
    for design in (None, *DESIGNS):
        llm = make_llm(design, block_size=4, num_kv_blocks=num_kv_blocks, max_num_seqs=4,
                       max_num_batched_tokens=64)
        # The second call starts with the first call's blocks cached.
        results[design] = [[o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
                           for params in (greedy, seeded)]
        stats[design] = llm.stats()
        assert_all_released(llm.engine.block_manager)
    assert results["hash"] == results[None] and results["radix"] == results[None]
    for design in DESIGNS:
        assert stats[design]["prefix_cache_hits"] > 0
        if num_kv_blocks == 22:
            assert stats[design]["num_preemptions"] > 0
            assert stats[design]["prefix_cache_evictions"] > 0


# ---- hand-counted hits ------------------------------------------------------------------------


@pytest.mark.parametrize("design", DESIGNS)
def test_a_shared_prefix_of_k_full_blocks_hits_k_blocks_per_follow_up(design: str) -> None:
    P, k = 4, 3
    shared = list(range(500, 500 + k * P))
    tails = [[7], [8, 9, 10], [11, 12, 13, 14, 15], [16, 17]]  # every tail ends past the prefix
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm = make_llm(design, block_size=P, num_kv_blocks=64)
    llm.generate(shared + [6, 6, 6, 6, 6], params, use_tqdm=False)  # computes the prefix
    base = llm.stats()
    prompts = [shared + tail for tail in tails]
    llm.generate(prompts, params, use_tqdm=False)
    stats = {key: llm.stats()[key] - base[key] for key in base}
    assert stats["prefix_cache_hits"] == k * len(tails)
    assert stats["prefix_cache_hit_tokens"] == k * P * len(tails)
    assert stats["prefix_cache_query_tokens"] == sum(len(p) - 1 for p in prompts)
    assert stats["prefix_cache_queries"] == sum((len(p) - 1) // P for p in prompts)
    assert stats["prefix_cache_evictions"] == 0


@pytest.mark.parametrize("design", DESIGNS)
def test_a_follow_up_turn_reuses_the_answer_of_the_last_one(design: str) -> None:
    # Turn 1: 12 prompt tokens + 14 answer tokens. The last answer token is sampled but never
    # computed, so 25 tokens have K/V: 6 full blocks of 4 = 24 tokens, 12 of them the answer's.
    P = 4
    llm = make_llm(design, block_size=P, num_kv_blocks=64)
    first = list(range(300, 312))
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    answer = llm.generate(first, params, use_tqdm=False)[0].token_ids
    base = llm.stats()
    second = first + answer + [5, 6, 7, 8, 9]  # 31 tokens: up to 7 blocks could match
    llm.generate(second, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    hit_tokens = llm.stats()["prefix_cache_hit_tokens"] - base["prefix_cache_hit_tokens"]
    assert hit_tokens == 24  # the whole prompt (12) and the answer's first 12 tokens
    assert llm.stats()["prefix_cache_query_tokens"] - base["prefix_cache_query_tokens"] == 30


# ---- the trace and the simulator --------------------------------------------------------------


@pytest.mark.parametrize("design", DESIGNS)
def test_each_step_records_the_cache_and_its_evictions(design: str) -> None:
    llm = make_llm(design, block_size=4, num_kv_blocks=22, max_num_seqs=4)
    llm.generate(prefix_sharing_prompts(), SamplingParams(max_tokens=10, ignore_eos=True),
                 use_tqdm=False)
    bm = llm.engine.block_manager
    snapshots = [record.prefix_cache for record in llm.trace]
    assert all(s is not None and s.design == design for s in snapshots)
    evicted = [b for s in snapshots if s is not None for b in s.evicted]
    assert len(evicted) == bm.prefix_cache_evictions > 0
    for record, snap in zip(llm.trace, snapshots):
        assert snap is not None
        ids = {node.node_id for node in snap.nodes}
        seen: set[int] = set()
        for node in snap.nodes:  # parents first, and each node's blocks cached
            assert node.parent is None or node.parent in seen
            seen.add(node.node_id)
            assert node.num_tokens == 4 * len(node.block_ids)
        for request_id, held in snap.holders.items():
            assert set(held) <= ids
            table = record.block_tables.get(request_id)
            if table is not None and design == "radix":  # a path from the root: its first blocks
                blocks = [b for node in snap.nodes if node.node_id in held for b in node.block_ids]
                assert sorted(blocks) == sorted(table[:len(blocks)])


def test_without_caching_steps_record_no_cache() -> None:
    llm = make_llm(None, block_size=4, num_kv_blocks=16)
    llm.generate([1, 2, 3, 4, 5], SamplingParams(max_tokens=2), use_tqdm=False)
    assert all(record.prefix_cache is None for record in llm.trace)
    assert llm.stats()["prefix_cache_query_tokens"] == 0


@pytest.mark.parametrize("design", DESIGNS)
def test_the_simulator_reports_the_same_counters_and_snapshots(design: str) -> None:
    # Requests a second apart run alone: each follow-up finds the 64 shared tokens (4 blocks).
    specs = [RequestSpec(arrival_time=1.0 * i, prompt_len=70, output_len=8, prefix_id=0,
                         prefix_len=64, seed=i) for i in range(6)]
    result = simulate("llama-3-8b", "h100-sxm", specs, block_size=16, num_kv_blocks=64,
                      enable_prefix_caching=True, prefix_caching=design)
    stats = result.stats
    assert stats["prefix_cache_hits"] == 4 * 5 and stats["prefix_cache_hit_tokens"] == 64 * 5
    assert stats["prefix_cache_query_tokens"] == 6 * 69
    assert "prefix_cache_evictions" in stats
    assert all(r.prefix_cache is not None and r.prefix_cache.design == design
               for r in result.trace)


# ---- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"enable_prefix_caching": True, "prefix_caching": "tree"}, "'hash' or 'radix'"),
    ({"enable_prefix_caching": True, "scheduling_policy": "sjf"}, "'fcfs', 'priority' or 'lpm'"),
    ({"prefix_caching": "radix"}, "enable_prefix_caching=True"),
    ({"scheduling_policy": "lpm"}, "enable_prefix_caching=True"),
])
def test_bad_cache_settings_are_refused_with_what_to_do(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_the_design_and_policy_reach_the_engine() -> None:
    llm = make_llm("radix", num_kv_blocks=8, scheduling_policy="lpm")
    assert llm.config.prefix_caching == "radix" and llm.config.scheduling_policy == "lpm"
    assert llm.engine.block_manager.radix is not None
    assert make_llm("hash", num_kv_blocks=8).engine.block_manager.radix is None
