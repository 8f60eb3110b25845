"""The scheduler: each step, which requests run and how many tokens each computes.

Continuous batching (Orca's iteration-level scheduling): requests join and leave the batch at
every step. A step has a token budget (max_num_batched_tokens) and a seat count (max_num_seqs).

- With chunked prefill (Sarathi-Serve): running requests first, in the order they were admitted
  (decodes take one token each; an unfinished prompt takes a chunk of what is left), then new
  requests fill the rest of the budget with prompt chunks, so one step can mix decodes and
  prefill.
- Without it: whenever a waiting request fits, the step is a prefill step of whole prompts (the
  running decodes sit it out); otherwise it is a decode step.
- "static" scheduling admits a batch only when the previous one has completely finished.

Admission order (scheduling_policy): "fcfs" admits in arrival order. "lpm" (SGLang's
longest-prefix-match) admits first the waiting requests with the longest cached prefix, so that
requests sharing a prefix run while it is cached and fewer prefills are computed. Its risk is
starvation: a request that shares nothing can be passed over for as long as others keep coming.
So a request that LPM_MAX_OVERTAKES later arrivals have jumped goes first (FCFS among such
requests), and past LPM_MAX_WAITING waiting requests the queue is served FCFS, because sorting
it costs a prefix match per waiting request every step (SGLang's bound is 128 too). Preempted
requests keep their place at the front under both policies.

KV blocks are allocated a step at a time. When the pool runs dry, the newest running request is
preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
later from its prompt and the tokens it already produced.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.request import Request, RequestStatus

Phase = Literal["prefill", "decode"]

# LPM sorts at most this many waiting requests a step (one prefix match each); beyond, FCFS.
LPM_MAX_WAITING = 128
# A waiting request that this many later arrivals have overtaken is admitted in FCFS order.
# Counting overtakes, not steps, bounds exactly the delay LPM adds: a request that waits because
# the server is full is overtaken by nobody and loses nothing. 32 is a batch or two of a
# typical server: the extra wait is a few batches' prefill at most.
LPM_MAX_OVERTAKES = 32


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: num_tokens new tokens after num_computed_tokens."""

    request: Request
    num_tokens: int
    num_computed_tokens: int
    phase: Phase


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    def add(self, req: Request, num_tokens: int) -> None:
        phase: Phase = "prefill" if req.is_prefill else "decode"
        self.scheduled.append(ScheduledRequest(req, num_tokens, req.num_computed_tokens, phase))


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the newest is preempted first
        self.num_preemptions = 0
        # For LPM: each waiting request's arrival number and how often it was overtaken, and
        # the preempted requests, which keep their place at the front.
        self._arrivals = itertools.count()
        self._arrival: dict[Request, int] = {}
        self._overtaken: dict[Request, int] = {}
        self._resuming: set[Request] = set()
        self._in_arrival_order = True

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)
        self._arrival[req] = next(self._arrivals)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        if self.config.scheduling == "static":
            if not self.running:
                self._admit_static_batch()
            self._schedule_running(out, budget)
        elif self.config.enable_chunked_prefill:
            budget = self._schedule_running(out, budget)
            if not out.preempted:  # a pool that just ran dry admits nobody new
                self._admit(out, budget)
        else:
            self._admit(out, budget)
            if not out.scheduled:
                self._schedule_running(out, budget)
        return out

    def finish(self, req: Request) -> None:
        """Take a finished (or aborted) request out and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.block_manager.free(req)
        req.status = RequestStatus.FINISHED
        self._forget(req)

    def _forget(self, req: Request) -> None:
        self._arrival.pop(req, None)
        self._overtaken.pop(req, None)
        self._resuming.discard(req)

    def _prefill_chunk(self, num_left: int, budget: int, nothing_scheduled: bool) -> int:
        """Tokens of a prefill to run now: a chunk if chunking, else all or none (0).

        Without chunking a prompt larger than the whole budget cannot arrive (the engine rejects
        it), but a preempted request's prompt plus output can: that recompute goes in pieces.
        """
        if self.config.enable_chunked_prefill:
            return min(num_left, budget)
        if num_left <= budget:
            return num_left
        whole_budget = budget == self.config.max_num_batched_tokens
        return budget if nothing_scheduled and whole_budget else 0

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_left = req.num_tokens - req.num_computed_tokens
            num_new = self._prefill_chunk(num_left, budget, not out.scheduled) if req.is_prefill \
                else 1
            if num_new == 0:
                i += 1
                continue
            if not self._reserve(req, req.num_computed_tokens + num_new, out):
                break  # req preempted itself: everything after it is gone too
            out.add(req, num_new)
            budget -= num_new
            i += 1
        return budget

    def _reserve(self, req: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Blocks for num_tokens of req, preempting the newest requests until they fit."""
        while not self.block_manager.allocate(req, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)
        self._resuming.add(req)
        self.num_preemptions += 1

    def _order_waiting(self) -> None:
        """Under LPM, sort the queue: preempted requests first (in their order), then those
        overtaken LPM_MAX_OVERTAKES times (by arrival), then the rest by longest cached prefix
        (ties by arrival). Past LPM_MAX_WAITING requests: preempted first, then by arrival."""
        if self.config.scheduling_policy != "lpm" or len(self.waiting) < 2:
            return
        arrival, match_prefix = self._arrival, self.block_manager.match_prefix
        if len(self.waiting) > LPM_MAX_WAITING:  # too long to match every request: FCFS
            if not self._in_arrival_order:  # new arrivals append, so one sort keeps it so
                self._sort_waiting(lambda req: (1, arrival[req]))
                self._in_arrival_order = True
            return

        def longest_match_first(req: Request) -> tuple[int, int]:
            if self._overtaken.get(req, 0) >= LPM_MAX_OVERTAKES:
                return (1, arrival[req])
            return (2, -len(match_prefix(req.token_ids).block_ids), arrival[req])

        self._sort_waiting(longest_match_first)
        self._in_arrival_order = False

    def _sort_waiting(self, key: Callable[[Request], tuple[int, ...]]) -> None:
        """Sort the queue in place by key, preempted requests first in the order they are in."""
        ordered = sorted(enumerate(self.waiting), key=lambda item: (
            (0, item[0]) if item[1] in self._resuming else key(item[1])))
        self.waiting.clear()
        self.waiting.extend(req for _, req in ordered)

    def _count_overtakes(self, admitted: Request) -> None:
        """Under LPM, every waiting request that arrived before the admitted one was overtaken
        (a preempted request has no arrival number: it overtakes no one and is never passed)."""
        arrival = self._arrival.get(admitted)
        if (self.config.scheduling_policy != "lpm" or arrival is None
                or len(self.waiting) > LPM_MAX_WAITING):
            return
        for req in self.waiting:
            if self._arrival.get(req, arrival) < arrival:
                self._overtaken[req] = self._overtaken.get(req, 0) + 1

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        if budget > 0 and len(self.running) < self.config.max_num_seqs:
            self._order_waiting()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            match = self.block_manager.match_prefix(req.token_ids)
            num_cached = len(match.block_ids) * self.block_manager.block_size
            num_new = self._prefill_chunk(req.num_tokens - num_cached, budget, not out.scheduled)
            if num_new == 0 or not self.block_manager.allocate(req, num_cached + num_new, match):
                return
            self._start(req, num_cached)
            out.add(req, num_new)
            budget -= num_new

    def _admit_static_batch(self) -> None:
        """Seat a whole batch at once, each with blocks for its whole prompt."""
        self._order_waiting()
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            match = self.block_manager.match_prefix(req.token_ids)
            if not self.block_manager.allocate(req, req.num_tokens, match):
                return
            self._start(req, len(match.block_ids) * self.block_manager.block_size)

    def _start(self, req: Request, num_cached_tokens: int) -> None:
        self.waiting.popleft()
        self._count_overtakes(req)
        self._forget(req)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_cached_tokens
        req.num_prefill_tokens = req.num_tokens
        self.running.append(req)
