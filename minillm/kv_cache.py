"""The paged KV cache: the pool of fixed-size blocks, the block manager and the prefix cache.

Every layer's K and V live in one tensor of shape (L, 2, N, P, K, D): N blocks of P token slots.
A sequence owns a block table (its list of physical block ids); token t of the sequence sits in
slot block_table[t // P] * P + t % P. Blocks are reference counted so that sequences with the
same prefix can share them. With prefix caching, full computed blocks stay reusable after their
last owner frees them, until the pool needs the space. Two designs find them, each a
minillm.prefix_cache.base.PrefixCache that the block manager holds and never branches on:

- "hash" (vLLM's automatic prefix caching, minillm.prefix_cache.hash_chain): a full block is
  registered under a hash of its tokens chained with the hash of the block before it; the least
  recently freed block is reused first, cached or not.
- "radix" (SGLang's RadixAttention, minillm.prefix_cache.radix_blocks): a tree of block runs
  keyed by tokens; plain free blocks are used first, then the least recently used leaf nobody
  holds gives up its last block.
- "radix-token": the same tree matched token by token (SGLang's default page size of 1); a
  match ending inside a cached block copies that block's first tokens into a fresh one (copy
  on write: BlockManager.copies, made by the engine before the step writes anything).

A block is registered when the step that computes it is scheduled (vLLM V1; cache_full_blocks);
only a copy needs K/V already computed, so blocks registered this step are never copied.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# A block's bytes are sizing arithmetic (minillm.calc.sizing) and the pool's tensor is allocated
# with the pool's K/V dtype (minillm.quant.kv_pool): both importable from here too.
from minillm.calc.sizing import kv_cache_block_bytes as kv_cache_block_bytes
from minillm.config import PrefixCaching
from minillm.prefix_cache.base import PrefixCache, PrefixMatch
from minillm.prefix_cache.hash_chain import HashChainCache, chain_hash
from minillm.prefix_cache.radix_blocks import RadixPrefixCache
from minillm.prefix_cache.snapshot import SnapshotView
from minillm.quant.kv_pool import allocate_kv_cache as allocate_kv_cache
from minillm.request import Request
from minillm.trace import PrefixCacheSnapshot

__all__ = ["Block", "BlockManager", "PrefixMatch", "allocate_kv_cache", "chain_hash",
           "kv_cache_block_bytes"]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and its K/V are computed
    token_ids: tuple[int, ...] = ()
    parent_hash: bytes = b""  # the chain hash of the block before it (hash design)
    last_used: int = 0  # the engine step that last registered, matched or freed it


class BlockManager:
    """Hands out KV blocks to requests, counts references and keeps the prefix cache.

    prefix_caching picks the cache's design when enable_prefix_caching is on: "hash", "radix"
    or "radix-token" (see the module docstring). The pool is the same for all three; the design
    lives in self.prefix_cache (minillm.prefix_cache.base.PrefixCache), chosen here once and
    never asked about again. step is the engine's step number, which the engine sets before
    each step: the radix tree's LRU order and the trace's last_used read it, and setting it
    starts the step's copies and its set of blocks not yet computed afresh.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 prefix_caching: PrefixCaching = "hash"):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.prefix_cache: PrefixCache = (
            PrefixCache(block_size) if not enable_prefix_caching
            else HashChainCache(self.blocks, block_size) if prefix_caching == "hash"
            else RadixPrefixCache(self.blocks, block_size, prefix_caching == "radix-token"))
        # Blocks nobody holds, least recently freed first; cached ones among them stay findable.
        # (Radix: plain free blocks sit in front of the cached ones, so they go first.)
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # The free blocks that still hold a registered prefix, in the same order, kept as blocks
        # come and go so that counting them never scans the pool (a GPU pool has ~10^5 blocks).
        self.cached_free: dict[int, None] = {}
        self._step = 0
        # This step's copies (source block, fresh block) of partly matched blocks, which the
        # engine makes before the forward, and the blocks registered this step whose K/V the
        # forward has yet to write (never a copy's source). Both start empty every step.
        self.copies: list[tuple[int, int]] = []
        self._uncomputed: set[int] = set()
        self.prefix_cache_queries = 0  # full blocks looked up at admission
        self.prefix_cache_hits = 0  # of those, blocks found in the cache
        self.prefix_cache_query_tokens = 0  # prompt tokens looked up (all but the last)
        self.prefix_cache_hit_tokens = 0  # of those, tokens whose K/V were reused
        self.prefix_cache_evictions = 0  # cached blocks thrown away to make room
        self.evicted: list[int] = []  # their ids since the engine last took them (take_evicted)
        self.snapshots = SnapshotView(self.prefix_cache)  # the trace's, kept while unchanged

    @property
    def step(self) -> int:
        """The engine step about to run, set before it is scheduled."""
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        self._step = step
        self.copies, self._uncomputed = [], set()  # last step's copies were made

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies the step must make before its forward."""
        copies, self.copies = self.copies, []
        return copies

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_cached_free_blocks(self) -> int:
        """How many free blocks still hold a registered prefix, in O(1)."""
        return len(self.cached_free)

    def cached_free_blocks(self) -> list[int]:
        """Free blocks that still hold a registered prefix: reusable until evicted.

        Least recently freed first; costs one copy of those ids, never a scan of the pool."""
        return list(self.cached_free)

    def is_cached(self, block_id: int) -> bool:
        """Whether the block holds K/V that the prefix cache may hand out again."""
        return self.prefix_cache.is_cached(block_id)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest run of cached blocks equal to the start of token_ids.

        At least one token is left out, since the step must compute it to sample from its logits.
        """
        return self.prefix_cache.match(token_ids, self._uncomputed)

    def can_allocate(self, req: Request, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        """Whether req's block table can grow to hold num_tokens, reusing the prefix blocks."""
        needed = self.num_blocks_for(num_tokens) - len(req.block_table) - len(prefix)
        # A cached block that nobody holds sits in the free list: reusing it uses up a free slot.
        idle = sum(1 for b in prefix if self.blocks[b].ref_count == 0) if prefix else 0
        return max(needed, 0) + idle <= len(self.free_blocks)

    def allocate(self, req: Request, num_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Grow req's block table to hold num_tokens; False (and no change) if the pool is short.

        match must be match_prefix(req.token_ids), taken just before."""
        prefix = match.block_ids if match else []
        if not self.can_allocate(req, num_tokens, prefix):
            return False
        if match is not None:
            self._count_lookup(req, match)
        for block_id in prefix:
            self._hold(block_id)
            req.block_table.append(block_id)
        if prefix:  # held before fresh blocks are taken, which evict
            self.prefix_cache.acquire(req.request_id, prefix, self.step)
        first_fresh = len(req.block_table)
        for _ in range(self.num_blocks_for(num_tokens) - len(req.block_table)):
            req.block_table.append(self._take_free_block())
        if match is not None and match.partial_block is not None:
            # Copy on write: the partly matched block's first tokens into req's own block. The
            # engine copies before anything this step writes, so the source is intact even if
            # taking the fresh blocks above just evicted it.
            self.copies.append((match.partial_block, req.block_table[first_fresh]))
        return True

    def _hold(self, block_id: int) -> None:
        """One more reference to a cached block, which leaves the free list if it sat there."""
        self.blocks[block_id].ref_count += 1
        self.blocks[block_id].last_used = self.step
        self.free_blocks.pop(block_id, None)
        self.cached_free.pop(block_id, None)

    def _count_lookup(self, req: Request, match: PrefixMatch) -> None:
        self.snapshots.stale()
        self.prefix_cache_queries += match.num_queried
        self.prefix_cache_hits += len(match.block_ids)
        if self.enable_prefix_caching:
            self.prefix_cache_query_tokens += req.num_tokens - 1
            self.prefix_cache_hit_tokens += match.num_tokens(self.block_size)

    def free(self, req: Request) -> None:
        """Release req's blocks. The last blocks go to the free list first, so a shared prefix
        outlives the tails that are less likely to be asked for again."""
        self.prefix_cache.release(req, self.step)
        self._free_dropped()
        self.snapshots.stale()
        for block_id in reversed(req.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                block.last_used = self.step
                self._add_free(block_id)
        req.block_table = []

    def _free_dropped(self) -> None:
        """Blocks the cache let go of without an eviction are plain free blocks again."""
        for block_id in self.prefix_cache.take_dropped():
            self.snapshots.stale()
            if block_id in self.cached_free:  # unheld: a partial leaf's block always is
                del self.cached_free[block_id]
                self.free_blocks.move_to_end(block_id, last=False)

    def trim(self, req: Request, num_tokens: int) -> None:
        """Give back the blocks of req's table past its first num_tokens tokens: lookahead that
        speculative decoding reserved and rejected tokens wrote to. They hold no computed
        token, so no other request shares them and the prefix cache never registered them."""
        keep = self.num_blocks_for(num_tokens)
        for block_id in reversed(req.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count == 0 and not self.is_cached(block_id), "a lookahead block"
            block.last_used = self.step
            self._add_free(block_id)
        del req.block_table[keep:]

    def _add_free(self, block_id: int) -> None:
        self.free_blocks[block_id] = None
        if self.is_cached(block_id):
            self.cached_free[block_id] = None
        elif self.prefix_cache.plain_blocks_first:  # so a cached one waits
            self.free_blocks.move_to_end(block_id, last=False)

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Register req's blocks that are full once its first num_tokens tokens have K/V.

        num_tokens defaults to the tokens already computed (the engine's call after a step).
        The scheduler calls it with what a step is about to compute, as vLLM V1's allocate_slots
        does, so that a request admitted later in the same step already finds those blocks: the
        step's K/V are written into the pool before attention reads it, in every layer. It is
        capped at the request's known tokens: proposed tokens that may be rejected are never
        registered. Where the cache already held the same tokens in another block, req's table
        takes the cache's block and its own copy goes back to the pool (radix).
        """
        if not self.enable_prefix_caching:
            return
        num_tokens = min(req.num_computed_tokens if num_tokens is None else num_tokens,
                         req.num_tokens)
        table = req.block_table
        swaps = self.prefix_cache.register(req, num_tokens, self.step)
        num_full = min(num_tokens // self.block_size, len(table))
        num_computed = req.num_computed_tokens // self.block_size
        self._uncomputed.update(b for b in table[num_computed:num_full] if self.is_cached(b))
        self._free_dropped()
        for index, cached_block in swaps:
            copy = self.blocks[table[index]]
            self._hold(cached_block)
            table[index] = cached_block
            copy.ref_count -= 1
            assert copy.ref_count == 0, "a block outside the cache is never shared"
            self._add_free(copy.block_id)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        if block_id in self.cached_free:  # its contents go: the cache picks which block gives up
            victim = self.prefix_cache.evict(block_id)
            if victim != block_id:  # the head keeps its place; the victim leaves the list
                self.free_blocks[block_id] = None
                self.free_blocks.move_to_end(block_id, last=False)
                del self.free_blocks[victim]
            del self.cached_free[victim]
            self._count_eviction([victim])
            block_id = victim
        block = self.blocks[block_id]
        block.hash, block.token_ids = None, ()  # it is about to hold other tokens
        block.ref_count = 1
        return block_id

    def stats(self) -> dict[str, int]:
        """The pool's size and the prefix cache's counters, as LLM.stats() reports them."""
        return {"num_blocks": self.num_blocks, "num_free_blocks": self.num_free_blocks,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_hits": self.prefix_cache_hits,
                "prefix_cache_query_tokens": self.prefix_cache_query_tokens,
                "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
                "prefix_cache_evictions": self.prefix_cache_evictions}

    def _count_eviction(self, block_ids: list[int]) -> None:
        self.snapshots.stale()
        self.prefix_cache_evictions += len(block_ids)
        self.evicted.extend(block_ids)

    # ---- what the trace records --------------------------------------------------------------

    def take_evicted(self) -> list[int]:
        """The blocks evicted since the last call (the engine takes them once a step)."""
        evicted, self.evicted = self.evicted, []
        return evicted

    def snapshot(self, running: Sequence[Request], evicted: Sequence[int] = ()
                 ) -> PrefixCacheSnapshot:
        """The prefix cache as minillm.trace.PrefixCacheSnapshot, with the requests holding it.

        O(cached blocks + running requests' blocks): only for traced steps (SnapshotView)."""
        return self.snapshots.snapshot(running, evicted)
