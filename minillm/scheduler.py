"""The scheduler: each step, which requests run and how many tokens each computes.

Continuous batching (Orca's iteration-level scheduling): requests join and leave the batch at
every step. A step has a token budget (max_num_batched_tokens) and a seat count (max_num_seqs).

- With chunked prefill (Sarathi-Serve): running requests first, in the order they were admitted
  (a decode takes one token, an unfinished prompt a chunk of what is left), then new requests
  fill the rest of the budget with prompt chunks: one step can mix decodes and prefill.
- Without it: whenever a waiting request fits, the step is a prefill step of whole prompts (the
  running decodes sit it out); otherwise it is a decode step.
- "static" scheduling admits a batch only when the previous one has completely finished.
- Under speculative decoding (minillm.spec) a decode takes 1 + k tokens, its last and up to k
  proposed ones, checked in one forward; the engine gives back what the proposals did not use.

Waiting requests are admitted in the order of scheduling_policy (minillm.waiting_queue), and in
order: whatever stops one (no seat, no blocks, no token budget, a static batch still running)
stops everyone behind it too, and the step records it (SchedulerOutput.waiting_cause).
admission_policy (None by default) is a hook for a rule of one's own (chapter 09's exercise).

KV blocks are allocated a step at a time. When the pool runs dry, the running request that
matters least is preempted: the newest, or under "priority" the worst ranked (running is kept
in rank order), as vLLM V1 picks its victim. Under preemption_mode="recompute" its blocks are
freed, tail first (with prefix caching its prefix stays cached longest, so much of its
recompute is a cache hit), and it goes back to the queue to be computed again from its prompt
and the tokens it produced; under "swap" its computed blocks are parked in the host pool
(minillm.swap) until it resumes. Only under "priority" with priority_preemption="for_waiting"
(vLLM V0's rule) does a waiting request also preempt running requests of a worse rank and
priority to get a seat or blocks; by default (V1) it waits for them.
"""

from __future__ import annotations

from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager

# The step plan's types live with the request (minillm.request); importable from here too.
from minillm.request import Phase as Phase
from minillm.request import Request, RequestStatus, SchedulerOutput
from minillm.request import ScheduledRequest as ScheduledRequest
from minillm.request import WaitingCause as WaitingCause
from minillm.swap import SwapSpace
from minillm.waiting_queue import AdmissionPolicy, AdmissionStalled, WaitingQueue

__all__ = ["AdmissionPolicy", "AdmissionStalled", "Phase", "ScheduledRequest", "Scheduler",
           "SchedulerOutput", "WaitingCause"]


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager,
                 swap_space: SwapSpace | None = None):
        """swap_space: the host pool under preemption_mode="swap" (else a pool of no blocks:
        every preemption recomputes)."""
        self.config = config
        self.block_manager = block_manager
        self.swap_space = (swap_space if config.preemption_mode == "swap" and swap_space
                           else SwapSpace(0))
        self.waiting = WaitingQueue(config.scheduling_policy, block_manager.match_prefix,
                                    config.priority_aging_steps)
        self.admission_policy: AdmissionPolicy | None = None  # see the module docstring
        # In admission order, or under "priority" by (rank, admission): the last one is the one
        # preempted first, and it is never scheduled before the ones in front of it.
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # computed tokens thrown away by recompute preemptions
        self.num_steps = 0  # schedule() calls: the clock that ages priorities

    def add_request(self, req: Request) -> None:
        self.waiting.add(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.swap_space.free_swapped_in()
        budget = self.config.max_num_batched_tokens
        if self.config.scheduling == "static":
            if not self.running:
                self._admit_static_batch(out)
            elif self.waiting:
                out.waiting_cause = "batch"
            self._schedule_running(out, budget)
        elif self.config.enable_chunked_prefill:
            self._preempt_for_waiting(out)
            budget = self._schedule_running(out, budget)
            if out.ran_dry:  # a pool that just ran dry admits nobody new
                out.waiting_cause = "blocks" if self.waiting else None
            else:
                self._admit(out, budget)
        else:
            self._preempt_for_waiting(out)
            self._admit(out, budget)
            if not out.scheduled:
                self._schedule_running(out, budget)
        self.num_steps += 1
        self.waiting.step = self.num_steps  # arrivals before the next step wait from it
        return out

    def finish(self, req: Request) -> None:
        """Take a finished (or aborted) request out and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        self.waiting.forget(req)
        self.block_manager.free(req)
        if req.swap_blocks:  # aborted while swapped out
            self.swap_space.release(req)
        req.status = RequestStatus.FINISHED

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
            num_new = self._prefill_chunk(req.num_tokens - req.num_computed_tokens, budget,
                                          not out.scheduled) if req.is_prefill \
                else self._num_decode_tokens(req, budget)
            if num_new == 0:
                i += 1
                continue
            if not self._reserve(req, req.num_computed_tokens + num_new, out):
                break  # req preempted itself: everything after it is gone too
            out.add(req, num_new)
            budget -= num_new
            i += 1
        return budget

    def _num_decode_tokens(self, req: Request, budget: int) -> int:
        """1, plus under speculative decoding the lookahead: up to k proposed tokens, as many as
        the budget holds and never more than the output still to come needs."""
        if req.num_output_tokens + req.num_placeholders >= req.params.max_tokens:
            return 0  # its last token is still being sampled (asynchronous scheduling)
        spec = self.config.speculative_config
        if spec is None:
            return 1
        still_to_come = req.params.max_tokens - req.num_output_tokens
        return 1 + max(0, min(spec.num_speculative_tokens, budget - 1, still_to_come - 1))

    def _reserve(self, req: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Blocks for num_tokens of req, preempting from the back of running until they fit."""
        while not self.block_manager.allocate(req, num_tokens):
            out.ran_dry = True
            victim = self.running.pop()
            self._preempt(victim, out)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Send a running request back to the queue: its K/V swapped out, or dropped."""
        out.preempted.append(req)
        computed = req.block_table[:self.block_manager.num_blocks_for(req.num_computed_tokens)]
        if not self.swap_space.swap_out(req, computed, out):  # no host pool, or it is full:
            self.num_recomputed_tokens += req.num_computed_tokens
            req.num_computed_tokens, req.status = 0, RequestStatus.WAITING
        self.block_manager.free(req)
        self.waiting.put_back(req)
        self.num_preemptions += 1

    def _preempt_for_waiting(self, out: SchedulerOutput) -> None:
        """Under priority_preemption="for_waiting" (vLLM V0), preempt running requests of a worse
        rank and a worse priority than the first waiting one until it has a seat and blocks for
        its first chunk; by default ("out_of_blocks", vLLM V1) nobody is preempted for it.

        Priority, not only rank, as V0 (which has no ageing) compares: were ageing alone enough,
        two requests of one class would take turns preempting each other, and neither finish."""
        if self.config.priority_preemption != "for_waiting" or not self.waiting:
            return
        self.waiting.order()
        head, bm = self.waiting[0], self.block_manager
        rank, running_rank = self.waiting.rank(head), self.waiting.rank
        if head.swap_blocks:
            prefix, need = [], head.num_computed_tokens + 1
        else:
            prefix = bm.match_prefix(head.token_ids).block_ids
            num_cached = len(prefix) * bm.block_size
            need = num_cached + min(head.num_tokens - num_cached,
                                    self.config.max_num_batched_tokens)
        while self.running and running_rank(self.running[-1]) > rank \
                and self.running[-1].priority > head.priority and (
                len(self.running) >= self.config.max_num_seqs
                or not bm.can_allocate(head, need, prefix)):
            self._preempt(self.running.pop(), out)

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests in order while the step has budget, seats and blocks (and the
        admission_policy, if any, agrees: those it refuses wait at the front, in order).

        Each block a step fills is registered in the prefix cache when it is scheduled (as in
        vLLM V1), so a request admitted after it in the same step already finds it: the forward
        writes the step's K/V into the pool before attention reads it, layer by layer."""
        for s in out.scheduled:  # running requests' chunks, scheduled before any admission
            self._register(s.request, s.num_computed_tokens + s.num_tokens)
        if budget > 0 and len(self.running) < self.config.max_num_seqs:
            self.waiting.order()
        if self.admission_policy is None:
            self._admit_in_order(out, budget)
            return
        refused: list[Request] = []
        try:
            while self.waiting:
                budget = self._admit_in_order(out, budget, self.admission_policy)
                if out.waiting_cause != "seats" or len(self.running) >= self.config.max_num_seqs:
                    break  # admitted everyone, or stopped by something other than the policy
                refused.append(self.waiting.popleft())  # the policy's no: try the next one
        finally:
            self.waiting.extendleft(reversed(refused))
        if refused:
            out.waiting_cause = out.waiting_cause or "seats"
            if not self.running and not out.scheduled and not out.preempted:
                raise AdmissionStalled(
                    f"admission_policy refused all {len(refused)} waiting requests while none "
                    "runs: they would wait forever; let a request in when the server is idle")

    def _admit_in_order(self, out: SchedulerOutput, budget: int,
                        policy: AdmissionPolicy | None = None) -> int:
        """Admit from the head of the queue until one cannot start; returns the budget left.
        A request the policy refuses stops it with waiting_cause "seats"."""
        while self.waiting:
            if budget <= 0:
                out.waiting_cause = "budget"
                return budget
            if len(self.running) >= self.config.max_num_seqs:
                out.waiting_cause = "seats"
                return budget
            req = self.waiting[0]
            # It just gave up its blocks for those ahead of it (or its last token is unread)
            if req in out.preempted or req.num_placeholders:
                out.waiting_cause = "blocks"
                return budget
            if policy is not None and not policy(req, self):
                out.waiting_cause = "seats"
                return budget
            if req.swap_blocks:  # its K/V wait in the host pool: no prefix to match
                match, num_cached = None, req.num_computed_tokens
            else:
                match = self.block_manager.match_prefix(req.token_ids)
                num_cached = match.num_tokens(self.block_manager.block_size)
            num_new = self._prefill_chunk(req.num_tokens - num_cached, budget, not out.scheduled)
            if num_new == 0:
                out.waiting_cause = "budget"
                return budget
            if not self.block_manager.allocate(req, num_cached + num_new, match):
                out.waiting_cause = "blocks"
                return budget
            resumed = bool(req.swap_blocks)
            self._start(req, num_cached, out)
            out.add(req, num_new)
            if not resumed:  # a swapped-in table holds its K/V only once the step copies it in,
                self._register(req, num_cached + num_new)  # so it is registered after the step
            budget -= num_new
        out.waiting_cause = None
        return budget

    def _register(self, req: Request, num_tokens: int) -> None:
        """Register req's blocks that are full after its first num_tokens (the block manager
        caps it at the known tokens: speculative ones, which may be rejected, never count)."""
        if self.block_manager.enable_prefix_caching:
            self.block_manager.cache_full_blocks(req, num_tokens)

    def _admit_static_batch(self, out: SchedulerOutput) -> None:
        """Seat a whole batch at once, each with blocks for its whole prompt."""
        self.waiting.order()
        while self.waiting:
            if len(self.running) >= self.config.max_num_seqs:
                out.waiting_cause = "seats"
                return
            req = self.waiting[0]
            match = None if req.swap_blocks else self.block_manager.match_prefix(req.token_ids)
            if not self.block_manager.allocate(req, req.num_tokens, match):
                out.waiting_cause = "blocks"
                return
            num_cached = (req.num_computed_tokens if match is None
                          else match.num_tokens(self.block_manager.block_size))
            self._start(req, num_cached, out)

    def _start(self, req: Request, num_cached_tokens: int, out: SchedulerOutput) -> None:
        """Move the head of the queue to running, its first num_cached_tokens already in the
        cache (a prefix hit, or the K/V of a swapped request, copied back now)."""
        rank = self.waiting.start(req)
        if req.swap_blocks:  # its K/V come back from the host pool
            self.swap_space.swap_in(req, out)
        else:
            req.num_computed_tokens = num_cached_tokens
            req.num_prefill_tokens = req.num_tokens
            if req.metrics.first_scheduled_time is None:  # its first admission, as vLLM counts
                req.num_cached_tokens = num_cached_tokens
        req.status = RequestStatus.RUNNING
        i = len(self.running)
        while i > 0 and self.waiting.rank(self.running[i - 1]) > rank:
            i -= 1  # behind every request of the same or a better rank
        self.running.insert(i, req)

    def stats(self, block_bytes: int) -> dict[str, int]:
        """The counters LLM.stats() and the simulator report; block_bytes prices swap copies."""
        return {**self.block_manager.stats(), **self.swap_space.stats(block_bytes),
                "num_preemptions": self.num_preemptions,
                "num_recomputed_tokens": self.num_recomputed_tokens,
                "num_swapped": sum(1 for r in self.waiting if r.swap_blocks),
                "num_waiting": len(self.waiting), "num_running": len(self.running)}
