"""The radix-tree prefix cache (SGLang's RadixAttention), over runs of whole KV blocks.

Every cached prefix is a path from the root of a compressed radix tree of block runs keyed by
their tokens (minillm.prefix_cache.radix_tree.RadixTree: the nodes, the match walk, splits).
RadixCache is the cache kept in that tree: what goes in (insert, growing a run in place while
one request extends it alone), who holds what, and what is evicted.

Reference counts say which nodes running requests hold. A request holds a whole path from the
root (the blocks at the start of its block table), so a node's count is at least its children's,
and a node nobody holds has a subtree nobody holds. Eviction takes the least recently used leaf
that nobody holds, a block at a time from its end, never an inner node: its children would
become unreachable. Leaves become evictable one at a time, so a heap of them (stale entries
skipped) finds the next victim in O(log n) and nothing ever scans the tree.

The tree stores block ids only; minillm.kv_cache.BlockManager keeps the pool, the free list and
the blocks' own reference counts, which equal their nodes' counts.

Token-granular mode (token_granular=True, prefix_caching="radix-token") is SGLang's default
behaviour with a page size of 1, kept over blocks: a match may end inside a block, and the
tokens it shares there are reused too. Such a block is never shared (the new request will write
the rest of it): BlockManager copies it into a fresh block of the request's own (copy on
write) and the request starts computing at the first token that differs. A finished request's
last, partly filled block also stays in the tree, as a leaf of fewer than P tokens that only
copies are ever taken from, so the next turn of a chat reuses its whole history.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from minillm.prefix_cache.radix_tree import BlockKey, RadixNode, RadixTree


class RadixCache(RadixTree):
    """A radix tree of cached KV blocks with per-node reference counts and LRU leaf eviction."""

    def __init__(self, block_size: int, token_granular: bool = False):
        super().__init__(block_size)
        self.token_granular = token_granular
        self.holders: dict[str, RadixNode] = {}  # request id -> the deepest node it holds
        self._ticks = itertools.count(1)
        self._entries = itertools.count()
        self._heap: list[tuple[int, int, RadixNode]] = []  # (tick, entry id, leaf)
        # Partial leaves made redundant by a longer copy of their tokens: their blocks leave
        # the tree and go back to the pool as plain free blocks (BlockManager takes them).
        self.dropped: list[int] = []

    # ---- token-granular match, acquire, insert, release --------------------------------------

    def match_tokens(self, token_ids: Sequence[int], max_tokens: int,
                     exclude: set[int] | frozenset[int] = frozenset()
                     ) -> tuple[list[int], int | None, int]:
        """Token-granular match: the whole cached blocks that hold the first tokens of
        token_ids, then the block that shares the most of the next tokens with it (its id and
        how many, at least 1, or None and 0), at most max_tokens tokens in all. exclude: blocks
        whose K/V are not computed yet (scheduled this step): a copy of them would copy garbage.
        """
        P = self.block_size
        hits = self.match(token_ids, max_tokens // P)
        i = len(hits)
        if hits:
            node = self.block_node[hits[-1]]
            k = i - node.start  # blocks of node matched
            candidates = ([(node.block_ids[k], node.token_ids[k * P:(k + 1) * P])]
                          if k < len(node.block_ids) else
                          [(c.block_ids[0], c.token_ids[:P]) for c in node.children.values()])
        else:
            candidates = [(c.block_ids[0], c.token_ids[:P]) for c in self.root.children.values()]
        want = token_ids[i * P:min(max_tokens, (i + 1) * P)]
        best, best_len = None, 0
        for block_id, tokens in candidates:
            n = 0
            while n < len(want) and n < len(tokens) and tokens[n] == want[n]:
                n += 1
            if n > best_len and block_id not in exclude:
                best, best_len = block_id, n
        return hits, best, best_len

    def insert_partial(self, request_id: str, token_ids: Sequence[int], block_id: int,
                       num_tokens: int, step: int) -> bool:
        """Keep the first num_tokens (< P) tokens of the block after the path request_id holds
        as a partial leaf that nobody holds, for later matches to copy (token-granular mode).

        Not kept if a child there already starts with those tokens (a longer copy covers it);
        a shorter partial leaf that it covers leaves the tree (its block goes to self.dropped).
        Returns whether the block entered the tree."""
        P = self.block_size
        node = self.holders.get(request_id, self.root)
        start = node.end * P
        key = tuple(token_ids[start:start + num_tokens])
        assert 0 < num_tokens < P and len(key) == num_tokens
        for child in list(node.children.values()):
            if child.token_ids[:num_tokens] == key:
                return False  # a child holds these tokens and more: nothing new to keep
            if len(child.token_ids) < P and key[:len(child.token_ids)] == child.token_ids:
                self._drop(child)  # a shorter partial copy of the same start: replaced
        leaf = RadixNode(next(self._node_ids), node, key, [block_id], end=node.end + 1)
        node.children[key] = leaf
        self.block_node[block_id] = leaf
        self._touch(leaf, step)
        self._push(leaf)
        return True

    def _drop(self, leaf: RadixNode) -> None:
        """Take an unheld partial leaf out of the tree; its block goes to self.dropped."""
        assert leaf.parent is not None and not leaf.children and leaf.ref_count == 0
        del leaf.parent.children[leaf.token_ids[:self.block_size]]
        leaf.alive = False
        for b in leaf.block_ids:
            del self.block_node[b]
            self.dropped.append(b)

    def _drop_covered_partials(self, node: RadixNode, block_tokens: BlockKey) -> None:
        """A full block of block_tokens now follows node: partial leaves under node that hold
        a start of it are redundant (a copy of the full block reuses as much)."""
        for child in list(node.children.values()):
            if len(child.token_ids) < self.block_size and \
                    block_tokens[:len(child.token_ids)] == child.token_ids:
                self._drop(child)

    def acquire(self, request_id: str, block_ids: Sequence[int], step: int) -> None:
        """Make request_id hold the matched path that ends with block_ids[-1] (its table's start).

        A match that ends inside a node splits it, so that a request holds whole nodes."""
        if request_id in self.holders:
            raise ValueError(f"request {request_id!r} already holds a path in the radix tree; "
                             "free it before admitting it again")
        node = self.block_node[block_ids[-1]]
        num_in_node = len(block_ids) - node.start
        if num_in_node < len(node.block_ids):
            node = self._split(node, num_in_node)
        self.holders[request_id] = node
        for n in self._path(node):
            n.ref_count += 1
            self._touch(n, step)

    def insert(self, request_id: str, token_ids: Sequence[int], block_table: list[int],
               num_full: int, step: int, num_computed: int | None = None
               ) -> list[tuple[int, int]]:
        """Cache the request's first num_full blocks beyond the path it holds; the first
        num_computed of them (default all) hold computed K/V, the rest the step is about to
        compute (the scheduler registers a block when it schedules it, so that a request admitted
        later in the same step finds it).

        Returns (table index, tree block) pairs where the tree already held those tokens in
        another block, for BlockManager to swap in: two copies of the same KV would waste a
        block. Only computed blocks are swapped: an uncomputed block whose tokens the tree holds
        stays the request's own and uncached, so that no two requests write one block in one
        step. The request then holds the path to its last cached block."""
        P = self.block_size
        num_computed = num_full if num_computed is None else min(num_computed, num_full)
        node = self.holders.get(request_id, self.root)
        i, swaps = node.end, []
        while i < num_computed:  # walk down the edges that already hold the next blocks
            child = node.children.get(tuple(token_ids[i * P:(i + 1) * P]))
            if child is None:
                break
            k = self._num_equal_blocks(child, token_ids, i, num_computed)
            if k < len(child.block_ids):
                child = self._split(child, k)
            child.ref_count += 1
            self._touch(child, step)
            swaps.extend((i + j, b) for j, b in enumerate(child.block_ids))
            node, i = child, i + k
        if i < num_full and tuple(token_ids[i * P:(i + 1) * P]) not in node.children:
            new_blocks = block_table[i:num_full]
            new_tokens = tuple(token_ids[i * P:num_full * P])
            if self.token_granular:
                self._drop_covered_partials(node, new_tokens[:P])
            if node is not self.root and not node.children and node.ref_count == 1:
                # Only this request holds the leaf: its run grows in place (stays compressed).
                node.token_ids += new_tokens
                node.block_ids.extend(new_blocks)
                node.end = num_full
            else:
                child = RadixNode(next(self._node_ids), node, new_tokens, list(new_blocks),
                                  end=num_full, ref_count=1)
                node.children[new_tokens[:P]] = child
                node = child
            for b in new_blocks:
                self.block_node[b] = node
            self._touch(node, step)
        if node is not self.root:
            self.holders[request_id] = node
        return swaps

    def release(self, request_id: str, step: int) -> None:
        """request_id no longer holds its path; the nodes nobody else holds become evictable."""
        node = self.holders.pop(request_id, None)
        for n in self._path(node) if node is not None else []:
            n.ref_count -= 1
            self._touch(n, step)  # a node is in use while held: its release is its last use
            if n.ref_count == 0 and not n.children:
                self._push(n)

    # ---- eviction ----------------------------------------------------------------------------

    def evict(self) -> int:
        """Free one block: the last block of the least recently used leaf that nobody holds.

        A leaf shrinks from its end (its deepest, least shared block goes first) and leaves the
        tree when it is empty, after which its parent may be an evictable leaf. Raises
        RuntimeError if no leaf is evictable: the caller asks only when a cached block is free,
        and then a leaf of the unheld subtree holding it is."""
        while self._heap:
            _, entry, node = heapq.heappop(self._heap)
            if entry != node.heap_entry or not self.is_evictable(node):
                continue  # stale: the node was used, grew a child or went since it was pushed
            block_id = node.block_ids.pop()
            del self.block_node[block_id]
            if node.block_ids:  # still an unheld leaf, as recently used as before
                node.token_ids, node.end = node.token_ids[:-self.block_size], node.end - 1
                self._push(node)
                return block_id
            parent = node.parent
            assert parent is not None
            del parent.children[node.token_ids[:self.block_size]]
            node.alive = False
            if parent is not self.root and parent.ref_count == 0 and not parent.children:
                self._push(parent)
            return block_id
        raise RuntimeError("no radix-tree leaf can be evicted: every cached block is held")

    def is_evictable(self, node: RadixNode) -> bool:
        """A leaf that no running request holds."""
        return node.alive and node is not self.root and node.ref_count == 0 and not node.children

    # ---- what the widgets and tests read ------------------------------------------------------

    def held_path(self, request_id: str) -> list[RadixNode]:
        """The nodes request_id holds, from the root down."""
        node = self.holders.get(request_id)
        return [] if node is None else self._path(node)[::-1]

    # ---- helpers -----------------------------------------------------------------------------

    def _touch(self, node: RadixNode, step: int) -> None:
        node.last_used, node.tick = step, next(self._ticks)

    def _push(self, node: RadixNode) -> None:
        node.heap_entry = next(self._entries)
        heapq.heappush(self._heap, (node.tick, node.heap_entry, node))
        if len(self._heap) > 2 * len(self.block_node) + 64:
            # Drop stale entries now and then: the heap stays O(cached blocks), at O(1) per push.
            self._heap = [e for e in self._heap if e[1] == e[2].heap_entry and e[2].alive]
            heapq.heapify(self._heap)

