"""Routers of a fleet of replicas (minillm.fleet): which replica serves an arriving request.

A router is any callable router(spec, replicas) -> replica index, where replicas are
ReplicaViews: what the fleet lets a router see of each replica when the request arrives (its
load, its free KV blocks, and how much of the request's prefix its cache holds).

- "round_robin" (RoundRobinRouter) cycles through the replicas, blind to the cache.
- "prefix_aware" (PrefixAwareRouter) is an oracle: it reads every replica's true cache, and
  with one step of lookahead (the fleet applies a step when it starts, so the blocks a replica
  is computing count as cached already). No real router can: its replicas' caches sit on other
  machines and change every step. It is the ceiling a cache-aware router can approach.
- "approximate_tree" (ApproximateTreeRouter) is the realistic one, after SGLang's router's
  cache_aware policy: it never reads a replica's cache. It keeps its own tree per replica of
  the prompts it sent there (RoutedPrefixTree, bounded, LRU) and routes on that, falling back to
  the least loaded replica when the loads drift apart. Its view is what it sent, including
  prefixes the replica has evicted since or never got to cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from minillm.sim.simulated_engine import Simulator
from minillm.workloads.streams import RequestSpec


class ReplicaView:
    """What a router sees of one replica when a request arrives (live: read it, never change it).

    index: the replica's position in the fleet. load: requests queued plus running.
    num_free_blocks: KV blocks nobody holds; num_empty_blocks: those that cache nothing either.
    cached_prefix_len(request): tokens at the start of the request whose K/V the replica's
    prefix cache holds, in whole blocks but under "radix-token" (BlockManager.match_prefix, which
    changes nothing).

    index and load are what a real router knows (it counts the requests it has in flight to
    each replica). The blocks and cached_prefix_len are the replica's true state as it will
    stand after the step in flight: only an oracle sees them (see PrefixAwareRouter).
    """

    def __init__(self, index: int, sim: Simulator):
        self.index = index
        self._sim = sim

    @property
    def num_waiting(self) -> int:
        return len(self._sim.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self._sim.scheduler.running)

    @property
    def load(self) -> int:
        return self.num_waiting + self.num_running

    @property
    def num_free_blocks(self) -> int:
        return self._sim.block_manager.num_free_blocks

    @property
    def num_empty_blocks(self) -> int:
        """Free blocks that hold no cached prefix: room to cache a new one without evicting."""
        bm = self._sim.block_manager
        return bm.num_free_blocks - bm.num_cached_free_blocks

    def cached_prefix_len(self, request: RequestSpec | Sequence[int]) -> int:
        """Tokens of request's prompt (a spec or its token ids) this replica's cache holds."""
        ids = (request.token_ids(self._sim.model.vocab_size)
               if isinstance(request, RequestSpec) else request)
        bm = self._sim.block_manager
        return bm.match_prefix(ids).num_tokens(bm.block_size)

    def __repr__(self) -> str:
        return f"ReplicaView({self.index}, load={self.load}, free blocks={self.num_free_blocks})"


Router = Callable[[RequestSpec, Sequence[ReplicaView]], int]
RoutingName = Literal["round_robin", "prefix_aware", "approximate_tree"]


class RoundRobinRouter:
    """Replica 0, 1, ..., N - 1, 0, ...: even spread, blind to the cache."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, spec: RequestSpec, replicas: Sequence[ReplicaView]) -> int:
        choice, self.next = self.next, (self.next + 1) % len(replicas)
        return choice


@dataclass(frozen=True)
class PrefixAwareRouter:
    """The longest cached prefix among the replicas that are not overloaded: an oracle.

    It reads every replica's true cache (ReplicaView.cached_prefix_len, num_empty_blocks) at
    the request's arrival, with one step of lookahead: the fleet applies a step when it starts,
    so blocks a replica is still computing already count as cached. No deployed router has
    that view; ApproximateTreeRouter is the realistic counterpart, and the gap between the two
    is what a router loses by guessing.

    A replica is eligible if its load is at most load_bound requests above the least loaded
    replica's. If an eligible replica holds a prefix of the request, the one holding the longest
    wins (then the less loaded, then the lower index). If none does, the request starts a new
    prefix somewhere: the eligible replica with the most empty blocks wins (then the less
    loaded, then the lower index), which is SGLang's "smallest tree" rule: it spreads new
    prefixes over the fleet instead of stacking them on whichever replica is idle first.
    The least loaded replica is always eligible, so a hot prefix spills onto it once its holder
    runs load_bound ahead. SGLang's router applies the same kind of bound
    (balance_abs_threshold, 32 requests by default): without it, a popular system prompt would
    queue all its traffic on one replica while the others idle.
    """

    # An eighth of the default max_num_seqs (64): the holder may queue a few requests more
    # than its peers, far fewer than it can run in one batch. SGLang's 32 is for larger batches.
    load_bound: float = 8

    def __post_init__(self) -> None:
        b = self.load_bound
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b >= 0:
            raise ValueError(f"load_bound must be a number of requests >= 0 (inf: no bound), "
                             f"got {b!r}")

    def __call__(self, spec: RequestSpec, replicas: Sequence[ReplicaView]) -> int:
        least = min(r.load for r in replicas)
        eligible = [r for r in replicas if r.load - least <= self.load_bound]
        matched = {r.index: r.cached_prefix_len(spec) for r in eligible}
        if max(matched.values()) > 0:
            best = max(eligible, key=lambda r: (matched[r.index], -r.load, -r.index))
        else:
            best = max(eligible, key=lambda r: (r.num_empty_blocks, -r.load, -r.index))
        return best.index


class RoutedPrefixTree:
    """A router's record of the prompts it sent one replica: a trie of whole blocks, LRU-bounded.

    Each node is one block of token ids (a tuple of block_size of them) below its parent, so a
    path from the root spells a prompt's first blocks. insert(blocks) adds a prompt's blocks and
    marks its path most recently used; match(blocks) counts the leading blocks the tree holds
    and changes nothing. When the tree holds more than max_blocks nodes, the least recently used
    leaf goes first, then the next, until it fits: the shape of SGLang's router tree, which
    evicts least recently used leaves per worker once a worker's share exceeds max_tree_size.
    Nothing here knows what the replica has cached: only what was sent to it.
    """

    def __init__(self, max_blocks: int):
        if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 1:
            raise ValueError(f"max_blocks must be an integer >= 1, got {max_blocks!r}")
        self.max_blocks = max_blocks
        self.root: dict[tuple[int, ...], dict] = {}  # block -> its children, recursively
        # Every node as (parent's children, block), least recently used first. A path is
        # touched from its deepest node up, so a node always sits before its parent: the
        # first entry is always a leaf, and eviction never strands a child.
        self._lru: OrderedDict[int, tuple[dict, tuple[int, ...]]] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self._lru)

    def match(self, blocks: Sequence[tuple[int, ...]]) -> int:
        """How many of blocks, from the first, lie on one path from the root."""
        children, n = self.root, 0
        for block in blocks:
            if block not in children:
                break
            children, n = children[block], n + 1
        return n

    def insert(self, blocks: Sequence[tuple[int, ...]]) -> None:
        """Add blocks as a path from the root, mark it most recently used, then evict to fit."""
        path, children = [], self.root
        for block in blocks:
            path.append((children, block))
            children = children.setdefault(block, {})
        for parent, block in reversed(path):  # deepest first: children stay ahead of parents
            key = id(parent[block])
            self._lru[key] = (parent, block)
            self._lru.move_to_end(key)
        while len(self._lru) > self.max_blocks:
            _, (parent, block) = self._lru.popitem(last=False)
            del parent[block]


class ApproximateTreeRouter:
    """Cache-aware routing from the router's own memory: SGLang's router's cache_aware policy.

    It never reads a replica's cache; it sees each replica's load (requests in flight) and
    remembers, per replica, the prompts it sent there (a RoutedPrefixTree of whole blocks of
    block_size tokens, at most max_tree_tokens per replica). For each request:

    1. If the loads are imbalanced (the most loaded replica runs more than
       balance_abs_threshold requests above the least loaded and more than
       balance_rel_threshold times it), the least loaded replica takes it.
    2. Otherwise the replica whose tree matches the longest prefix of the prompt takes it, if
       that match covers more than cache_threshold of the prompt (ties: less loaded, then lower
       index); if not, the replica with the smallest tree does (ties alike): room for a new
       prefix, as the oracle's "most empty blocks" rule but from the router's own record.
    3. The prompt is inserted into the chosen replica's tree, in either case.

    Its view is optimistic: a prompt counts as cached from the moment it is sent, even if the
    replica has not computed it yet, evicts it later, or never had room for it. SGLang's router
    (sgl-router, sglang-router 0.2.3: src/policies/cache_aware.rs and its tree) works the same
    way with defaults cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5
    and max_tree_size 2**26 characters per worker. Where minillm differs: the tree holds token
    blocks, not the prompt's characters; there is one tree per replica rather than one shared
    tree tagged by worker; eviction runs on each insert (SGLang's runs every
    eviction_interval_secs, 120 s, so its tree overshoots between passes); and recency is the
    order of requests, not wall time. balance_abs_threshold defaults to 8 here, the oracle's
    load_bound, for batches of 64 (max_num_seqs), not SGLang's 64; max_tree_tokens defaults to
    2**20, like SGLang's far more than any replica's pool, so the tree bounds the router's
    memory, not what a replica holds.
    """

    def __init__(self, block_size: int = 16, cache_threshold: float = 0.3,
                 balance_abs_threshold: float = 8, balance_rel_threshold: float = 1.5,
                 max_tree_tokens: int = 2**20):
        for name, value, low in (("block_size", block_size, 1),
                                 ("max_tree_tokens", max_tree_tokens, block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        for name, value, low, high in (("cache_threshold", cache_threshold, 0, 1),
                                       ("balance_abs_threshold", balance_abs_threshold, 0,
                                        math.inf),
                                       ("balance_rel_threshold", balance_rel_threshold, 1,
                                        math.inf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not low <= value <= high:
                raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
        self.block_size, self.cache_threshold = block_size, cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_tokens = max_tree_tokens
        self.trees: list[RoutedPrefixTree] = []  # one per replica, made at the first request

    def __call__(self, spec: RequestSpec, replicas: Sequence[ReplicaView]) -> int:
        ids = getattr(spec, "prompt_ids", ())
        if not ids:
            raise ValueError(f"ApproximateTreeRouter reads the prompt's token ids from "
                             f"spec.prompt_ids, and this spec has none: {spec!r}; route "
                             f"TokenRequestSpecs (the fleet draws them at arrival)")
        p = self.block_size
        blocks = [tuple(ids[i:i + p]) for i in range(0, len(ids) // p * p, p)]
        while len(self.trees) < len(replicas):
            self.trees.append(RoutedPrefixTree(self.max_tree_tokens // p))
        loads = [r.load for r in replicas]
        order = range(len(replicas))
        most, least = max(loads), min(loads)
        if most - least > self.balance_abs_threshold and \
                most > self.balance_rel_threshold * least:
            choice = min(order, key=lambda k: (loads[k], k))
        else:
            matched = [self.trees[k].match(blocks) for k in order]
            best = max(order, key=lambda k: (matched[k], -loads[k], -k))
            if matched[best] * p > self.cache_threshold * len(ids):
                choice = best
            else:
                choice = min(order, key=lambda k: (self.trees[k].num_blocks, loads[k], k))
        self.trees[choice].insert(blocks)
        return choice


def make_router(routing: RoutingName | Router, load_bound: float) -> Router:
    """The router a routing argument names (a fresh one: the approximate tree starts empty), or
    the callable itself. load_bound is PrefixAwareRouter's load_bound and
    ApproximateTreeRouter's balance_abs_threshold."""
    if routing == "round_robin":
        return RoundRobinRouter()
    if routing == "prefix_aware":
        return PrefixAwareRouter(load_bound)
    if routing == "approximate_tree":
        return ApproximateTreeRouter(balance_abs_threshold=load_bound)
    if callable(routing):
        return routing
    raise ValueError(f"routing must be 'round_robin', 'prefix_aware', 'approximate_tree' or a "
                     f"callable (spec, replicas) -> replica index, got {routing!r}")
