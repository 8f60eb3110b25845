"""BlockManager (minillm.kv_cache): block accounting, LRU eviction and the prefix cache.

The unit tests pin down one rule each; the state machine runs random allocate / grow / append /
cache / free / match sequences over a small pool and checks every invariant after every rule.
Alongside the manager it keeps a shadow KV pool: each slot records which token sequence its K/V
were computed from (the prefix up to and including that token), so a reused block is checked
against what was really written into it, not against the manager's own bookkeeping.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import Counter, OrderedDict
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support import admit

from minillm.config import PrefixCaching
from minillm.kv_cache import BlockManager, PrefixMatch, chain_hash
from minillm.prefix_cache.base import PrefixCache
from minillm.prefix_cache.hash_chain import HashChainCache
from minillm.prefix_cache.radix_blocks import RadixPrefixCache
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.sim.router import ReplicaView

pytestmark = pytest.mark.ch04  # Paging


def make_request(token_ids: list[int], name: str = "r") -> Request:
    return Request(name, list(token_ids), SamplingParams(max_tokens=1), arrival_time=0.0)


def compute(bm: BlockManager, req: Request, num_tokens: int) -> None:
    """Allocate and 'run' req up to num_tokens, then register its full blocks (an engine step)."""
    assert bm.allocate(req, num_tokens)
    req.num_computed_tokens = num_tokens
    bm.cache_full_blocks(req)


def hash_table(bm: BlockManager) -> dict[bytes, int]:
    """The hash chain's table (chain hash -> block id); empty with prefix caching off."""
    cache = bm.prefix_cache
    return cache.table if isinstance(cache, HashChainCache) else {}


def snapshot(bm: BlockManager, req: Request) -> tuple:
    return (list(bm.free_blocks), [(b.ref_count, b.hash, b.token_ids) for b in bm.blocks],
            dict(hash_table(bm)), bm.prefix_cache_queries,
            bm.prefix_cache_hits, list(req.block_table))


# ---- plain allocation -------------------------------------------------------------------------


def test_allocate_grows_the_table_a_block_at_a_time_and_free_returns_everything() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    req = make_request(list(range(5)))
    assert bm.num_blocks_for(0) == 0 and bm.num_blocks_for(4) == 1 and bm.num_blocks_for(5) == 2
    assert bm.allocate(req, 5)
    assert len(req.block_table) == 2 and bm.num_free_blocks == 2
    assert bm.allocate(req, 8)  # the second block still has room: nothing new
    assert len(req.block_table) == 2
    assert bm.allocate(req, 9)
    assert len(req.block_table) == 3 and len(set(req.block_table)) == 3
    assert all(bm.blocks[b].ref_count == 1 for b in req.block_table)
    bm.free(req)
    assert req.block_table == [] and bm.num_free_blocks == 4
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_allocate_refuses_without_changing_anything_when_the_pool_is_short() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    a, b = make_request([1, 2, 3]), make_request([4, 5, 6, 7, 8])
    assert bm.allocate(a, 3)
    before = snapshot(bm, b)
    assert not bm.can_allocate(b, 5)
    assert not bm.allocate(b, 5)
    assert snapshot(bm, b) == before


def test_an_idle_cached_prefix_block_uses_up_a_free_slot() -> None:
    # Reusing a cached block that nobody holds takes it out of the free list, so it cannot also
    # be counted as room for the fresh blocks: B needs 3 blocks and only 2 are free.
    bm = BlockManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3])
    admit(bm, a)
    bm.free(a)
    assert bm.allocate(make_request([9]), 1)  # holds one of the three blocks
    b = make_request([1, 2, 3, 4, 5])
    match = bm.match_prefix(b.token_ids)
    assert len(match.block_ids) == 1 and bm.num_free_blocks == 2
    before = snapshot(bm, b)
    assert not bm.allocate(b, 5, match)
    assert snapshot(bm, b) == before
    assert bm.allocate(b, 4, match)  # two blocks: the cached one plus one fresh
    assert b.block_table[0] == match.block_ids[0] and bm.num_free_blocks == 0


# ---- the prefix cache -------------------------------------------------------------------------


def test_prefix_caching_off_never_matches_or_registers() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_request([1, 2, 3, 4, 5])
    admit(bm, a)
    assert bm.prefix_cache.design == "none" and all(b.hash is None for b in bm.blocks)
    assert not any(bm.is_cached(b.block_id) for b in bm.blocks)
    assert bm.match_prefix([1, 2, 3, 4, 5]) == PrefixMatch([], 0)


def test_full_blocks_are_registered_under_chained_hashes() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3, 4, 5])
    compute(bm, a, 3)  # one full block so far
    h0 = chain_hash(b"", [1, 2])
    assert bm.prefix_cache.table == {h0: a.block_table[0]}
    compute(bm, a, 5)
    h1 = chain_hash(h0, [3, 4])
    assert bm.prefix_cache.table == {h0: a.block_table[0], h1: a.block_table[1]}
    assert bm.blocks[a.block_table[1]].token_ids == (3, 4)
    assert bm.blocks[a.block_table[2]].hash is None  # partial: not registered
    # The same tokens after a different parent are a different block.
    assert bm.match_prefix([9, 9, 3, 4, 5]).block_ids == []


def test_match_prefix_leaves_the_last_token_to_compute() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3, 4])
    admit(bm, a)
    assert len(bm.prefix_cache.table) == 2
    assert bm.match_prefix([1, 2, 3, 4]) == PrefixMatch([a.block_table[0]], 1)
    assert bm.match_prefix([1, 2, 3, 4, 0]) == PrefixMatch(a.block_table[:2], 2)
    assert bm.match_prefix([1, 2, 0, 4, 0]) == PrefixMatch([a.block_table[0]], 2)
    assert bm.match_prefix([1]) == PrefixMatch([], 0)


def test_a_shared_prefix_is_reference_counted() -> None:
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    a, b = make_request([1, 2, 3, 4, 5], "a"), make_request([1, 2, 3, 4, 6], "b")
    admit(bm, a)
    admit(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]
    assert bm.num_free_blocks == 3  # only a's tail came back
    bm.free(b)
    assert bm.num_free_blocks == 6 and all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hits_are_counted_in_blocks_on_successful_allocation_only() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3, 4, 5])
    assert admit(bm, a) == PrefixMatch([], 2)  # looked up two full blocks, found none
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (2, 0)
    bm.free(a)
    big = make_request([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # 5 blocks: never fits
    match = bm.match_prefix(big.token_ids)
    assert len(match.block_ids) == 2 and match.num_queried == 4
    assert not bm.allocate(big, big.num_tokens, match)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (2, 0)
    assert bm.allocate(make_request([0]), 1)  # no match given: nothing counted
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (2, 0)
    b = make_request([1, 2, 3, 4, 7])
    admit(bm, b)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (4, 2)


def test_eviction_takes_the_least_recently_freed_block_first() -> None:
    bm = BlockManager(num_blocks=2, block_size=2, enable_prefix_caching=True)
    a, b = make_request([1, 2, 0], "a"), make_request([3, 4, 0], "b")
    compute(bm, a, 2)
    compute(bm, b, 2)
    a_block, b_block = a.block_table[0], b.block_table[0]
    bm.free(b)
    bm.free(a)  # b's block is now the least recently freed, though b was admitted last
    assert list(bm.free_blocks) == [b_block, a_block]
    c = make_request([5, 6, 0], "c")
    assert bm.allocate(c, 1)
    assert c.block_table == [b_block]
    assert bm.match_prefix([3, 4, 0]).block_ids == []  # evicted
    assert bm.match_prefix([1, 2, 0]).block_ids == [a_block]  # still cached


class UnscannableFreeList(OrderedDict):
    """A free list that fails any pass over it, to prove a count never walks the pool."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the free list was scanned")


def test_cached_free_blocks_are_counted_without_scanning_the_free_list() -> None:
    bm = BlockManager(num_blocks=1000, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3, 4, 0])
    compute(bm, a, 4)  # blocks 0 and 1, both full and cached
    bm.free(a)  # the tail first
    bm.free_blocks = UnscannableFreeList(bm.free_blocks)
    assert bm.cached_free_blocks() == [1, 0] and bm.num_cached_free_blocks == 2
    assert bm.allocate(make_request([9, 9, 9]), 3)  # the front of the list: two unused blocks
    assert bm.num_cached_free_blocks == 2


def test_a_requests_tail_blocks_are_evicted_before_its_head() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_request([1, 2, 3, 4, 5, 6, 0])
    compute(bm, a, 6)  # three full blocks, all cached
    head, tail_hash = a.block_table[:2], bm.blocks[a.block_table[2]].hash
    bm.free(a)
    assert list(bm.free_blocks) == [3, 2, 1, 0]  # the never-used block, then a's tail first
    assert bm.allocate(make_request([7, 7, 7]), 3)  # takes block 3 and a's last block
    table = hash_table(bm)
    assert tail_hash not in table and len(table) == 2  # the reused block is forgotten
    assert bm.match_prefix(a.token_ids) == PrefixMatch(head, 3)


def test_a_hash_collision_does_not_hand_out_other_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # Force every block to collide: only the stored tokens can tell blocks apart.
    monkeypatch.setattr("minillm.kv_cache.chain_hash", lambda parent, tokens: b"same")
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    admit(bm, make_request([1, 2, 3]))
    assert bm.match_prefix([1, 2, 3]).block_ids != []
    assert bm.match_prefix([4, 5, 6]) == PrefixMatch([], 1)


def test_two_requests_computing_the_same_prefix_keep_the_first_registered() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a, b = make_request([1, 2, 3], "a"), make_request([1, 2, 3], "b")
    assert bm.allocate(a, 3) and bm.allocate(b, 3)  # both admitted before either computed
    for req in (a, b):
        req.num_computed_tokens = 3
        bm.cache_full_blocks(req)
    h = chain_hash(b"", [1, 2])
    assert bm.prefix_cache.table == {h: a.block_table[0]}
    assert bm.blocks[b.block_table[0]].hash == h  # b's copy is hashed but not the cached one
    b_first = b.block_table[0]
    bm.free(b)
    assert bm.allocate(make_request([8, 9, 8, 9]), 4)  # reuses both of b's blocks
    assert bm.blocks[b_first].hash is None
    assert bm.prefix_cache.table == {h: a.block_table[0]}  # evicting b's copy left a's entry alone
    assert bm.match_prefix([1, 2, 3]).block_ids == [a.block_table[0]]


def test_a_duplicate_block_is_not_counted_as_cached_free() -> None:
    # a and b compute the same full block at once: only a's copy enters the map, so only a's
    # copy can ever be handed out again. b's copy must count as plain free (the fleet's router
    # reads num_free_blocks - num_cached_free_blocks as room that evicts nothing).
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a, b = make_request([1, 2, 3], "a"), make_request([1, 2, 3], "b")
    assert bm.allocate(a, 3) and bm.allocate(b, 3)
    for req in (a, b):
        req.num_computed_tokens = 3
        bm.cache_full_blocks(req)
    a_first, b_first = a.block_table[0], b.block_table[0]
    bm.free(b)
    bm.free(a)
    assert bm.is_cached(a_first) and not bm.is_cached(b_first)
    assert bm.cached_free_blocks() == [a_first] and bm.num_cached_free_blocks == 1
    assert bm.num_free_blocks - bm.num_cached_free_blocks == 3  # b's copy and the two tails
    # The fleet's router sees the same count (minillm.router.ReplicaView reads this manager).
    view = ReplicaView(0, SimpleNamespace(block_manager=bm))  # type: ignore[arg-type]
    assert view.num_free_blocks == 4 and view.num_empty_blocks == 3
    # The three blocks freed before a's cached one go first: taking them evicts nothing.
    assert bm.allocate(make_request([8, 9, 8, 9, 8, 9]), 6)
    assert bm.prefix_cache_evictions == 0 and bm.match_prefix([1, 2, 3]).block_ids == [a_first]


# ---- random operation sequences ---------------------------------------------------------------

TOKENS = st.lists(st.integers(0, 1), min_size=1, max_size=10)  # a tiny alphabet: prefixes repeat


def prefix_ids(token_ids: list[int]) -> list[tuple[int, ...]]:
    """What the K/V at each position depend on: the token and everything before it."""
    return [tuple(token_ids[:p + 1]) for p in range(len(token_ids))]


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 8), block_size=st.sampled_from([1, 2, 4]),
                prefix_caching=st.booleans())
    def setup(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.bm = BlockManager(num_blocks, block_size, prefix_caching)
        self.P = block_size
        self.live: list[Request] = []
        self.shadow: dict[int, tuple[int, ...]] = {}  # slot -> the prefix its K/V came from
        self.count = 0

    # -- helpers --

    def slot(self, req: Request, pos: int) -> int:
        return req.block_table[pos // self.P] * self.P + pos % self.P

    def write(self, req: Request, start: int, end: int) -> None:
        """'Run the model' on positions [start, end): only private, uncached blocks are written."""
        ids = prefix_ids(req.token_ids)
        for pos in range(start, end):
            block = self.bm.blocks[req.block_table[pos // self.P]]
            assert block.ref_count == 1 and block.hash is None
            self.shadow[self.slot(req, pos)] = ids[pos]
        req.num_computed_tokens = end

    def allocate(self, req: Request, num_tokens: int, match: PrefixMatch | None) -> bool:
        bm, prefix = self.bm, match.block_ids if match else []
        fresh_needed = max(bm.num_blocks_for(num_tokens) - len(req.block_table) - len(prefix), 0)
        idle = sum(1 for b in prefix if bm.blocks[b].ref_count == 0)
        expected = fresh_needed + idle <= bm.num_free_blocks
        old_table, before = list(req.block_table), snapshot(bm, req)
        ok = bm.allocate(req, num_tokens, match)
        assert ok == expected
        if not ok:
            assert snapshot(bm, req) == before
            return False
        assert req.block_table[:len(old_table)] == old_table
        assert req.block_table[len(old_table):len(old_table) + len(prefix)] == prefix
        assert len(req.block_table) == max(bm.num_blocks_for(num_tokens), len(old_table))
        cached_ids = set(hash_table(bm).values())
        for block_id in req.block_table[len(old_table) + len(prefix):]:
            # A fresh block is wiped of any old registration: no one can find its new contents.
            assert block_id not in cached_ids and bm.blocks[block_id].hash is None
        return True

    # -- rules --

    def register(self, req: Request) -> None:
        self.bm.cache_full_blocks(req)
        if self.bm.enable_prefix_caching:
            for block_id in req.block_table[:req.num_computed_tokens // self.P]:
                assert self.bm.blocks[block_id].hash is not None

    # -- rules --

    @precondition(lambda self: len(self.live) < 5)
    @rule(tokens=TOKENS, extra=st.integers(0, 10), use_match=st.booleans(), cache=st.booleans())
    def admit(self, tokens: list[int], extra: int, use_match: bool, cache: bool) -> None:
        self.count += 1
        req = make_request(tokens, str(self.count))
        match = self.bm.match_prefix(tokens) if use_match else None
        num_cached = len(match.block_ids) * self.P if match else 0
        num_tokens = min(num_cached + 1 + extra, len(tokens))
        if self.allocate(req, num_tokens, match):
            req.num_computed_tokens = num_cached
            self.write(req, num_cached, num_tokens)
            self.live.append(req)
            if cache:  # as the engine does after each step; the rule below does it at random
                self.register(req)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 4), extra=st.integers(0, 6), cache=st.booleans())
    def grow(self, pick: int, extra: int, cache: bool) -> None:
        req = self.live[pick % len(self.live)]
        if req.num_computed_tokens < req.num_tokens:
            num_tokens = min(req.num_computed_tokens + 1 + extra, req.num_tokens)
            if self.allocate(req, num_tokens, None):
                self.write(req, req.num_computed_tokens, num_tokens)
                if cache:
                    self.register(req)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 4), token=st.integers(0, 1))
    def sample(self, pick: int, token: int) -> None:
        req = self.live[pick % len(self.live)]
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(token)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 4))
    def cache_full_blocks(self, pick: int) -> None:
        self.register(self.live[pick % len(self.live)])

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 4))
    def free(self, pick: int) -> None:
        req = self.live.pop(pick % len(self.live))
        self.bm.free(req)
        assert req.block_table == []

    @rule(tokens=TOKENS)
    def match_prefix(self, tokens: list[int]) -> None:
        before = snapshot(self.bm, make_request([0]))
        match = self.bm.match_prefix(tokens)
        assert snapshot(self.bm, make_request([0])) == before
        if not self.bm.enable_prefix_caching:
            assert match == PrefixMatch([], 0)
            return
        assert match.num_queried == (len(tokens) - 1) // self.P
        assert len(match.block_ids) <= match.num_queried  # the last token stays uncovered
        assert len(set(match.block_ids)) == len(match.block_ids)
        ids = prefix_ids(tokens)
        for i, block_id in enumerate(match.block_ids):
            assert self.bm.blocks[block_id].token_ids == tuple(tokens[i * self.P:(i + 1) * self.P])
            for j in range(self.P):  # the K/V really were computed from this prompt's prefix
                assert self.shadow[block_id * self.P + j] == ids[i * self.P + j]

    # -- invariants --

    @invariant()
    def blocks_are_accounted_for(self) -> None:
        bm = self.bm
        held = Counter(b for req in self.live for b in req.block_table)
        free = set(bm.free_blocks)
        assert len(free) == len(bm.free_blocks) == bm.num_free_blocks
        assert free.isdisjoint(held) and free | set(held) == set(range(bm.num_blocks))
        for block in bm.blocks:
            assert block.ref_count == held[block.block_id] >= 0

    @invariant()
    def the_cached_free_count_matches_a_scan_of_the_free_list(self) -> None:
        bm = self.bm  # kept incrementally; a scan is the definition it must equal, in order
        # Cached means findable: the map names this very block under its hash (a duplicate
        # computed alongside the registered copy keeps its hash for the chain, not the map).
        scan = [b for b in bm.free_blocks if bm.blocks[b].hash is not None
                and hash_table(bm).get(bm.blocks[b].hash) == b]
        assert bm.cached_free_blocks() == scan and bm.num_cached_free_blocks == len(scan)

    @invariant()
    def the_prefix_cache_points_at_what_was_computed(self) -> None:
        bm = self.bm
        assert len(set(hash_table(bm).values())) == len(hash_table(bm))
        for h, block_id in hash_table(bm).items():
            block = bm.blocks[block_id]
            assert block.hash == h and len(block.token_ids) == self.P
            # The last slot's prefix names every token up to the end of this block.
            prefix = self.shadow[block_id * self.P + self.P - 1]
            assert len(prefix) % self.P == 0 and prefix[-self.P:] == block.token_ids
            parent = b""
            for i in range(0, len(prefix), self.P):
                parent = chain_hash(parent, prefix[i:i + self.P])
            assert parent == h
            for j in range(self.P):
                assert self.shadow[block_id * self.P + j] == prefix[:len(prefix) - self.P + j + 1]

    @invariant()
    def hashed_blocks_in_use_are_full_and_computed(self) -> None:
        for req in self.live:
            for i, block_id in enumerate(req.block_table):
                if self.bm.blocks[block_id].hash is not None:
                    assert (i + 1) * self.P <= req.num_computed_tokens
                    assert self.bm.blocks[block_id].token_ids == tuple(
                        req.token_ids[i * self.P:(i + 1) * self.P])


BlockManagerMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase


# ---- one pool, any prefix cache -----------------------------------------------------------------


@pytest.mark.parametrize("enabled, design, kind", [
    (False, "hash", PrefixCache), (True, "hash", HashChainCache),
    (True, "radix", RadixPrefixCache), (True, "radix-token", RadixPrefixCache)])
def test_the_block_manager_picks_its_prefix_cache_once(
        enabled: bool, design: PrefixCaching, kind: type) -> None:
    bm = BlockManager(4, 2, enable_prefix_caching=enabled, prefix_caching=design)
    assert type(bm.prefix_cache) is kind
    assert getattr(bm.prefix_cache, "blocks", bm.blocks) is bm.blocks  # the pool's own records


def test_no_block_manager_method_but_init_names_a_prefix_cache_design() -> None:
    # Design-specific choices live in minillm.prefix_cache; a method here that named a design
    # would be a second place to change when a third design arrives.
    tree = ast.parse(textwrap.dedent(inspect.getsource(BlockManager)))
    methods = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
    assert len(methods) > 15
    for method in methods:
        if method.name == "__init__":
            continue
        body = method.body[1:] if ast.get_docstring(method) else method.body
        code = "\n".join(ast.unparse(statement) for statement in body)
        for word in ("radix", "hash_chain", "hashchain", "self.prefix_caching", "'hash'"):
            assert word not in code.lower(), (method.name, word)
