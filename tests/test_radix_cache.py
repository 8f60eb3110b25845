"""The radix-tree prefix cache (minillm.radix_cache) alone and inside BlockManager.

Each test pins one rule: runs of whole blocks, splits at block boundaries, growth in place,
duplicate blocks swapped for the tree's, reference counts, and LRU eviction of unheld leaves
only. The state machine in test_prefix_cache_machine.py checks them all together at random.
"""

from __future__ import annotations

import pytest
from support import admit, radix_tree  # admission as the scheduler does it, for either design

from minillm.kv_cache import BlockManager, PrefixMatch
from minillm.prefix_cache.radix import RadixCache
from minillm.request import Request
from minillm.sampling import SamplingParams

pytestmark = pytest.mark.ch08  # Prefix caching


def make_request(token_ids: list[int], name: str) -> Request:
    return Request(name, list(token_ids), SamplingParams(max_tokens=1), arrival_time=0.0)


def radix_manager(num_blocks: int, block_size: int = 2) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=True,
                        prefix_caching="radix")


def tree(bm: BlockManager) -> RadixCache:
    cache = radix_tree(bm)
    assert cache is not None
    return cache


def shape(cache: RadixCache) -> set[tuple[tuple[int, ...], int, int]]:
    """Each node as (its tokens, its ref count, its depth in blocks)."""
    return {(n.token_ids, n.ref_count, n.end) for n in cache.nodes()}


# ---- runs, matches and splits -----------------------------------------------------------------


def test_a_prompt_is_cached_as_one_run_of_whole_blocks() -> None:
    bm = radix_manager(8)
    a = make_request([1, 2, 3, 4, 5, 6, 7], "a")  # three full blocks and a partial one
    assert admit(bm, a) == PrefixMatch([], 3)
    (node,) = tree(bm).nodes()
    assert node.token_ids == (1, 2, 3, 4, 5, 6) and node.block_ids == a.block_table[:3]
    assert node.ref_count == 1 and not tree(bm).is_cached(a.block_table[3])


def test_match_walks_tokens_and_stops_at_the_first_different_block() -> None:
    bm = radix_manager(8)
    a = make_request([1, 2, 3, 4, 5, 6, 7], "a")
    admit(bm, a)
    assert bm.match_prefix([1, 2, 3, 4, 9, 9, 0]) == PrefixMatch(a.block_table[:2], 3)
    assert bm.match_prefix([1, 2, 3, 9, 5, 6, 0]) == PrefixMatch(a.block_table[:1], 3)
    assert bm.match_prefix([2, 1, 3, 4, 5, 6, 0]) == PrefixMatch([], 3)
    # One token is always left to compute: a prompt of exactly three blocks reuses two.
    assert bm.match_prefix([1, 2, 3, 4, 5, 6]) == PrefixMatch(a.block_table[:2], 2)
    assert len(tree(bm).nodes()) == 1  # matching changed nothing


def test_a_match_that_ends_inside_a_run_splits_it_at_the_block_boundary() -> None:
    bm = radix_manager(10)
    a = make_request([1, 2, 3, 4, 5, 6, 7], "a")
    admit(bm, a)
    (whole,) = tree(bm).nodes()
    old_id = whole.node_id
    b = make_request([1, 2, 3, 4, 8, 8, 8], "b")
    assert admit(bm, b).block_ids == a.block_table[:2]
    upper = tree(bm).block_node[a.block_table[0]]
    lower = tree(bm).block_node[a.block_table[2]]
    assert upper.node_id == old_id and lower.node_id != old_id  # the root side keeps the id
    assert upper.block_ids == a.block_table[:2] and lower.block_ids == a.block_table[2:3]
    assert lower.parent is upper and upper.ref_count == 2 and lower.ref_count == 1
    assert shape(tree(bm)) == {((1, 2, 3, 4), 2, 2), ((5, 6), 1, 3), ((8, 8), 1, 3)}
    assert [n.node_id for n in tree(bm).held_path("b")] == [
        old_id, tree(bm).block_node[b.block_table[2]].node_id]


def test_a_run_grows_in_place_while_one_request_extends_it() -> None:
    bm = radix_manager(8)
    a = make_request([1, 2, 3], "a")
    admit(bm, a)
    for token in (4, 5, 6, 7, 8):  # decode: a block fills every two tokens
        a.token_ids.append(token)
        assert bm.allocate(a, a.num_tokens)
        a.num_computed_tokens = a.num_tokens
        bm.cache_full_blocks(a)
    (node,) = tree(bm).nodes()
    assert node.token_ids == (1, 2, 3, 4, 5, 6, 7, 8) and node.block_ids == a.block_table


def test_a_shared_run_is_not_grown_but_gets_a_child() -> None:
    bm = radix_manager(10)
    a, b = make_request([1, 2, 3], "a"), make_request([1, 2, 3], "b")
    admit(bm, a)
    admit(bm, b)  # b holds a's first block too
    a.token_ids.append(4)
    a.num_computed_tokens = 4
    bm.cache_full_blocks(a)
    assert shape(tree(bm)) == {((1, 2), 2, 1), ((3, 4), 1, 2)}


# ---- duplicates -------------------------------------------------------------------------------


def test_a_block_computed_twice_is_swapped_for_the_trees_copy() -> None:
    bm = radix_manager(6)
    a, b = make_request([1, 2, 3, 4, 5], "a"), make_request([1, 2, 3, 4, 5], "b")
    assert bm.allocate(a, 5) and bm.allocate(b, 5)  # both admitted before either computed
    b_own = list(b.block_table)
    for req in (a, b):
        req.num_computed_tokens = 5
        bm.cache_full_blocks(req)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] == b_own[2]
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    assert set(b_own[:2]) <= set(bm.free_blocks) and bm.num_cached_free_blocks == 0
    assert shape(tree(bm)) == {((1, 2, 3, 4), 2, 2)}
    assert bm.prefix_cache_hits == 0  # computed anyway: a swap saves memory, not work


def test_a_re_sent_prompt_swaps_the_block_that_was_left_to_compute() -> None:
    # A prompt of exactly two blocks reuses one; the other is computed again, then deduplicated.
    bm = radix_manager(6)
    a = make_request([1, 2, 3, 4], "a")
    admit(bm, a)
    assert a.block_table == [0, 1]
    bm.free(a)
    b = make_request([1, 2, 3, 4], "b")
    assert admit(bm, b).block_ids == [0]
    assert b.block_table == [0, 1]  # the tree's two blocks; b's own copy went back
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 0


# ---- reference counts and eviction ------------------------------------------------------------


def test_free_drops_every_count_and_leaves_the_blocks_cached_free() -> None:
    bm = radix_manager(10)
    a, b = make_request([1, 2, 3, 4, 5], "a"), make_request([1, 2, 3, 9, 9], "b")
    admit(bm, a)
    admit(bm, b)
    bm.free(a)
    assert shape(tree(bm)) == {((1, 2), 1, 1), ((3, 4), 0, 2), ((3, 9), 1, 2)}
    bm.free(b)
    assert all(n.ref_count == 0 for n in tree(bm).nodes()) and tree(bm).holders == {}
    assert all(b.ref_count == 0 for b in bm.blocks) and bm.num_free_blocks == 10
    assert sorted(bm.cached_free_blocks()) == sorted(tree(bm).block_node)
    assert bm.num_cached_free_blocks == 3


def test_plain_free_blocks_go_before_any_cached_block_is_evicted() -> None:
    bm = radix_manager(6)
    a = make_request([1, 2, 3, 4, 5], "a")
    admit(bm, a)
    cached = a.block_table[:2]
    bm.free(a)  # two cached blocks, four plain ones
    c = make_request([7, 7, 7, 7, 7, 7, 7, 7, 7], "c")
    assert bm.allocate(c, 8)
    assert bm.prefix_cache_evictions == 0 and bm.match_prefix([1, 2, 3, 4, 0]).block_ids == cached
    assert bm.allocate(c, 9)  # the fifth block: now the cached leaf gives up its last block
    assert bm.prefix_cache_evictions == 1 and bm.take_evicted() == cached[1:]
    assert bm.match_prefix([1, 2, 3, 4, 0]).block_ids == cached[:1]  # its head is still cached
    assert bm.take_evicted() == []


def test_a_leaf_is_evicted_from_its_end_and_keeps_its_place_in_the_lru_order() -> None:
    bm = radix_manager(8)
    a, b = make_request([1, 2, 3, 4, 5, 6, 0], "a"), make_request([7, 7, 8, 8, 0], "b")
    bm.step = 0
    admit(bm, a)  # a leaf of three blocks
    admit(bm, b)  # a leaf of two
    a_blocks, b_blocks = a.block_table[:3], b.block_table[:2]
    bm.step = 1
    bm.free(a)  # a's leaf is the least recently used
    bm.step = 2
    bm.free(b)
    filler = make_request([9] * 16, "filler")
    assert bm.allocate(filler, 6)  # the three plain blocks
    evicted = []
    for num_tokens in range(8, 17, 2):
        assert bm.allocate(filler, num_tokens)
        evicted += bm.take_evicted()
    assert evicted == a_blocks[::-1] + b_blocks[::-1]
    assert tree(bm).nodes() == [] and bm.num_cached_free_blocks == 0


def test_eviction_takes_the_least_recently_used_leaf_never_an_inner_node() -> None:
    bm = radix_manager(7)
    a, b = make_request([1, 2, 3, 4, 5], "a"), make_request([1, 2, 5, 6, 5], "b")
    for step, action in enumerate([lambda: admit(bm, a), lambda: admit(bm, b),
                                   lambda: bm.free(b), lambda: bm.free(a)]):
        if step == 2:  # before the frees: the shared block and each request's own leaf
            shared, a_leaf, b_leaf = a.block_table[0], a.block_table[1], b.block_table[1]
        bm.step = step
        action()
    # b was released first, so its leaf is the least recently used; [1, 2] is no leaf until
    # both of its children are gone.
    filler = make_request([9] * 14, "filler")
    evicted = []
    for num_tokens in range(2, 15, 2):  # four plain blocks first, then the three cached
        assert bm.allocate(filler, num_tokens)
        evicted.append(bm.take_evicted())
    assert evicted == [[], [], [], [], [b_leaf], [a_leaf], [shared]]
    assert bm.prefix_cache_evictions == 3 and tree(bm).nodes() == []


def test_a_held_node_is_never_evicted_and_allocation_waits_instead() -> None:
    bm = radix_manager(5)
    a = make_request([1, 2, 3, 4, 5], "a")
    admit(bm, a)  # holds three blocks, two of them cached
    other = make_request([6, 6, 6], "x")
    admit(bm, other)
    bm.free(other)  # free: one cached block nobody holds ([6, 6]) and one plain
    big = make_request([8] * 6, "big")
    assert bm.allocate(big, 2) and bm.prefix_cache_evictions == 0  # the plain block first
    assert bm.allocate(big, 4) and bm.prefix_cache_evictions == 1  # then [6, 6], unheld
    assert not bm.allocate(big, 6)  # a's blocks are held: no room, and nothing moves
    assert len(big.block_table) == 2 and bm.num_free_blocks == 0
    assert tree(bm).block_node[a.block_table[0]].ref_count == 1
    assert bm.match_prefix(a.token_ids).block_ids == a.block_table[:2]


def test_evict_with_nothing_unheld_raises() -> None:
    cache = RadixCache(block_size=2)
    with pytest.raises(RuntimeError, match="held"):
        cache.evict()
    cache.insert("a", [1, 2], [0], 1, step=0)
    with pytest.raises(RuntimeError, match="held"):
        cache.evict()


def test_a_node_released_and_reused_is_evicted_once_by_its_latest_use() -> None:
    cache = RadixCache(block_size=1)
    cache.insert("a", [1, 2], [10, 11], 2, step=0)
    cache.insert("b", [3], [12], 1, step=1)
    cache.release("a", step=2)
    cache.acquire("c", [10], step=3)  # splits [1, 2]; [1] held again
    cache.release("b", step=4)
    cache.release("c", step=5)
    order = [cache.evict(), cache.evict(), cache.evict()]
    assert order == [11, 12, 10]  # [2] (step 2), [3] (step 4), then [1] once a leaf
    assert cache.nodes() == [] and cache.block_node == {}
    with pytest.raises(RuntimeError):
        cache.evict()


def test_acquiring_twice_without_a_release_is_refused() -> None:
    cache = RadixCache(block_size=1)
    cache.insert("a", [1], [0], 1, step=0)
    with pytest.raises(ValueError, match="already holds"):
        cache.acquire("a", [0], step=1)


def test_the_snapshot_lists_parents_first_and_what_each_request_holds() -> None:
    bm = radix_manager(10)
    a, b = make_request([1, 2, 3, 4, 5], "a"), make_request([1, 2, 7, 7, 5], "b")
    admit(bm, a)
    admit(bm, b)
    snap = bm.snapshot([a, b])
    assert snap.design == "radix" and snap.evicted == ()
    seen: set[int] = set()
    for node in snap.nodes:
        assert node.parent is None or node.parent in seen
        seen.add(node.node_id)
    by_id = {n.node_id: n for n in snap.nodes}
    root_side = [n for n in snap.nodes if n.parent is None]
    assert len(root_side) == 1 and root_side[0].block_ids == tuple(a.block_table[:1])
    assert root_side[0].ref_count == 2 and root_side[0].num_tokens == 2
    for req in (a, b):
        held = [b for node_id in snap.holders[req.request_id] for b in by_id[node_id].block_ids]
        assert held == req.block_table[:2]


# ---- token-granular mode ("radix-token") -------------------------------------------------------


def token_manager(num_blocks: int, block_size: int = 4) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=True,
                        prefix_caching="radix-token")


def run(bm: BlockManager, req: Request, num_tokens: int) -> list[tuple[int, int]]:
    """Admit req, 'compute' it up to num_tokens and return the copies its admission asked for."""
    match = bm.match_prefix(req.token_ids)
    assert bm.allocate(req, num_tokens, match)
    copies = bm.take_copies()
    req.num_computed_tokens = num_tokens
    bm.cache_full_blocks(req)
    return copies


def test_a_match_ending_inside_a_block_copies_it_into_a_fresh_block() -> None:
    bm = token_manager(12)
    a = make_request([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    run(bm, a, 9)
    b = make_request([1, 2, 3, 4, 5, 6, 0, 0, 0], "b")  # shares a's first block and 2 more
    match = bm.match_prefix(b.token_ids)
    assert match == PrefixMatch([a.block_table[0]], 2, a.block_table[1], 2)
    copies = run(bm, b, 9)
    assert copies == [(a.block_table[1], b.block_table[1])] and b.block_table[1] != a.block_table[1]
    assert bm.blocks[a.block_table[1]].ref_count == 1  # the source stays a's alone


def test_blocks_the_step_has_yet_to_write_are_never_copied() -> None:
    bm = token_manager(12)
    a = make_request([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    assert bm.allocate(a, 9, bm.match_prefix(a.token_ids))
    bm.cache_full_blocks(a, 9)  # registered as scheduled: the forward has not run
    b = make_request([1, 2, 3, 4, 5, 6, 0, 0], "b")
    match = bm.match_prefix(b.token_ids)
    assert match.block_ids == [a.block_table[0]] and match.partial_block is None  # no garbage
    bm.step = 1  # the next step: a's blocks were computed by the last forward
    assert bm.match_prefix(b.token_ids).partial_block == a.block_table[1]


def test_a_finished_requests_partial_block_stays_for_copies_until_covered() -> None:
    bm = token_manager(12)
    a = make_request([1, 2, 3, 4, 5, 6], "a")  # one full block and two tokens of the second
    run(bm, a, 6)
    bm.free(a)
    partial = next(n for n in tree(bm).nodes() if len(n.token_ids) < 4)
    assert partial.token_ids == (5, 6) and bm.num_cached_free_blocks == 2
    b = make_request([1, 2, 3, 4, 5, 6, 7, 8, 9], "b")
    assert bm.match_prefix(b.token_ids).num_tokens(4) == 6
    run(bm, b, 9)  # b fills the block that starts 5, 6: the short leaf is redundant now
    assert all(len(n.token_ids) % 4 == 0 for n in tree(bm).nodes())
    assert partial.block_ids[0] not in bm.cached_free_blocks() and bm.num_cached_free_blocks == 0
