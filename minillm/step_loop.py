"""One engine step's bookkeeping, shared by the engine and the simulator.

A step is: schedule; move the blocks the schedule asked for; execute; advance each request's
num_computed_tokens and register its full blocks; append the tokens the step sampled, checking
stops; free what finished; record the StepRecord. Only executing differs: Engine (minillm.engine)
runs the model and samples, the Simulator (minillm.sim.simulated_engine) prices the step with a
cost model on a virtual clock and "samples" stand-in tokens. Everything else is this one code
path, so the simulator cannot drift from the engine it models.

Under asynchronous scheduling (the engine's async_scheduling) the same parts run in another
order, one step ahead: schedule and launch step n+1, then read and take step n's tokens while
step n+1 runs on the device. Step n+1 was planned before step n's tokens were known, so each
request in it carries a placeholder for its step-n token (Request.num_placeholders), and a
request that step n's token ended still ran in step n+1: that token is discarded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.request import Request, ScheduledRequest, SchedulerOutput
from minillm.scheduler import Scheduler
from minillm.trace import StepRecord, step_record

log = logging.getLogger(__name__)

Logprobs = dict[int, float] | None  # one token's top-k logprobs; None where not asked for


@dataclass
class Executed:
    """What executing a step gives back. sampled: the scheduled requests whose known tokens are
    all computed now, so the step picked their next tokens; tokens: what each emits, in the same
    order (one, or under speculative decoding its accepted proposals and one more); logprobs:
    each token's (None: none asked for in this step); failed: request id -> why its sampling
    failed (that request ends, the others go on)."""

    sampled: list[ScheduledRequest]
    tokens: list[list[int]]
    logprobs: list[list[Logprobs]] | None = None
    failed: dict[str, str] = field(default_factory=dict)


class Launched(Protocol):
    """A step running on the device (asynchronous scheduling): its tokens once read back."""

    sampled: list[ScheduledRequest]  # the requests it samples a token for

    def collect(self) -> Executed: ...


class StepLoop:
    """The step's bookkeeping around an executor. A subclass gives now() (its clock),
    move_blocks (swaps and copy-on-write copies, before the step's forward), execute (the
    forward, or its price) and stats(); stops() if a token can end a request before max_tokens.

    Under speculative decoding, execute leaves each decode's proposals in
    request.spec_token_ids; their K/V were written, but only the accepted ones count."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, scheduler: Scheduler,
                 *, trace_block_tables: bool, trace_prefix_cache: bool | None = None,
                 speculative: bool = False):
        self.config, self.block_manager, self.scheduler = config, block_manager, scheduler
        self.in_flight: Launched | None = None  # asynchronous scheduling: the step launched last
        self.trace_block_tables = trace_block_tables
        self.trace_prefix_cache = trace_prefix_cache  # None: when block tables are traced
        self.speculative = speculative
        self.trace: list[StepRecord] = []
        self.num_steps = 0  # StepRecord.step: the trace may be trimmed (max_trace_steps)

    # ---- what a subclass gives ---------------------------------------------------------------

    def now(self) -> float:
        raise NotImplementedError

    def move_blocks(self, out: SchedulerOutput, copies: list[tuple[int, int]]) -> None:
        raise NotImplementedError

    def execute(self, out: SchedulerOutput) -> Executed:
        raise NotImplementedError

    def launch(self, out: SchedulerOutput, previous: Launched | None) -> Launched:
        """Start executing out without waiting for its tokens (asynchronous scheduling); its
        placeholder inputs are the tokens of previous, the step still in flight."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous scheduling")

    def read(self, launched: Launched) -> Executed:
        """A launched step's tokens, once the device has them (on a GPU: the host's wait)."""
        return launched.collect()

    def stats(self) -> dict[str, int]:
        raise NotImplementedError

    def stops(self, req: Request, token: int) -> bool:
        """Whether token (just appended) ends req before max_tokens; here nothing does."""
        return False

    # ---- the step ----------------------------------------------------------------------------

    def run_step(self) -> tuple[list[Request], list[Request]]:
        """Run one step; return the requests that got tokens in it and those that finished."""
        if self.config.async_scheduling:
            return self._run_step_ahead()
        start = self.now()
        out = self._schedule()
        if not out.scheduled:  # a step that only preempted
            self._check_progress(out)
            return [], []
        tables = self._tables(out)
        done = self.execute(out)
        now = self.now()
        self._advance(out.scheduled, done, start)
        sampled, finished = self._take(done, now)
        self._record(out, start, now, tables, finished)
        return sampled, finished

    def _run_step_ahead(self) -> tuple[list[Request], list[Request]]:
        """One step of asynchronous scheduling: launch step n+1, then take step n's tokens (read
        back while step n+1 runs); return the requests that got those tokens and those that
        finished."""
        start = self.now()
        out = self._schedule()
        launched = None
        if out.scheduled:
            tables = self._tables(out)
            launched = self.launch(out, self.in_flight)
            self._advance(out.scheduled, None, start)
            for s in launched.sampled:
                s.request.num_placeholders += 1
        elif self.in_flight is None:
            self._check_progress(out)
        sampled, finished = [], []
        if self.in_flight is not None:
            done = self.read(self.in_flight)
            for s in done.sampled:
                s.request.num_placeholders -= 1
            sampled, finished = self._take(done, self.now())
        # A launched step whose every request has ended (its tokens would all be discarded)
        # is not waited for.
        self.in_flight = launched if launched is not None and any(
            not s.request.is_finished for s in launched.sampled) else None
        if launched is not None:
            self._record(out, start, self.now(), tables, finished)
        return sampled, finished

    def _schedule(self) -> SchedulerOutput:
        """The step's plan, and the swaps and copy-on-write copies it asked for, made before
        the step's forward."""
        self.block_manager.step = self.num_steps  # the prefix cache's LRU clock
        out = self.scheduler.schedule()
        self.move_blocks(out, self.block_manager.take_copies())
        return out

    def _check_progress(self, out: SchedulerOutput) -> None:
        if self.scheduler.has_unfinished_requests() and not out.preempted:
            raise RuntimeError(f"the scheduler found nothing to run: {self.stats()}")

    def _tables(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """The scheduled block tables for the trace, copied now: finishing frees them."""
        return ({s.request.request_id: list(s.request.block_table) for s in out.scheduled}
                if self.trace_block_tables else {})

    def _take(self, done: Executed, now: float) -> tuple[list[Request], list[Request]]:
        """Append each sampled request's tokens, checking stops; return the requests that got
        tokens and those that finished. A request that had ended before its tokens were read
        (asynchronous scheduling: stopped a step earlier, or aborted) takes none."""
        got, finished, failed = [], [], done.failed
        logprobs = repeat(None) if done.logprobs is None else done.logprobs
        for s, tokens, token_logprobs in zip(done.sampled, done.tokens, logprobs):
            req = s.request
            if req.is_finished:
                continue
            got.append(req)
            error = failed.get(req.request_id) if failed else None
            if error is None:
                try:
                    self._take_tokens(req, tokens, token_logprobs, now)
                except Exception as e:  # this request's bookkeeping, not the step's
                    error = f"{type(e).__name__}: {e}"
                    log.warning("request %s failed after sampling", req.request_id,
                                exc_info=True)
            if error is not None and not req.is_finished:
                self._fail(req, error, now)
            if req.spec_token_ids:
                req.spec_token_ids = []
            if req.finish_reason is not None:  # it is retired too (or aborted)
                finished.append(req)
        return got, finished

    def _advance(self, scheduled: list[ScheduledRequest], done: Executed | None, start: float
                 ) -> None:
        """Each scheduled request's computed tokens move on by what the step computed; its
        newly full blocks join the prefix cache (a speculative decode's once its accepted
        tokens are in token_ids: _take_tokens)."""
        accepted = ({s.request.request_id: max(len(t) - 1, 0)
                     for s, t in zip(done.sampled, done.tokens)}
                    if self.speculative and done is not None else {})
        for s in scheduled:
            req, computed = s.request, s.num_tokens
            if req.spec_token_ids:  # rejected proposals' K/V do not count: later tokens
                computed -= len(req.spec_token_ids) - accepted.get(req.request_id, 0)
            req.num_computed_tokens += computed  # ... overwrite their slots
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = start
            if not req.spec_token_ids:
                self.block_manager.cache_full_blocks(req)

    def _take_tokens(self, req: Request, tokens: list[int], logprobs: list[Logprobs] | None,
                     now: float) -> None:
        """Append a request's tokens of this step until one finishes it."""
        for token, lp in zip(tokens, repeat(None) if logprobs is None else logprobs):
            self._append_token(req, token, lp, now)
            if req.finish_reason is not None:
                return
        if self.speculative:
            # Its accepted tokens are in token_ids now: register its newly full blocks, give back
            # the lookahead blocks its tokens do not reach, and keep the draft model's cache
            # count within what was accepted.
            self.block_manager.cache_full_blocks(req)
            self.block_manager.trim(req, req.num_tokens)
            req.num_draft_computed = min(req.num_draft_computed, req.num_computed_tokens)

    def _append_token(self, req: Request, token: int, logprobs: Logprobs, now: float) -> None:
        req.token_ids.append(token)
        if logprobs is not None:
            req.output_logprobs.append(logprobs)
        m = req.metrics
        m.token_times.append(now)
        if m.first_token_time is None:
            m.first_token_time = now
        if self.stops(req, token):
            req.finish_reason = "stop"
        elif req.num_output_tokens >= req.params.max_tokens:
            req.finish_reason = "length"
        if req.finish_reason is not None:
            m.finished_time = now
            if req.spec_token_ids:  # accepted proposals past the stop are not the request's
                req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)
                self.block_manager.cache_full_blocks(req)
            self._retire(req)

    def _fail(self, req: Request, error: str, now: float) -> None:
        """End one request with finish_reason "error" and free its blocks; others go on."""
        req.finish_reason, req.error = "error", error
        req.metrics.finished_time = now
        self._retire(req)

    def _retire(self, req: Request) -> None:
        """Free a finished, failed or aborted request's blocks."""
        self.scheduler.finish(req)

    def _record(self, out: SchedulerOutput, start: float, end: float,
                tables: dict[str, list[int]], finished: list[Request]) -> None:
        """Append the step's StepRecord: O(scheduled requests), plus the block data if traced."""
        self.trace.append(step_record(self.num_steps, out, start, end, tables,
                                      [r.request_id for r in finished], self.scheduler,
                                      self.trace_block_tables, self.trace_prefix_cache))
        self.num_steps += 1
        limit = self.config.max_trace_steps
        if limit is not None and len(self.trace) >= 2 * limit:
            del self.trace[:-limit]  # one cut per limit steps: O(1) a step on average
