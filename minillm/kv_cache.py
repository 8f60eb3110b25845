"""The paged KV cache: the pool of fixed-size blocks, the block manager and the prefix cache.

Every layer's K and V live in one tensor of shape (L, 2, N, P, K, D): N blocks of P token slots.
A sequence owns a block table (its list of physical block ids); token t of the sequence sits in
slot block_table[t // P] * P + t % P. Blocks are reference counted so that sequences with the
same prefix can share them; with prefix caching, a full block is registered under a hash of its
tokens chained with the hash of the block before it, and stays reusable after its last owner
frees it until the pool needs the space (least recently freed goes first).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minillm.request import Request


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and its K/V are computed
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks that cover the start of a prompt, and how many full blocks were looked up."""

    block_ids: list[int]
    num_queried: int


def chain_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """A block's tokens hashed with its parent's hash (SHA-256: no practical collisions)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def allocate_kv_cache(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device | str,
) -> torch.Tensor:
    """The whole KV pool, zeroed so that padded slots never hold NaN: (L, 2, N, P, K, D)."""
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def kv_cache_block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
) -> int:
    """Bytes of one block across all layers, K and V: 2 * L * P * K * D * bytes."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes


class BlockManager:
    """Hands out KV blocks to requests, counts references and keeps the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks nobody holds, least recently freed first; cached ones among them stay findable.
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # The free blocks that still hold a registered prefix, in the same order, kept as blocks
        # come and go so that counting them never scans the pool (a GPU pool has ~10^5 blocks).
        self.cached_free: dict[int, None] = {}
        self.cached: dict[bytes, int] = {}  # chain hash -> block id
        self.prefix_cache_queries = 0  # full blocks looked up at admission
        self.prefix_cache_hits = 0  # of those, blocks found in the cache

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

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest run of cached blocks equal to the start of token_ids.

        At least one token is left out, since the step must compute it to sample from its logits.
        """
        if not self.enable_prefix_caching:
            return PrefixMatch([], 0)
        P = self.block_size
        num_full = (len(token_ids) - 1) // P
        parent, hits = b"", []
        for i in range(num_full):
            tokens = tuple(token_ids[i * P:(i + 1) * P])
            parent = chain_hash(parent, tokens)
            block_id = self.cached.get(parent)
            # The token check guards the block's own contents against any hash collision.
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return PrefixMatch(hits, num_full)

    def can_allocate(self, req: Request, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        """Whether req's block table can grow to hold num_tokens, reusing the prefix blocks."""
        needed = self.num_blocks_for(num_tokens) - len(req.block_table) - len(prefix)
        # A cached block that nobody holds sits in the free list: reusing it uses up a free slot.
        idle = sum(1 for b in prefix if self.blocks[b].ref_count == 0) if prefix else 0
        return max(needed, 0) + idle <= len(self.free_blocks)

    def allocate(self, req: Request, num_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Grow req's block table to hold num_tokens; False (and no change) if the pool is short."""
        prefix = match.block_ids if match else []
        if not self.can_allocate(req, num_tokens, prefix):
            return False
        if match is not None:
            self.prefix_cache_queries += match.num_queried
            self.prefix_cache_hits += len(prefix)
        for block_id in prefix:
            self.blocks[block_id].ref_count += 1
            self.free_blocks.pop(block_id, None)
            self.cached_free.pop(block_id, None)
            req.block_table.append(block_id)
        for _ in range(self.num_blocks_for(num_tokens) - len(req.block_table)):
            req.block_table.append(self._take_free_block())
        return True

    def free(self, req: Request) -> None:
        """Release req's blocks. The last blocks go to the free list first, so a shared prefix
        outlives the tails that are less likely to be asked for again."""
        for block_id in reversed(req.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
                if block.hash is not None:  # only full, computed blocks carry a hash
                    self.cached_free[block_id] = None
        req.block_table = []

    def cache_full_blocks(self, req: Request) -> None:
        """Register req's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        P, table = self.block_size, req.block_table
        num_full = min(req.num_computed_tokens // P, len(table))
        first = num_full
        while first > 0 and self.blocks[table[first - 1]].hash is None:
            first -= 1  # full blocks get hashed in order, so the unhashed ones are a suffix
        parent = self.blocks[table[first - 1]].hash if first > 0 else b""
        for i in range(first, num_full):
            block = self.blocks[table[i]]
            block.token_ids = tuple(req.token_ids[i * P:(i + 1) * P])
            block.hash = parent = chain_hash(parent, block.token_ids)
            # Two requests may compute the same block at once; the first one registered stays.
            self.cached.setdefault(block.hash, block.block_id)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict: the block is about to hold other tokens
            del self.cached_free[block_id]
            if self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id
