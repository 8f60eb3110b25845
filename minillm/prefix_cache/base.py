"""What BlockManager asks of a prefix cache, whichever design keeps it.

BlockManager owns the pool: the blocks, their reference counts and the free list. A prefix cache
owns only the index that finds computed blocks again. The block manager talks to it at six
moments of a request's life, and never asks which design it is talking to:

- admission: match(token_ids) finds the cached blocks that hold a prompt's first tokens, and
  acquire(...) tells the cache that a request now holds them;
- scheduling: register(req, num_tokens) indexes the blocks a step is about to fill; where the
  cache already holds the same tokens in another block it may ask for a swap;
- reuse: when the free block the pool would hand out next still holds a cached prefix,
  evict(head) picks which cached block gives its contents up instead;
- finish: release(req) lets go of what the request held;
- tracing: cache_nodes() and holders(...) describe the index for PrefixCacheSnapshot.

The two designs differ in their eviction order, which the free list must respect:
plain_blocks_first says that a block freed without a cached prefix goes to the front of the free
list (radix: every plain block is used before any cached one) rather than to the back in the
order blocks were freed (hash: least recently freed first, cached or not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minillm.request import Request
    from minillm.trace import CacheNode

Swap = tuple[int, int]  # (index in the request's block table, the cache's block to use there)


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks that cover the start of a prompt, and how many full blocks were looked up.

    Token-granular radix only: partial_block shares the next num_partial_tokens tokens, which
    are reused by copying it (BlockManager.allocate)."""

    block_ids: list[int]
    num_queried: int
    partial_block: int | None = None
    num_partial_tokens: int = 0

    def num_tokens(self, block_size: int) -> int:
        """Prompt tokens whose K/V the match reuses."""
        return len(self.block_ids) * block_size + self.num_partial_tokens


class PrefixCache:
    """The interface, and the cache of a pool with prefix caching off: it never holds a block.

    design names it in PrefixCacheSnapshot ("hash" or "radix"). version changes whenever the
    index changes on its own (a registration, a swap), so that a snapshot of it can be reused
    until then; BlockManager notes the changes it makes itself (matches, frees, evictions)."""

    design = "none"
    plain_blocks_first = False

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.version = 0

    def is_cached(self, block_id: int) -> bool:
        """Whether the block holds K/V the cache may hand out again."""
        return False

    def match(self, token_ids: Sequence[int], uncomputed: set[int]) -> PrefixMatch:
        """The cached blocks equal to the start of token_ids, leaving out at least its last
        token (a step must compute it to sample from its logits). uncomputed: blocks registered
        this step whose K/V are not written yet, which must never be copied."""
        return PrefixMatch([], 0)

    def acquire(self, request_id: str, block_ids: Sequence[int], step: int) -> None:
        """The request now holds block_ids, the blocks match returned for it."""

    def register(self, req: Request, num_tokens: int, step: int) -> list[Swap]:
        """Index req's blocks that are full once its first num_tokens tokens have K/V; return the
        swaps that point req's table at blocks the cache already held with the same tokens."""
        return []

    def evict(self, head: int) -> int:
        """A cached, unheld block whose contents go so that the pool can reuse a block; head is
        the free list's first. The block manager moves the one returned to the front."""
        raise AssertionError("a pool without a prefix cache never holds a cached block")

    def release(self, req: Request, step: int) -> None:
        """req has finished or is preempted: it holds nothing any more."""

    def take_dropped(self) -> list[int]:
        """Blocks the cache let go of without an eviction: plain free blocks again."""
        return []

    def cache_nodes(self) -> tuple[CacheNode, ...]:
        """Every cached node, parents before children (PrefixCacheSnapshot.nodes)."""
        return ()

    def holders(self, running: Sequence[Request], node_ids: set[int]) -> dict[str, tuple[int, ...]]:
        """Each running request's id -> the ids of the nodes it holds (node_ids: all of them)."""
        return {r.request_id: () for r in running}
