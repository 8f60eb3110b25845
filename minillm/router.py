"""Routers of a fleet of replicas (minillm.fleet): which replica serves an arriving request.

A router is any callable router(spec, replicas) -> replica index, where replicas are
ReplicaViews: what a load balancer can see of each replica when the request arrives (its load,
its free KV blocks, and how much of the request's prefix its cache holds). "round_robin" cycles
through the replicas, blind to the cache; "prefix_aware" sends a request where its prefix is
cached unless that would overload that replica (PrefixAwareRouter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from minillm.simulator import Simulator
from minillm.workload import RequestSpec


class ReplicaView:
    """What a router sees of one replica when a request arrives (live: read it, never change it).

    index: the replica's position in the fleet. load: requests queued plus running.
    num_free_blocks: KV blocks nobody holds; num_empty_blocks: those that cache nothing either.
    cached_prefix_len(request): tokens at the start of the request whose K/V the replica's
    prefix cache holds, in whole blocks (BlockManager.match_prefix, which changes nothing).
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
        return len(bm.match_prefix(ids).block_ids) * bm.block_size

    def __repr__(self) -> str:
        return f"ReplicaView({self.index}, load={self.load}, free blocks={self.num_free_blocks})"


Router = Callable[[RequestSpec, Sequence[ReplicaView]], int]
RoutingName = Literal["round_robin", "prefix_aware"]


class RoundRobinRouter:
    """Replica 0, 1, ..., N - 1, 0, ...: even spread, blind to the cache."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, spec: RequestSpec, replicas: Sequence[ReplicaView]) -> int:
        choice, self.next = self.next, (self.next + 1) % len(replicas)
        return choice


@dataclass(frozen=True)
class PrefixAwareRouter:
    """The longest cached prefix among the replicas that are not overloaded.

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


def make_router(routing: RoutingName | Router, load_bound: float) -> Router:
    """The router a routing argument names, or the callable itself."""
    if routing == "round_robin":
        return RoundRobinRouter()
    if routing == "prefix_aware":
        return PrefixAwareRouter(load_bound)
    if callable(routing):
        return routing
    raise ValueError(f"routing must be 'round_robin', 'prefix_aware' or a callable "
                     f"(spec, replicas) -> replica index, got {routing!r}")
