"""The trace's view of the prefix cache, rebuilt only when something it shows has changed.

A traced step records the cache as minillm.trace.PrefixCacheSnapshot: its nodes and the running
requests that hold them. Building the nodes costs O(cached blocks), and a decode step usually
changes none, so the last build is kept until the block manager marks it stale (a match, a
free, an eviction: they move ref counts and last-used steps) or the cache's own version moves
on. A traced step then costs O(running requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from minillm.prefix_cache.base import PrefixCache
from minillm.trace import CacheNode, PrefixCacheSnapshot

if TYPE_CHECKING:
    from minillm.request import Request


class SnapshotView:
    """PrefixCacheSnapshots of one cache, its nodes reused while nothing they show changed."""

    def __init__(self, cache: PrefixCache):
        self.cache = cache
        self._nodes: tuple[CacheNode, ...] | None = None
        self._version = -1  # the cache's version when _nodes were built
        self._node_ids: set[int] = set()

    def stale(self) -> None:
        """Something the nodes show has changed: the next snapshot builds them again."""
        self._nodes = None

    def snapshot(self, running: Sequence[Request], evicted: Sequence[int] = ()
                 ) -> PrefixCacheSnapshot:
        cache = self.cache
        if self._nodes is None or self._version != cache.version:
            self._nodes, self._version = cache.cache_nodes(), cache.version
            self._node_ids = {n.node_id for n in self._nodes}
        return PrefixCacheSnapshot(cache.design, self._nodes,
                                   cache.holders(running, self._node_ids), tuple(evicted))
