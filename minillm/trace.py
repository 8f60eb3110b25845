"""The step-by-step record of what the engine did, which the widgets replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the scheduler imports this module
    from minillm.request import SchedulerOutput
    from minillm.scheduler import Scheduler


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

    design: "hash", "radix" or "none" (prefix caching off). nodes: every cached node, parents
    before children. holders: each running request's id -> the node_ids its prompt matched or
    inserted. evicted: block ids whose cached contents this step threw away to make room.
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

    Preemption by swap: swapped_out and swapped_in name the requests whose K/V this step copied
    to and from the host pool (swapped_out is a part of preempted), swap_out_blocks and
    swap_in_blocks count the blocks copied, and swapped names every request whose K/V are in
    the host pool after the step. num_waiting counts the requests left waiting after the
    step's admissions and waiting_cause says what stopped admission (minillm.scheduler):
    "seats", "blocks", "budget" or "batch" (a static batch still running); None if none wait.

    Speculative decoding: num_draft_tokens counts the tokens proposed and checked in the step
    (a decode entry's num_tokens is 1 + its proposals), num_accepted_tokens those accepted.
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
    swapped_out: list[str] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swapped: list[str] = field(default_factory=list)
    num_waiting: int = 0
    waiting_cause: str | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.scheduled)

    @property
    def duration(self) -> float:
        return self.end - self.start


def step_record(step: int, out: SchedulerOutput, start: float, end: float,
                tables: dict[str, list[int]], finished: list[str], scheduler: Scheduler,
                trace_blocks: bool, snapshot_cache: bool | None = None) -> StepRecord:
    """The StepRecord of one step, as the engine and the simulator write it: O(scheduled and
    swapped requests), plus the pool's block data when trace_blocks (tables come filled then)
    and the prefix cache's snapshot when snapshot_cache (default: trace_blocks)."""
    bm = scheduler.block_manager
    evicted = bm.take_evicted()  # taken every step, traced or not, so it never piles up
    return StepRecord(
        step=step, start=start, end=end,
        scheduled=[ScheduledEntry(s.request.request_id, s.phase, s.num_tokens,
                                  s.num_computed_tokens) for s in out.scheduled],
        num_free_blocks=bm.num_free_blocks, block_tables=tables,
        preempted=[r.request_id for r in out.preempted], finished=finished,
        cached_blocks=bm.cached_free_blocks() if trace_blocks else [],
        prefix_cache=bm.snapshot(scheduler.running, evicted)
        if (trace_blocks if snapshot_cache is None else snapshot_cache)
        and bm.enable_prefix_caching else None,
        swapped_out=[r.request_id for r in out.swapped_out],
        swapped_in=[r.request_id for r in out.swapped_in],
        swap_out_blocks=len(out.swap_out), swap_in_blocks=len(out.swap_in),
        swapped=[r.request_id for r in scheduler.waiting if r.swap_blocks]
        if scheduler.swap_space.num_blocks else [],
        num_waiting=len(scheduler.waiting), waiting_cause=out.waiting_cause,
        num_draft_tokens=out.num_draft_tokens, num_accepted_tokens=out.num_accepted_tokens)
