"""vLLM's automatic prefix caching: full blocks found again by a hash chained over the prefix.

A full block is registered under the hash of its tokens chained with the hash of the block
before it, so one dict lookup per block walks a prompt's prefix and equal hashes mean equal
prefixes, not just equal blocks. Nothing is held beyond the blocks' own reference counts: a
cached block nobody holds waits in the pool's free list, least recently freed first like any
other, and gives up its contents when its turn comes to be reused.

The chain lives in the pool's Block records (hash, parent_hash, token_ids), which the block
manager clears when it hands a block out for other tokens; this index maps hash -> block id.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from minillm.prefix_cache.base import PrefixCache, PrefixMatch, Swap
from minillm.trace import CacheNode

if TYPE_CHECKING:
    from minillm.kv_cache import Block
    from minillm.request import Request


def chain_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """A block's tokens hashed with its parent's hash (SHA-256: no practical collisions)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


class HashChainCache(PrefixCache):
    """The hash chain over a pool's blocks: table maps a chain hash to the block registered
    under it."""

    design = "hash"
    plain_blocks_first = False  # the free list stays in the order blocks were freed

    def __init__(self, blocks: list[Block], block_size: int):
        super().__init__(block_size)
        self.blocks = blocks
        self.table: dict[bytes, int] = {}
        self._node_memo: dict[int, CacheNode] = {}  # block id -> its last snapshot node

    def is_cached(self, block_id: int) -> bool:
        # A block computed alongside an identical one keeps its hash (the blocks after it chain
        # on it) but only the copy registered first is in the table: only that one can be found.
        block_hash = self.blocks[block_id].hash
        return block_hash is not None and self.table.get(block_hash) == block_id

    def match(self, token_ids: Sequence[int], uncomputed: set[int]) -> PrefixMatch:
        P = self.block_size
        num_full = (len(token_ids) - 1) // P
        parent, hits = b"", []
        for i in range(num_full):
            tokens = tuple(token_ids[i * P:(i + 1) * P])
            parent = chain_hash(parent, tokens)
            block_id = self.table.get(parent)
            # The token check guards the block's own contents against any hash collision.
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return PrefixMatch(hits, num_full)

    def register(self, req: Request, num_tokens: int, step: int) -> list[Swap]:
        P, table = self.block_size, req.block_table
        num_full = min(num_tokens // P, len(table))
        first = num_full
        while first > 0 and self.blocks[table[first - 1]].hash is None:
            first -= 1  # full blocks get hashed in order, so the unhashed ones are a suffix
        parent = self.blocks[table[first - 1]].hash if first > 0 else b""
        for i in range(first, num_full):
            self.version += 1
            block = self.blocks[table[i]]
            block.token_ids = tuple(req.token_ids[i * P:(i + 1) * P])
            block.parent_hash, block.last_used = parent, step
            block.hash = parent = chain_hash(parent, block.token_ids)
            # Two requests may compute the same block at once; the first one registered stays.
            self.table.setdefault(block.hash, block.block_id)
        return []  # a duplicate stays its request's own: swapping a block mid-step is unsafe

    def evict(self, head: int) -> int:
        """The least recently freed block is the one to go (the free list's order is the LRU)."""
        del self.table[self.blocks[head].hash]  # type: ignore[arg-type]
        return head

    def cache_nodes(self) -> tuple[CacheNode, ...]:
        """One node per registered block reachable from the start of a prompt, parents first.

        A block whose chain lost an earlier block to eviction can no longer be matched, so it
        is left out, though its block still counts as cached free until it is reused."""
        children: dict[bytes, list[int]] = {}
        for block_id in self.table.values():
            children.setdefault(self.blocks[block_id].parent_hash, []).append(block_id)
        nodes, stack, memo = [], [(b"", None)], self._node_memo
        while stack:
            parent_hash, parent_id = stack.pop()
            for block_id in children.get(parent_hash, []):
                block, node = self.blocks[block_id], memo.get(block_id)
                # Most nodes are as they were: reuse them (building a frozen one costs ~3 us).
                if node is None or (node.parent, node.ref_count, node.last_used) != (
                        parent_id, block.ref_count, block.last_used):
                    node = memo[block_id] = CacheNode(block_id, parent_id, (block_id,),
                                                      self.block_size, block.ref_count,
                                                      block.last_used)
                nodes.append(node)
                stack.append((block.hash, block_id))
        if len(memo) > 2 * len(nodes) + 64:  # forget evicted blocks' nodes now and then
            self._node_memo = {n.node_id: n for n in nodes}
        return tuple(nodes)

    def holders(self, running: Sequence[Request], node_ids: set[int]) -> dict[str, tuple[int, ...]]:
        return {r.request_id: tuple(b for b in r.block_table if b in node_ids) for r in running}
