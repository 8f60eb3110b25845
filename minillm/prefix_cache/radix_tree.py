"""The radix tree under the radix prefix cache: its nodes, the walk that matches a prefix, splits.

Every cached prefix is a path from the root. A node holds a run of full blocks and the tokens in
them (P tokens a block); a node's children start with different blocks, so one dict lookup on a
block's tokens picks the next edge. The tree is compressed: a run grows in place while one
request extends it alone, and splits at a block boundary when a match or an insert ends inside it.

RadixTree is that structure and what reads it: the match walk, a node's path to the root, a
split, and the nodes as the trace records them. What the tree holds and for whom (inserts,
reference counts, eviction) is the cache's policy: minillm.prefix_cache.radix.RadixCache, a
RadixTree.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from minillm.trace import CacheNode

BlockKey = tuple[int, ...]  # the P token ids of one block: the key of the edge it starts


@dataclass(eq=False)
class RadixNode:
    """A run of full blocks after its parent's; `end` counts the blocks from the root to its end."""

    node_id: int
    parent: RadixNode | None
    token_ids: BlockKey  # P * len(block_ids) tokens
    block_ids: list[int]
    end: int
    children: dict[BlockKey, RadixNode] = field(default_factory=dict)
    ref_count: int = 0  # running requests whose path goes through this node
    last_used: int = 0  # the engine step that last matched, inserted or released it
    tick: int = 0  # the same, as a strict order within a step (LRU ties)
    heap_entry: int | None = None  # the id of its current entry in the eviction heap
    alive: bool = True

    @property
    def start(self) -> int:
        """Blocks from the root to the start of this node."""
        return self.end - len(self.block_ids)


class RadixTree:
    """A compressed radix tree of KV block runs keyed by their tokens, and lookups in it."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._node_ids = itertools.count()
        self.root = RadixNode(next(self._node_ids), parent=None, token_ids=(), block_ids=[], end=0)
        self.block_node: dict[int, RadixNode] = {}  # cached block id -> the node holding it
        self._snapshot_memo: dict[int, CacheNode] = {}  # node id -> its last CacheNode

    def is_cached(self, block_id: int) -> bool:
        return block_id in self.block_node

    def match(self, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """The cached blocks that hold the first tokens of token_ids, at most max_blocks of them.

        Walks one edge per node and compares block by block, so it costs O(matched tokens); the
        tree is left untouched (a match is only a question until BlockManager.allocate)."""
        P, node, hits = self.block_size, self.root, []
        while len(hits) < max_blocks:
            i = len(hits)
            child = node.children.get(tuple(token_ids[i * P:(i + 1) * P]))
            if child is None:
                break
            k = self._num_equal_blocks(child, token_ids, i, max_blocks)
            hits.extend(child.block_ids[:k])
            if k < len(child.block_ids):
                break
            node = child
        return hits

    # ---- what the widgets and tests read ------------------------------------------------------

    def nodes(self) -> list[RadixNode]:
        """Every node but the root, parents before children (depth first)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def cache_nodes(self) -> tuple[CacheNode, ...]:
        """The tree as minillm.trace.CacheNode records, for StepRecord.prefix_cache."""
        out, memo = [], self._snapshot_memo
        for n in self.nodes():
            parent = None if n.parent is self.root or n.parent is None else n.parent.node_id
            old = memo.get(n.node_id)
            # A run only grows or splits (then its length changes): reuse unchanged records.
            if old is None or (old.parent, old.ref_count, old.last_used, len(old.block_ids)) != (
                    parent, n.ref_count, n.last_used, len(n.block_ids)):
                old = memo[n.node_id] = CacheNode(n.node_id, parent, tuple(n.block_ids),
                                                  len(n.token_ids), n.ref_count, n.last_used)
            out.append(old)
        if len(memo) > 2 * len(out) + 64:  # forget evicted nodes now and then
            self._snapshot_memo = {c.node_id: c for c in out}
        return tuple(out)

    # ---- helpers -----------------------------------------------------------------------------

    def _path(self, node: RadixNode) -> list[RadixNode]:
        """node and its ancestors up to (not including) the root, deepest first."""
        path = []
        while node is not self.root:
            path.append(node)
            assert node.parent is not None
            node = node.parent
        return path

    def _num_equal_blocks(self, node: RadixNode, token_ids: Sequence[int], start: int,
                          limit: int) -> int:
        """How many of node's blocks equal token_ids' blocks from block start on (limit: the
        last block index + 1 to compare). The first one is known equal: it is the edge's key."""
        P, k = self.block_size, 1
        while k < len(node.block_ids) and start + k < limit and (
                node.token_ids[k * P:(k + 1) * P]
                == tuple(token_ids[(start + k) * P:(start + k + 1) * P])):
            k += 1
        return k

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut node after its first k blocks; return the upper part, which keeps node_id.

        Whoever held node holds both parts, so both keep its count; the lower part keeps the
        object (requests' holders and heap entries point at it) and takes a new id."""
        P, parent = self.block_size, node.parent
        assert parent is not None and 0 < k < len(node.block_ids)
        upper = RadixNode(node.node_id, parent, node.token_ids[:k * P], node.block_ids[:k],
                          end=node.start + k, ref_count=node.ref_count,
                          last_used=node.last_used, tick=node.tick)
        parent.children[upper.token_ids[:P]] = upper
        node.node_id, node.parent = next(self._node_ids), upper
        node.token_ids, node.block_ids = node.token_ids[k * P:], node.block_ids[k:]
        upper.children[node.token_ids[:P]] = node
        for b in upper.block_ids:
            self.block_node[b] = upper
        return upper
