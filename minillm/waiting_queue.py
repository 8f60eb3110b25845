"""The waiting queue, and the order it admits in (EngineConfig.scheduling_policy).

- "fcfs": arrival order.
- "priority": the lowest Request.priority first (vLLM's convention), ties by arrival. Waiting
  ages a request (EngineConfig.priority_aging_steps, A): its place in the queue is that of
  priority - steps_waited / A, so a steady stream of urgent requests delays the rest but cannot
  starve them. Because every waiting request ages at the same rate, that order never changes
  while they wait: a request is inserted in place once (a binary search) and the queue is never
  re-sorted. That holds only while A stays the same, which is why A is fixed for the queue's
  life (a config field), not a setting to change under a running queue. Its rank,
  priority - steps_waited // A, is what preemption compares; it is fixed when the request is
  admitted, and the scheduler keeps the running batch in rank order and preempts from its
  worst end. A = None: no ageing, strict priority.
- "lpm" (SGLang's longest prefix match): the longest cached prefix first, so that requests
  sharing a prefix run while it is cached and fewer prefills are computed. Its risk is
  starvation: a request that shares nothing can be passed over for as long as others keep
  coming. So a request that LPM_MAX_OVERTAKES later arrivals have jumped goes first (FCFS among
  such requests), and past LPM_MAX_WAITING waiting requests the queue is served FCFS, because
  sorting it costs a prefix match per waiting request every step (SGLang's bound is 128 too).

Preempted requests keep their place at the front under "fcfs" and "lpm"; under "priority" they
take their rank's place, or a preempted victim would be readmitted at once.

Beside the order, Scheduler.admission_policy may hold a rule of one's own (AdmissionPolicy,
chapter 09's exercise): asked before each waiting request is admitted; a request it refuses is
passed over for this step (the ones behind it may start), and its waiting_cause reads "seats",
since what it was refused is a seat.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from minillm.config import SchedulingPolicy
from minillm.request import Request

if TYPE_CHECKING:
    from minillm.scheduler import Scheduler

# (a waiting request, the scheduler) -> whether it may be admitted now (Scheduler.admission_policy)
AdmissionPolicy = Callable[[Request, "Scheduler"], bool]


class AdmissionStalled(RuntimeError):
    """The admission policy refused every waiting request while none runs: nothing would ever
    change its mind, so the server would wait forever."""


# LPM sorts at most this many waiting requests a step (one prefix match each); beyond, FCFS.
LPM_MAX_WAITING = 128
# A waiting request that this many later arrivals have overtaken is admitted in FCFS order.
# Counting overtakes, not steps, bounds exactly the delay LPM adds: a request that waits because
# the server is full is overtaken by nobody and loses nothing. 32 is a batch or two of a
# typical server: the extra wait is a few batches' prefill at most.
LPM_MAX_OVERTAKES = 32


class WaitingQueue(deque):
    """A deque of waiting requests that knows the policy's order.

    match_prefix(token_ids) -> PrefixMatch is the block manager's (LPM sorts by it). step is
    the scheduler's step count, which it sets before each schedule: the clock that ages ranks.
    aging_steps: EngineConfig.priority_aging_steps (None: no ageing).
    """

    def __init__(self, policy: SchedulingPolicy,
                 match_prefix: Callable[[Sequence[int]], Any], aging_steps: int | None = 1000):
        super().__init__()
        self.policy, self.match_prefix, self.step = policy, match_prefix, 0
        self.aging_steps = aging_steps
        self._arrivals = itertools.count()
        self._seq: dict[Request, int] = {}  # arrival number, kept until the request finishes
        # LPM: arrival numbers of fresh requests, overtake counts, preempted requests
        self._arrival: dict[Request, int] = {}
        self._overtaken: dict[Request, int] = {}
        self._resuming: set[Request] = set()
        self._in_arrival_order = True
        # priority: steps waited before this wait, the step this wait began, rank at admission
        self._waited: dict[Request, int] = {}
        self._queued_at: dict[Request, int] = {}
        self._rank: dict[Request, int] = {}

    def add(self, req: Request) -> None:
        """A new arrival, at the back."""
        self._arrival[req] = self._seq[req] = next(self._arrivals)
        self._queued_at[req] = self.step
        self._insert(req)

    def put_back(self, req: Request) -> None:
        """A preempted request: at the front, or under "priority" in its rank's place."""
        self._queued_at[req] = self.step
        self._rank.pop(req, None)
        if self.policy == "priority":
            self._insert(req)
        else:
            self.appendleft(req)
            self._resuming.add(req)

    def _insert(self, req: Request) -> None:
        """At the back, or under "priority" in the place its aged priority gives it."""
        if self.policy != "priority":
            self.append(req)
            return
        key = self._priority_key(req)
        self.insert(bisect.bisect(self, key, key=self._priority_key), req)

    def _priority_key(self, req: Request) -> tuple[int, int]:
        """A * (priority - steps waited / A) less the current step, which all waiting requests
        share: a constant while req waits (A = aging_steps; without ageing, the priority)."""
        if self.aging_steps is None:
            return (req.priority, self._seq[req])
        waited_before = self._waited.get(req, 0) - self._queued_at[req]
        return (req.priority * self.aging_steps - waited_before, self._seq[req])

    def rank(self, req: Request) -> int:
        """Under "priority": the priority less one per aging_steps waited (a running request
        keeps the rank it was admitted with); 0 under the other policies."""
        if self.policy != "priority":
            return 0
        if req in self._rank:
            return self._rank[req]
        if self.aging_steps is None:
            return req.priority
        waited = self._waited.get(req, 0) + self.step - self._queued_at.get(req, self.step)
        return req.priority - waited // self.aging_steps

    def start(self, req: Request) -> int:
        """Take the head, req, out to run; returns the rank it runs with."""
        assert self[0] is req
        self.popleft()
        self._count_overtakes(req)
        self._arrival.pop(req, None)
        self._overtaken.pop(req, None)
        self._resuming.discard(req)
        rank = self.rank(req)
        self._waited[req] = self._waited.get(req, 0) + self.step - self._queued_at[req]
        self._rank[req] = rank
        return rank

    def forget(self, req: Request) -> None:
        """A finished or aborted request: out of the queue (if in it) and out of every record."""
        if req in self:
            self.remove(req)
        for state in (self._seq, self._arrival, self._overtaken, self._waited, self._queued_at,
                      self._rank):
            state.pop(req, None)
        self._resuming.discard(req)

    def order(self) -> None:
        """Sort the queue for admission (under "priority" it stays sorted as requests join). LPM:
        preempted requests first (in their order), then those overtaken LPM_MAX_OVERTAKES times (by
        arrival), then the rest by longest cached prefix (ties by arrival); past LPM_MAX_WAITING
        requests, preempted first, then by arrival."""
        if self.policy != "lpm" or len(self) < 2:
            return
        arrival = self._arrival
        if len(self) > LPM_MAX_WAITING:  # too long to match every request: FCFS
            if not self._in_arrival_order:  # new arrivals append, so one sort keeps it so
                self._sort(lambda req: (1, arrival[req]))
                self._in_arrival_order = True
            return

        def longest_match_first(req: Request) -> tuple[int, ...]:
            if self._overtaken.get(req, 0) >= LPM_MAX_OVERTAKES:
                return (1, arrival[req])
            match = self.match_prefix(req.token_ids)  # radix-token: a partial block counts too
            return (2, -len(match.block_ids), -match.num_partial_tokens, arrival[req])

        self._sort(longest_match_first)
        self._in_arrival_order = False

    def _sort(self, key: Callable[[Request], tuple[int, ...]]) -> None:
        """Sort in place by key, preempted requests (LPM's) first in the order they are in."""
        ordered = sorted(enumerate(self), key=lambda item: (
            (0, item[0]) if item[1] in self._resuming else key(item[1])))
        self.clear()
        self.extend(req for _, req in ordered)

    def _count_overtakes(self, admitted: Request) -> None:
        """Under LPM, every waiting request that arrived before the admitted one was overtaken
        (a preempted request has no arrival number: it overtakes no one and is never passed)."""
        arrival = self._arrival.get(admitted)
        if self.policy != "lpm" or arrival is None or len(self) > LPM_MAX_WAITING:
            return
        for req in self:
            if self._arrival.get(req, arrival) < arrival:
                self._overtaken[req] = self._overtaken.get(req, 0) + 1
