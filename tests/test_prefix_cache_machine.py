"""Both prefix-cache designs under random prefix-sharing workloads (a Hypothesis state machine).

Requests are drawn from a few shared prefixes plus random suffixes; rules admit them (reusing
the cached prefix), step them (a prefill chunk or a decode token), finish, preempt and resume
them in random order over a small pool, so blocks are shared, evicted and deduplicated. A shadow
KV pool records, per slot, the prefix its K/V were computed from, so every reused block is
checked against what was really written into it. After every rule:

- every block is exactly one of: held by requests (ref_count = the tables that contain it),
  cached free, or plain free; the cached-free list is the free blocks the cache can hand out;
- radix: each node's ref count is the number of live requests whose held path runs through it,
  and equals its blocks' ref counts; a request's table starts with its path's blocks; a node is
  evictable iff it is a leaf with ref count 0, and each such leaf sits in the eviction heap;
- a match is a run of blocks holding the prompt's own first tokens, one token short at least.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support import radix_tree

from minillm.kv_cache import BlockManager, PrefixMatch
from minillm.request import Request
from minillm.sampling import SamplingParams

pytestmark = pytest.mark.ch08  # Prefix caching

SHARED = ([1, 2, 1, 3, 1, 2, 1, 3, 2, 2], [3, 1, 3, 2, 2, 1], [2, 2, 2, 1, 1, 3, 1, 2])
SUFFIX = st.lists(st.integers(0, 3), max_size=6)
MAX_LIVE = 5


def prefixes(token_ids: list[int]) -> list[tuple[int, ...]]:
    """What the K/V at each position depend on: the token and everything before it."""
    return [tuple(token_ids[:p + 1]) for p in range(len(token_ids))]


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(design=st.sampled_from(["hash", "radix", "radix-token"]),
                num_blocks=st.integers(3, 12), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, design: str, num_blocks: int, block_size: int) -> None:
        self.bm = BlockManager(num_blocks, block_size, True, design)  # type: ignore[arg-type]
        self.P = block_size
        self.running: list[Request] = []
        self.waiting: list[Request] = []  # preempted: their tokens kept, their K/V gone
        self.shadow: dict[int, tuple[int, ...]] = {}  # slot -> the prefix its K/V came from
        self.count = 0

    # -- the engine's moves --

    def slot(self, req: Request, pos: int) -> int:
        return req.block_table[pos // self.P] * self.P + pos % self.P

    def compute(self, req: Request, num_tokens: int) -> None:
        """'Run the model' up to num_tokens and register the full blocks, as a step does."""
        ids = prefixes(req.token_ids)
        for pos in range(req.num_computed_tokens, num_tokens):
            block_id = req.block_table[pos // self.P]
            assert self.bm.blocks[block_id].ref_count == 1, "wrote into a shared block"
            assert not self.bm.is_cached(block_id), "wrote into a cached block"
            self.shadow[self.slot(req, pos)] = ids[pos]
        req.num_computed_tokens = num_tokens
        self.bm.cache_full_blocks(req)

    def start(self, req: Request, chunk: int) -> bool:
        """Admission: reuse the cached prefix, allocate and compute one chunk past it."""
        match = self.bm.match_prefix(req.token_ids)
        self.check_match(req.token_ids, match)
        num_cached = match.num_tokens(self.P)
        num_tokens = min(num_cached + chunk, req.num_tokens)
        free_before = self.bm.num_free_blocks
        if not self.bm.allocate(req, num_tokens, match):
            assert req.block_table == [] and self.bm.num_free_blocks == free_before
            assert self.bm.take_copies() == []
            return False
        assert req.block_table[:len(match.block_ids)] == match.block_ids
        copies = self.bm.take_copies()  # made before anything is written, as the engine does
        if match.partial_block is None:
            assert copies == []
        else:  # copy on write into the request's first fresh block
            assert copies == [(match.partial_block, req.block_table[len(match.block_ids)])]
            src, dst = copies[0]
            old = {j: self.shadow.get(src * self.P + j) for j in range(self.P)}
            for j, value in old.items():
                if value is None:
                    self.shadow.pop(dst * self.P + j, None)
                else:
                    self.shadow[dst * self.P + j] = value
        req.num_computed_tokens = num_cached
        self.compute(req, num_tokens)
        self.running.append(req)
        return True

    def num_cached(self) -> int:
        """How many entries the cache's index holds: radix nodes, or chain hashes."""
        tree = radix_tree(self.bm)
        return len(tree.nodes()) if tree else len(self.bm.prefix_cache.table)  # type: ignore

    def check_match(self, token_ids: list[int], match: PrefixMatch) -> None:
        P = self.P
        assert match.num_queried == (len(token_ids) - 1) // P
        assert len(match.block_ids) <= match.num_queried  # the last token stays uncovered
        assert len(set(match.block_ids)) == len(match.block_ids)
        assert match.num_tokens(P) <= len(token_ids) - 1
        ids = prefixes(token_ids)
        for i, block_id in enumerate(match.block_ids):
            assert self.bm.is_cached(block_id)
            for j in range(P):  # the K/V really were computed from this prompt's prefix
                assert self.shadow[block_id * P + j] == ids[i * P + j]
        if match.partial_block is not None:  # token-granular: the shared start of one more
            assert self.bm.prefix_caching == "radix-token" and 0 < match.num_partial_tokens < P
            assert self.bm.is_cached(match.partial_block)
            first = len(match.block_ids) * P
            for j in range(match.num_partial_tokens):
                assert self.shadow[match.partial_block * P + j] == ids[first + j]

    # -- rules --

    @precondition(lambda self: len(self.running) < MAX_LIVE)
    @rule(which=st.integers(0, len(SHARED) - 1), cut=st.integers(0, 10), suffix=SUFFIX,
          chunk=st.integers(1, 8))
    def admit(self, which: int, cut: int, suffix: list[int], chunk: int) -> None:
        tokens = (SHARED[which][:cut] + suffix) or [0]
        self.count += 1
        self.start(Request(str(self.count), tokens, SamplingParams(max_tokens=1), 0.0), chunk)

    @precondition(lambda self: self.waiting and len(self.running) < MAX_LIVE)
    @rule(pick=st.integers(0, 4), chunk=st.integers(1, 8))
    def resume(self, pick: int, chunk: int) -> None:
        req = self.waiting[pick % len(self.waiting)]
        if self.start(req, chunk):
            self.waiting.remove(req)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 4), chunk=st.integers(1, 8), token=st.integers(0, 3))
    def step(self, pick: int, chunk: int, token: int) -> None:
        """A prefill chunk, or a decode step (sample a token, then compute it)."""
        req = self.running[pick % len(self.running)]
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(token)
            chunk = 1
        num_tokens = min(req.num_computed_tokens + chunk, req.num_tokens)
        if self.bm.allocate(req, num_tokens):
            self.compute(req, num_tokens)
        else:  # the pool ran dry: preempt it, as the scheduler would its newest request
            self.preempt_request(req)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 4))
    def finish(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        self.bm.free(req)
        assert req.block_table == []

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 4))
    def preempt(self, pick: int) -> None:
        self.preempt_request(self.running[pick % len(self.running)])

    def preempt_request(self, req: Request) -> None:
        self.running.remove(req)
        self.bm.free(req)
        req.num_computed_tokens = 0
        self.waiting.append(req)

    @rule(which=st.integers(0, len(SHARED) - 1), suffix=SUFFIX)
    def match(self, which: int, suffix: list[int]) -> None:
        tokens = SHARED[which] + suffix
        before = (list(self.bm.free_blocks), [b.ref_count for b in self.bm.blocks],
                  self.num_cached())
        self.check_match(tokens, self.bm.match_prefix(tokens))
        assert before == (list(self.bm.free_blocks), [b.ref_count for b in self.bm.blocks],
                          self.num_cached())

    # -- invariants --

    @invariant()
    def every_block_is_held_cached_free_or_plain_free(self) -> None:
        bm = self.bm
        held = Counter(b for req in self.running for b in req.block_table)
        free = set(bm.free_blocks)
        assert all(req.block_table == [] for req in self.waiting)
        assert len(free) == bm.num_free_blocks and free.isdisjoint(held)
        assert free | set(held) == set(range(bm.num_blocks))
        for block in bm.blocks:
            assert block.ref_count == held[block.block_id]
        cached_free = [b for b in bm.free_blocks if bm.is_cached(b)]
        assert sorted(bm.cached_free_blocks()) == sorted(cached_free)
        assert bm.num_cached_free_blocks == len(cached_free)

    @invariant()
    def the_reused_snapshot_equals_a_fresh_one(self) -> None:
        snapshot = self.bm.snapshot(self.running)  # nodes kept from the last change
        self.bm.snapshots.stale()  # and records kept from earlier builds
        if (tree := radix_tree(self.bm)) is not None:
            tree._snapshot_memo = {}
        else:
            self.bm.prefix_cache._node_memo = {}  # type: ignore[attr-defined]
        assert snapshot == self.bm.snapshot(self.running)
        seen: set[int] = set()
        for node in snapshot.nodes:  # parents first
            assert node.parent is None or node.parent in seen
            seen.add(node.node_id)
            assert node.ref_count == self.bm.blocks[node.block_ids[0]].ref_count

    @invariant()
    def running_requests_read_only_their_own_prefixes(self) -> None:
        for req in self.running:
            ids = prefixes(req.token_ids)
            for pos in range(req.num_computed_tokens):
                assert self.shadow[self.slot(req, pos)] == ids[pos]

    @invariant()
    def radix_counts_match_the_requests_holding_each_node(self) -> None:
        radix = radix_tree(self.bm)
        if radix is None:
            return
        nodes = radix.nodes()
        holding: Counter[int] = Counter()
        for req in self.running:
            path = radix.held_path(req.request_id)
            blocks = [b for node in path for b in node.block_ids]
            assert req.block_table[:len(blocks)] == blocks  # a table starts with its path
            assert not path or path[-1].end == len(blocks)
            holding.update(id(node) for node in path)
        assert set(radix.holders) <= {req.request_id for req in self.running}
        heap_entries = {entry for _, entry, _ in radix._heap}
        for node in nodes:
            assert node.ref_count == holding[id(node)]
            assert all(self.bm.blocks[b].ref_count == node.ref_count for b in node.block_ids)
            if len(node.token_ids) < self.P:  # token-granular: a kept, partly filled block
                assert radix.token_granular and len(node.block_ids) == 1 and not node.children
                assert node.ref_count == 0  # only ever copied, never held
            else:
                assert len(node.token_ids) == self.P * len(node.block_ids)
            assert radix.is_evictable(node) == (not node.children and node.ref_count == 0)
            if radix.is_evictable(node):
                assert node.heap_entry in heap_entries  # eviction can find it
            for b in node.block_ids:  # each cached block holds the tokens its path spells
                assert radix.block_node[b] is node
        tree_blocks = {b for node in nodes for b in node.block_ids}
        assert tree_blocks == set(radix.block_node)
        assert set(self.bm.cached_free_blocks()) == {b for b in tree_blocks
                                                     if self.bm.blocks[b].ref_count == 0}

    @invariant()
    def cached_blocks_hold_the_tokens_their_path_spells(self) -> None:
        radix, P = radix_tree(self.bm), self.P
        if radix is None:
            return
        for node in radix.nodes():
            path = radix._path(node)[::-1]
            tokens = tuple(t for n in path for t in n.token_ids)
            for i, b in enumerate(node.block_ids):
                first = (node.start + i) * P
                for j in range(min(P, len(tokens) - first)):
                    assert self.shadow[b * P + j] == tokens[:first + j + 1]


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None)
TestPrefixCacheMachine = PrefixCacheMachine.TestCase
