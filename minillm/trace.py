"""The step-by-step record of what the engine did, which the widgets replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class CacheNode:
    """One node of the prefix cache as a step left it (PrefixCacheSnapshot.nodes).

    node_id is stable while the node lives (hash chain: the id of its one block; radix tree: a
    counter, kept across splits by the part nearer the root). parent is the node_id of the node
    before it in the prefix, None under the root. block_ids are the physical KV blocks it covers,
    in order (one for the hash chain; a run for the radix tree), num_tokens the tokens they hold.
    ref_count: running requests that hold it (0: it may be evicted). last_used: the engine step
    that last matched or inserted it.
    """

    node_id: int
    parent: int | None
    block_ids: tuple[int, ...]
    num_tokens: int
    ref_count: int
    last_used: int


@dataclass(frozen=True)
class PrefixCacheSnapshot:
    """The prefix cache after one step (StepRecord.prefix_cache), for the widgets to replay.

    design: "hash" or "radix". nodes: every cached node, parents before children. holders: each
    running request's id -> the node_ids its prompt matched or inserted. evicted: block ids whose
    cached contents this step threw away to make room.
    """

    design: str
    nodes: tuple[CacheNode, ...]
    holders: dict[str, tuple[int, ...]]
    evicted: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScheduledEntry:
    """One request's part of a step: num_tokens new tokens after num_computed_tokens cached."""

    request_id: str
    phase: Literal["prefill", "decode"]
    num_tokens: int
    num_computed_tokens: int


@dataclass(frozen=True)
class StepRecord:
    """One engine step. start and end are seconds on the engine's clock.

    block_tables maps each scheduled request to its physical KV blocks during the step (a block
    listed under two requests is shared); num_free_blocks counts the pool's free blocks after
    the step (finished requests returned); cached_blocks lists the free blocks that still hold
    a cached prefix (reusable until evicted); preempted and finished name the requests that
    were preempted by, or finished in, this step. block_tables and cached_blocks stay empty when
    the engine does not trace block data (EngineConfig.trace_block_tables: by default, pools
    over TRACE_BLOCKS_MAX_POOL blocks), so that a step costs the same whatever the pool's size.
    """

    step: int
    start: float
    end: float
    scheduled: list[ScheduledEntry]
    num_free_blocks: int
    block_tables: dict[str, list[int]]
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cached_blocks: list[int] = field(default_factory=list)
    prefix_cache: PrefixCacheSnapshot | None = None  # with prefix caching and block data traced

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.scheduled)

    @property
    def duration(self) -> float:
        return self.end - self.start
