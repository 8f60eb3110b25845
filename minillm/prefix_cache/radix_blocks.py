"""SGLang's design as BlockManager's prefix cache: the radix tree (radix.py) over the pool.

The tree itself only knows block ids and tokens; this is what the pool needs from it. Plain free
blocks are handed out before any cached one, and when none is left the least recently used leaf
nobody holds gives up its last block. Where a request computed blocks the tree already held, its
table takes the tree's blocks (swaps) and its copies go back to the pool.

Token-granular mode ("radix-token", SGLang's default page size of 1) matches token by token. A
match that ends inside a cached block reuses that block's first tokens too: the block is copied
into a fresh block of the new request (copy on write), which then computes from the first token
that differs. A finished request's partly filled last block stays in the tree for such copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from minillm.prefix_cache.base import PrefixCache, PrefixMatch, Swap
from minillm.prefix_cache.radix import RadixCache

if TYPE_CHECKING:
    from minillm.kv_cache import Block
    from minillm.request import Request
    from minillm.trace import CacheNode


class RadixPrefixCache(PrefixCache):
    """A RadixCache (tree) kept over a pool's blocks; token_granular: "radix-token"."""

    design = "radix"
    plain_blocks_first = True

    def __init__(self, blocks: list[Block], block_size: int, token_granular: bool = False):
        super().__init__(block_size)
        self.blocks = blocks
        self.tree = RadixCache(block_size, token_granular=token_granular)

    def is_cached(self, block_id: int) -> bool:
        return self.tree.is_cached(block_id)

    def match(self, token_ids: Sequence[int], uncomputed: set[int]) -> PrefixMatch:
        num_full = (len(token_ids) - 1) // self.block_size
        if self.tree.token_granular:
            hits, partial, num_partial = self.tree.match_tokens(token_ids, len(token_ids) - 1,
                                                                uncomputed)
            return PrefixMatch(hits, num_full, partial, num_partial)
        return PrefixMatch(self.tree.match(token_ids, num_full), num_full)

    def acquire(self, request_id: str, block_ids: Sequence[int], step: int) -> None:
        self.tree.acquire(request_id, block_ids, step)

    def register(self, req: Request, num_tokens: int, step: int) -> list[Swap]:
        """Blocks the step has yet to compute are only added where the tree lacks them: a swap
        then would point two requests' writes at one block in one forward."""
        P, table = self.block_size, req.block_table
        num_cached = len(self.tree.block_node)
        swaps = self.tree.insert(req.request_id, req.token_ids, table,
                                 min(num_tokens // P, len(table)), step,
                                 num_computed=req.num_computed_tokens // P)
        if swaps or len(self.tree.block_node) != num_cached:
            self.version += 1
        return swaps

    def evict(self, head: int) -> int:
        return self.tree.evict()  # no plain free block is left: trim the LRU leaf

    def release(self, req: Request, step: int) -> None:
        if self.tree.token_granular:
            self._keep_partial_block(req, step)
        self.tree.release(req.request_id, step)

    def _keep_partial_block(self, req: Request, step: int) -> None:
        """Leave req's partly computed last block in the tree, if nobody else has it."""
        P, n = self.block_size, req.num_computed_tokens
        held = self.tree.holders.get(req.request_id)
        index = n // P
        if n % P == 0 or index >= len(req.block_table) or (held.end if held else 0) != index:
            return  # nothing partial computed, or the path held stops short of it
        block_id = req.block_table[index]
        if self.blocks[block_id].ref_count == 1 and not self.tree.is_cached(block_id) and \
                self.tree.insert_partial(req.request_id, req.token_ids, block_id, n % P, step):
            self.version += 1

    def take_dropped(self) -> list[int]:
        dropped, self.tree.dropped = self.tree.dropped, []
        return dropped

    def cache_nodes(self) -> tuple[CacheNode, ...]:
        return self.tree.cache_nodes()

    def holders(self, running: Sequence[Request], node_ids: set[int]) -> dict[str, tuple[int, ...]]:
        return {r.request_id: tuple(n.node_id for n in self.tree.held_path(r.request_id))
                for r in running}
