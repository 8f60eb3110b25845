"""The step-by-step record of what the engine did, which the widgets replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


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

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.scheduled)

    @property
    def duration(self) -> float:
        return self.end - self.start
