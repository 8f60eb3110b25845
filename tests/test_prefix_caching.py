"""Prefix caching end to end on the shipped tiny model: same outputs, hand-counted hits.

Caching only skips the prefill of K/V that were already computed, so the outputs with it off,
with the hash chain and with the radix tree must be the same token for token, greedy or seeded,
even when a small pool preempts requests and evicts cached blocks. The hit counters are checked
against values counted by hand on constructed workloads, in blocks and in tokens.
"""

from __future__ import annotations

import random

import pytest
from support import radix_tree

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.prefix_cache.hash_chain import HashChainCache
from minillm.prefix_cache.radix_blocks import RadixPrefixCache
from minillm.serve.conversations import run_conversations
from minillm.sim.simulator import simulate
from minillm.workloads.prefixes import ideal_prefix_reuse, multi_turn
from minillm.workloads.streams import RequestSpec

pytestmark = pytest.mark.ch08  # Prefix caching

DESIGNS = ("hash", "radix", "radix-token")
BLOCK_DESIGNS = ("hash", "radix")  # whole blocks only: the same hits by construction


def make_llm(design: str | None, **kwargs: object) -> LLM:
    caching = {} if design is None else {"enable_prefix_caching": True, "prefix_caching": design}
    return LLM(device="cpu", max_model_len=128, **caching, **kwargs)  # type: ignore[arg-type]


def assert_all_released(bm: BlockManager) -> None:
    """After a run: every block free or cached free, and nothing holds any count."""
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)
    if (tree := radix_tree(bm)) is not None:
        assert tree.holders == {}
        assert all(node.ref_count == 0 for node in tree.nodes())
        assert sorted(bm.cached_free_blocks()) == sorted(tree.block_node)


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
    assert all(results[design] == results[None] for design in DESIGNS)
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
    # The whole prompt (12) and the answer's first 12 tokens; token by token also the 25th,
    # from the partly filled block turn 1 left in the tree.
    assert hit_tokens == (25 if design == "radix-token" else 24)
    assert llm.stats()["prefix_cache_query_tokens"] - base["prefix_cache_query_tokens"] == 30


# ---- same-step hits (vLLM V1: a block is registered when it is scheduled) --------------------


def prefill_tokens(llm: LLM) -> int:
    """Prompt tokens the engine computed, counted from the step trace."""
    return sum(e.num_tokens for rec in llm.trace for e in rec.scheduled if e.phase == "prefill")


def burst(P: int = 4, k: int = 6) -> list[list[int]]:
    """Five prompts admitted in one step: k full blocks in common, then tails of their own."""
    shared = list(range(900, 900 + k * P))
    return [shared + [40 + i] * (1 + i) for i in range(5)]


@pytest.mark.parametrize("design", DESIGNS)
def test_a_burst_admitted_in_one_step_computes_the_shared_prefix_once(design: str) -> None:
    prompts = burst()
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for d in (None, design):
        llm = make_llm(d, block_size=4, num_kv_blocks=64, max_num_batched_tokens=256)
        runs[d] = (llm, [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    llm, outs = runs[design]
    first = llm.trace[0]
    assert len([e for e in first.scheduled if e.phase == "prefill"]) == len(prompts)  # one step
    shared = 6 * 4
    assert prefill_tokens(llm) == shared + sum(len(p) - shared for p in prompts)
    assert prefill_tokens(runs[None][0]) == sum(map(len, prompts))
    assert llm.stats()["prefix_cache_hit_tokens"] == shared * (len(prompts) - 1)
    assert outs == runs[None][1], "the later requests read the K/V the first wrote in that step"


def test_a_chunk_registers_only_the_blocks_it_fills() -> None:
    # Chunked prefill, 22-token prompts, a budget of 14: the first chunk fills 3 blocks of 4 and
    # half of the fourth. The fourth may be found only after the chunk that completes it.
    prompt = list(range(600, 622))
    llm = make_llm("hash", block_size=4, num_kv_blocks=64, max_num_batched_tokens=14,
                   enable_chunked_prefill=True)
    engine = llm.engine
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    a = engine.add_request(prompt, params)
    out = engine.scheduler.schedule()  # the step's plan, as the engine would run it
    req = engine.requests[a]
    hashed = [engine.block_manager.blocks[b].hash is not None for b in req.block_table]
    assert out.scheduled[0].num_tokens == 14 and hashed == [True, True, True, False]


def test_a_same_step_hit_survives_the_first_requests_abort() -> None:
    prompts = [list(range(700, 724)) + [1], list(range(700, 724)) + [2]]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = make_llm(None, block_size=4, num_kv_blocks=64).generate(
        prompts[1:], params, use_tqdm=False)[0].token_ids
    llm = make_llm("hash", block_size=4, num_kv_blocks=64, max_num_batched_tokens=256)
    engine = llm.engine
    a, b = (engine.add_request(p, params) for p in prompts)
    engine.step()  # both admitted: b reads the six blocks a computes in the same forward
    assert engine.trace[0].scheduled[1].num_computed_tokens == 24
    engine.abort_request(a)
    # Its blocks go back to the pool; fill the pool with new work that reuses them.
    engine.add_request(list(range(100, 150)), params)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == b and output.finished:
                assert output.token_ids == alone


@pytest.mark.parametrize("design", DESIGNS)
def test_speculative_tokens_are_never_registered(design: str) -> None:
    # n-gram speculation reserves 1 + k slots a decode; only known tokens may be hashed when the
    # step is scheduled (vLLM caps at request.num_tokens), or a rejected proposal would be found.
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    prompt = [5, 6, 7, 8] * 6
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = make_llm(None, block_size=4, num_kv_blocks=64).generate(
        prompt, params, use_tqdm=False)[0].token_ids
    llm = make_llm(design, block_size=4, num_kv_blocks=64, speculative_config=spec)
    engine, bm = llm.engine, llm.engine.block_manager
    rid = engine.add_request(prompt, params)
    drafted = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        drafted += engine.trace[-1].num_draft_tokens
        req = engine.requests.get(rid)
        for i, block_id in enumerate(req.block_table if req else []):
            if bm.is_cached(block_id):
                assert (i + 1) * 4 <= req.num_tokens
                if design == "hash":
                    assert bm.blocks[block_id].token_ids == tuple(req.token_ids[i * 4:i * 4 + 4])
    assert drafted > 0 and outputs[-1].token_ids == plain


# ---- token-granular radix ---------------------------------------------------------------------


def served_one_at_a_time(design: str | None, prompts: list[list[int]], P: int = 4,
                         **kwargs: object) -> tuple[LLM, list[list[int]]]:
    llm = make_llm(design, block_size=P, num_kv_blocks=96, **kwargs)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    return llm, [llm.generate(p, params, use_tqdm=False)[0].token_ids for p in prompts]


def test_token_mode_reuses_the_shared_tokens_of_a_partial_block() -> None:
    # A 14-token opening: 3 whole blocks of 4 and 2 tokens of the fourth. Whole blocks reuse 12
    # tokens per follow-up; token by token reuses all 14 (the fourth block copied, then its
    # last two slots written by the follow-up).
    opening = list(range(800, 814))
    prompts = [opening + [20 + i] * 3 for i in range(4)]
    plain = served_one_at_a_time(None, prompts)[1]
    hits = {}
    for design in ("radix", "radix-token"):
        llm, outs = served_one_at_a_time(design, prompts)
        assert outs == plain, design
        hits[design] = llm.stats()["prefix_cache_hit_tokens"]
        computed = sum(e.num_tokens for rec in llm.trace for e in rec.scheduled
                       if e.phase == "prefill")
        assert computed == sum(map(len, prompts)) - hits[design]  # counted from the trace
    assert hits["radix"] == 12 * 3 and hits["radix-token"] == 14 * 3


def test_token_mode_recomputes_only_the_last_token_of_a_repeated_prompt() -> None:
    prompt = list(range(810, 826))  # 16 tokens: four whole blocks
    llm, outs = served_one_at_a_time("radix-token", [prompt, prompt, prompt])
    assert llm.stats()["prefix_cache_hit_tokens"] == 2 * 15  # hash or radix: 2 * 12
    assert outs[0] == outs[1] == outs[2]


def test_a_copied_block_leaves_its_owner_intact() -> None:
    # b copies a's fourth block and overwrites its last slots with its own tokens; c then
    # reuses a's whole fourth block: it must still hold a's K/V, as the no-cache run shows.
    a = list(range(830, 846))
    b = a[:14] + [1, 2, 3]
    c = a + [4, 5]
    plain = served_one_at_a_time(None, [a, b, c])[1]
    llm, outs = served_one_at_a_time("radix-token", [a, b, c])
    assert outs == plain
    assert llm.stats()["prefix_cache_hit_tokens"] == 14 + 16  # b: 3 blocks + 2 tokens; c: 4


def test_token_mode_reaches_the_any_token_ceiling_on_multi_turn_chat() -> None:
    chats = multi_turn(3, 3, (20, 30), (5, 9), (3, 6), vocab_size=2000, seed=4)
    runs = {}
    for design in (None, "radix", "radix-token"):
        llm = make_llm(design, block_size=4, num_kv_blocks=128)
        outs = [llm_out for chat in [[c] for c in chats]
                for llm_out in run_conversations(llm, chat)[0]]  # chats one after the other
        runs[design] = (llm, outs)
    issued = runs["radix-token"][1]
    assert [o.token_ids for o in issued] == [o.token_ids for o in runs[None][1]]
    every_token = ideal_prefix_reuse(issued).reusable_tokens
    whole_blocks = ideal_prefix_reuse(issued, 4).reusable_tokens
    assert runs["radix"][0].stats()["prefix_cache_hit_tokens"] == whole_blocks
    assert runs["radix-token"][0].stats()["prefix_cache_hit_tokens"] == every_token
    assert every_token > whole_blocks


@pytest.mark.parametrize("design", ["hash", "radix-token"])
def test_same_step_hits_and_copies_under_the_triton_backend(design: str) -> None:
    # TRITON_INTERPRET=1 (tests/conftest.py): the Triton kernels run on the CPU, small.
    prompts = burst()
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    outs = {}
    for d, backend in ((None, "torch"), (design, "triton")):
        llm = make_llm(d, block_size=4, num_kv_blocks=64, max_num_batched_tokens=256,
                       attention_backend=backend)
        outs[d] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        outs[d] += [o.token_ids for o in llm.generate([prompts[0][:26]], params,
                                                      use_tqdm=False)]
    assert outs[design] == outs[None]


# ---- the trace and the simulator --------------------------------------------------------------


@pytest.mark.parametrize("design", DESIGNS)
def test_each_step_records_the_cache_and_its_evictions(design: str) -> None:
    llm = make_llm(design, block_size=4, num_kv_blocks=22, max_num_seqs=4)
    llm.generate(prefix_sharing_prompts(), SamplingParams(max_tokens=10, ignore_eos=True),
                 use_tqdm=False)
    bm = llm.engine.block_manager
    snapshots = [record.prefix_cache for record in llm.trace]
    label = "radix" if design == "radix-token" else design  # one tree, matched either way
    assert all(s is not None and s.design == label for s in snapshots)
    evicted = [b for s in snapshots if s is not None for b in s.evicted]
    assert len(evicted) == bm.prefix_cache_evictions > 0
    for record, snap in zip(llm.trace, snapshots):
        assert snap is not None
        ids = {node.node_id for node in snap.nodes}
        seen: set[int] = set()
        for node in snap.nodes:  # parents first, and each node's blocks cached
            assert node.parent is None or node.parent in seen
            seen.add(node.node_id)
            if design == "radix-token" and node.num_tokens < 4:  # a finished request's
                assert len(node.block_ids) == 1  # partly filled last block, kept as a leaf
            else:
                assert node.num_tokens == 4 * len(node.block_ids)
        for request_id, held in snap.holders.items():
            assert set(held) <= ids
            table = record.block_tables.get(request_id)
            if table is not None and design != "hash":  # a path from the root: its first blocks
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
    assert all(r.prefix_cache is not None
               and r.prefix_cache.design == ("radix" if design == "radix-token" else design)
               for r in result.trace)


# ---- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"enable_prefix_caching": True, "prefix_caching": "tree"},
     "'hash', 'radix' or 'radix-token'"),
    ({"prefix_caching": "radix-token"}, "enable_prefix_caching=True"),
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
    assert isinstance(llm.engine.block_manager.prefix_cache, RadixPrefixCache)
    hashed = make_llm("hash", num_kv_blocks=8).engine.block_manager.prefix_cache
    assert isinstance(hashed, HashChainCache)


@pytest.mark.parametrize("num_kv_blocks", [22, 26])
def test_copies_and_swaps_of_one_step_leave_every_output_intact(num_kv_blocks: int) -> None:
    """Token-granular copies share steps with swaps. A swapped-in table holds its K/V only once
    the step copies them in, so it must not be registered (and so copied from, or traded for
    the tree's blocks) before the step; and a copy may refill a block a swap-out of the same
    step still reads, so the engine copies out, then copies blocks, then copies in."""
    prompts = prefix_sharing_prompts(seed=5) * 2
    greedy = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    pool = dict(block_size=4, num_kv_blocks=num_kv_blocks, max_num_seqs=6,
                max_num_batched_tokens=64)
    expected = [o.token_ids for o in make_llm(None, **pool).generate(prompts, greedy,
                                                                     use_tqdm=False)]
    llm = make_llm("radix-token", **pool, preemption_mode="swap", swap_space=0.001)
    got = [[o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)] for _ in "ab"]
    assert got == [expected, expected]
    stats = llm.stats()
    assert stats["num_swap_outs"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    assert_all_released(llm.engine.block_manager)
