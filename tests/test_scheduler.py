"""Scheduler (minillm.scheduler) with a real BlockManager and a fake model.

FakeEngine does what Engine.step does around the model: schedule, advance each scheduled
request's num_computed_tokens, register full blocks, and append a token to every request whose
known tokens are all computed. The "model" is a pure function of the tokens so far, so a request
that is preempted and recomputed must produce exactly the tokens it would have produced anyway.
A shadow KV pool records, per slot, the prefix the K/V were computed from; every step checks that
a request reads only K/V computed from its own tokens and writes only blocks it holds alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import scheduler as scheduler_module
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.request import Request, RequestStatus
from minillm.sampling import SamplingParams
from minillm.scheduler import Scheduler, SchedulerOutput

pytestmark = pytest.mark.ch05  # Continuous batching; the chunked-prefill examples are ch06 too


def next_token(token_ids: list[int]) -> int:
    """The fake model: deterministic, from a small alphabet, so outputs repeat and share blocks."""
    return (sum(token_ids) * 7 + len(token_ids)) % 3


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


def prefix_ids(token_ids: list[int]) -> list[int]:
    """An id per position for the prefix up to and including it (what that K/V depend on)."""
    ids, h = [], 0
    for t in token_ids:
        h = hash((h, t))
        ids.append(h)
    return ids


class FakeEngine:
    def __init__(self, config: EngineConfig, num_blocks: int):
        self.config = config
        self.bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                               config.prefix_caching)
        self.scheduler = Scheduler(config, self.bm)
        self.kv: dict[int, int] = {}  # slot -> prefix id of the K/V written there
        self.finished: list[Request] = []
        self.steps: list[SchedulerOutput] = []
        self.count = 0

    def add(self, prompt: list[int], max_tokens: int) -> Request:
        c, n = self.config, len(prompt)
        # Engine._check_fits: what the engine accepts, the scheduler must be able to finish.
        assert self.bm.num_blocks_for(n + max_tokens) <= self.bm.num_blocks
        assert c.enable_chunked_prefill or n <= c.max_num_batched_tokens
        self.count += 1
        req = Request(str(self.count), list(prompt), SamplingParams(max_tokens=max_tokens), 0.0)
        self.scheduler.add_request(req)
        return req

    def step(self) -> SchedulerOutput:
        running_before = list(self.scheduler.running)
        out = self.scheduler.schedule()
        self.check_step(out, running_before)
        for s in out.scheduled:
            self.run_model(s.request, s.num_computed_tokens, s.num_tokens)
        for s in out.scheduled:
            self.bm.cache_full_blocks(s.request)
        for s in out.scheduled:
            req = s.request
            if req.num_computed_tokens == req.num_tokens:
                req.token_ids.append(next_token(req.token_ids))
                if req.num_output_tokens >= req.params.max_tokens:
                    self.scheduler.finish(req)
                    self.finished.append(req)
        self.steps.append(out)
        return out

    def check_step(self, out: SchedulerOutput, running_before: list[Request]) -> None:
        c, P = self.config, self.config.block_size
        reqs = [s.request for s in out.scheduled]
        assert out.scheduled or out.preempted or not self.scheduler.has_unfinished_requests()
        assert out.num_tokens <= c.max_num_batched_tokens
        assert len(reqs) <= c.max_num_seqs and len(set(map(id, reqs))) == len(reqs)
        assert len(self.scheduler.running) <= c.max_num_seqs
        for s in out.scheduled:
            req = s.request
            assert s.num_tokens >= 1 and req.status is RequestStatus.RUNNING
            assert s.num_computed_tokens == req.num_computed_tokens
            assert s.num_computed_tokens + s.num_tokens <= req.num_tokens
            assert len(req.block_table) * P >= s.num_computed_tokens + s.num_tokens
            assert s.phase == ("decode" if s.num_computed_tokens >= req.num_prefill_tokens
                               else "prefill")
            if s.phase == "decode":
                assert s.num_tokens == 1
        for req in out.preempted:
            assert req not in reqs and req.block_table == [] and req.num_computed_tokens == 0
            assert req.status is RequestStatus.WAITING and req in self.scheduler.waiting
        if c.scheduling == "continuous" and out.preempted:
            # Victims go newest first, from the requests that were running before this step.
            assert out.preempted == running_before[::-1][:len(out.preempted)]

    def run_model(self, req: Request, start: int, num_tokens: int) -> None:
        """Read the K/V of positions [0, start), write those of [start, start + num_tokens)."""
        P, ids, table = self.config.block_size, prefix_ids(req.token_ids), req.block_table
        for pos in range(start):
            assert self.kv.get(table[pos // P] * P + pos % P) == ids[pos], "stale K/V read"
        for pos in range(start, start + num_tokens):
            block = self.bm.blocks[table[pos // P]]
            assert block.ref_count == 1 and not self.bm.is_cached(block.block_id), \
                "wrote a shared/cached block"
            self.kv[block.block_id * P + pos % P] = ids[pos]
        req.num_computed_tokens = start + num_tokens

    def check_blocks(self) -> None:
        held: dict[int, int] = {}
        for req in self.scheduler.running + list(self.scheduler.waiting):
            for b in req.block_table:
                held[b] = held.get(b, 0) + 1
        assert set(held).isdisjoint(self.bm.free_blocks)
        assert len(held) + self.bm.num_free_blocks == self.bm.num_blocks
        assert all(b.ref_count == held.get(b.block_id, 0) for b in self.bm.blocks)


# ---- random workloads -------------------------------------------------------------------------

SYSTEM_PROMPTS = ([1, 2, 0, 1] * 8, [2, 2, 1, 0, 1] * 6)  # shared openings, for prefix hits


@dataclass
class Arrival:
    step: int
    prompt: list[int]
    max_tokens: int


@st.composite
def workloads(draw: st.DrawFn) -> tuple[EngineConfig, int, list[Arrival]]:
    chunked = draw(st.booleans())
    config = EngineConfig(
        block_size=draw(st.sampled_from([1, 2, 4, 16])),
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.integers(1 if chunked else 8, 40)),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        scheduling=draw(st.sampled_from(["continuous", "static"])),
    )
    max_prompt = 30 if chunked else min(30, config.max_num_batched_tokens)
    arrivals = []
    for _ in range(draw(st.integers(1, 6))):
        system = draw(st.sampled_from(SYSTEM_PROMPTS))
        shared = draw(st.integers(0, max_prompt))
        tail = draw(st.lists(st.integers(0, 2), max_size=max_prompt - shared))
        prompt = (system[:shared] + tail) or [0]
        arrivals.append(Arrival(draw(st.integers(0, 6)), prompt, draw(st.integers(1, 12))))
    P = config.block_size
    need = [math.ceil((len(a.prompt) + a.max_tokens) / P) for a in arrivals]
    # From "barely fits the largest request" to room for everyone at once.
    num_blocks = max(need) + draw(st.integers(0, 2) | st.integers(0, sum(need)))
    return config, num_blocks, arrivals


def run_workload(config: EngineConfig, num_blocks: int, arrivals: list[Arrival]) -> FakeEngine:
    engine = FakeEngine(config, num_blocks)
    pending = sorted(arrivals, key=lambda a: a.step)
    requests = []
    total = sum(len(a.prompt) + a.max_tokens for a in arrivals)
    # Each step computes at least one token unless it preempts, and a preemption throws away at
    # most one request's tokens; this bound is loose but finite, so a stall fails the test.
    max_steps = 12 + 4 * total * (len(arrivals) + 1)
    step = 0
    while pending or engine.scheduler.has_unfinished_requests():
        assert step < max_steps, f"no progress after {step} steps: {engine.scheduler.running}"
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            requests.append((engine.add(a.prompt, a.max_tokens), a))
        if engine.scheduler.has_unfinished_requests():
            engine.step()
            engine.check_blocks()
        step += 1
    assert len(engine.finished) == len(arrivals)
    for req, a in requests:
        assert req.is_finished and req.output_token_ids == expected_output(a.prompt, a.max_tokens)
    assert engine.bm.num_free_blocks == engine.bm.num_blocks
    assert all(b.ref_count == 0 for b in engine.bm.blocks)
    return engine


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_random_workloads_finish_within_budget_and_free_every_block(
    workload: tuple[EngineConfig, int, list[Arrival]],
) -> None:
    run_workload(*workload)


@st.composite
def cached_workloads(draw: st.DrawFn) -> tuple[EngineConfig, int, list[Arrival]]:
    """workloads() with prefix caching on, either design and either admission policy."""
    config, num_blocks, arrivals = draw(workloads())
    config = dataclasses.replace(
        config, enable_prefix_caching=True,
        prefix_caching=draw(st.sampled_from(["hash", "radix"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "lpm"])))
    return config, num_blocks, arrivals


@settings(max_examples=200, deadline=None)
@given(cached_workloads())
@pytest.mark.ch08
def test_random_workloads_with_either_cache_design_and_policy_finish_and_free_every_block(
    workload: tuple[EngineConfig, int, list[Arrival]],
) -> None:
    engine = run_workload(*workload)
    radix = engine.bm.radix
    if radix is not None:
        assert radix.holders == {} and all(n.ref_count == 0 for n in radix.nodes())
        assert sorted(engine.bm.cached_free_blocks()) == sorted(radix.block_node)


# ---- longest-prefix-match admission (LPM) -----------------------------------------------------


def admission_order(engine: FakeEngine) -> list[str]:
    """Run to completion; the request ids in the order they were first scheduled."""
    order: list[str] = []
    while engine.scheduler.has_unfinished_requests():
        for s in engine.step().scheduled:
            if s.request.request_id not in order:
                order.append(s.request.request_id)
    return order


def warm_engine(policy: str, design: str) -> FakeEngine:
    """One seat, and the blocks of [1, 2, 3, 4, 5, 6, 7, 8] cached by a finished request."""
    config = EngineConfig(block_size=2, max_num_seqs=1, max_num_batched_tokens=64,
                          enable_prefix_caching=True, prefix_caching=design,  # type: ignore
                          scheduling_policy=policy)  # type: ignore[arg-type]
    engine = FakeEngine(config, num_blocks=32)
    engine.add([1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=1)
    admission_order(engine)
    return engine


@pytest.mark.ch08
@pytest.mark.parametrize("design", ["hash", "radix"])
@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lpm_admits_the_longest_cached_prefix_first(policy: str, design: str) -> None:
    engine = warm_engine(policy, design)
    engine.add([9, 9, 9, 9, 9], max_tokens=2)  # "2": no match
    engine.add([1, 2, 3, 3, 3], max_tokens=2)  # "3": one block
    engine.add([1, 2, 3, 4, 5, 6, 0], max_tokens=2)  # "4": three blocks
    engine.add([1, 2, 3, 4, 0, 0], max_tokens=2)  # "5": two blocks
    want = ["2", "3", "4", "5"] if policy == "fcfs" else ["4", "5", "3", "2"]
    assert admission_order(engine) == want


@pytest.mark.ch08
def test_lpm_admits_a_request_passed_over_too_often_in_arrival_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler_module, "LPM_MAX_OVERTAKES", 2)
    engine = warm_engine("lpm", "radix")
    engine.add([9, 9, 9, 9, 9], max_tokens=2)  # "2": shares nothing, arrives first
    for _ in range(4):  # "3" to "6": each shares three blocks
        engine.add([1, 2, 3, 4, 5, 6, 0], max_tokens=2)
    # "3" and "4" overtake "2" once each; then "2" has waited its bound and goes next.
    assert admission_order(engine) == ["3", "4", "2", "5", "6"]


@pytest.mark.ch08
def test_lpm_serves_a_long_queue_first_come_first_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "LPM_MAX_WAITING", 2)
    engine = warm_engine("lpm", "hash")
    engine.add([9, 9, 9, 9, 9], max_tokens=1)
    engine.add([1, 2, 3, 3, 3], max_tokens=1)
    engine.add([1, 2, 3, 4, 5, 6, 0], max_tokens=1)
    # Three waiting: over the bound, so arrival order; at two, LPM sorts again.
    assert admission_order(engine) == ["2", "4", "3"]


@pytest.mark.ch08
def test_lpm_keeps_a_preempted_request_at_the_front() -> None:
    engine = warm_engine("lpm", "radix")
    victim = engine.add([9, 9, 9, 9, 9], max_tokens=4)
    engine.step()  # victim runs
    engine.add([1, 2, 3, 4, 5, 6, 0], max_tokens=1)  # a long match, waiting
    sched = engine.scheduler
    sched.running.remove(victim)  # what _reserve does when the pool runs dry
    sched._preempt(victim, SchedulerOutput())
    out = engine.step()
    assert [s.request for s in out.scheduled] == [victim]


# ---- policy, one example each -----------------------------------------------------------------


def summary(out: SchedulerOutput) -> list[tuple[str, str, int]]:
    return [(s.request.request_id, s.phase, s.num_tokens) for s in out.scheduled]


@pytest.mark.ch06
def test_chunked_prefill_puts_decodes_first_and_fills_the_budget_with_chunks() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                          enable_chunked_prefill=True)
    engine = FakeEngine(config, num_blocks=16)
    engine.add([1, 2, 3], max_tokens=10)
    assert summary(engine.step()) == [("1", "prefill", 3)]
    engine.add(list(range(20)), max_tokens=2)
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "prefill", 7)]
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "prefill", 7)]
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "prefill", 6)]
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "decode", 1)]


@pytest.mark.ch06
def test_chunked_prefill_splits_a_prompt_longer_than_the_budget() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=8, enable_chunked_prefill=True)
    engine = FakeEngine(config, num_blocks=8)
    engine.add(list(range(19)), max_tokens=1)
    assert [summary(engine.step()) for _ in range(3)] == [
        [("1", "prefill", 8)], [("1", "prefill", 8)], [("1", "prefill", 3)]]
    assert engine.finished and engine.bm.num_free_blocks == 8


def test_without_chunking_a_prefill_step_holds_only_whole_prompts() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=16,
                          enable_chunked_prefill=False)
    engine = FakeEngine(config, num_blocks=32)
    engine.add([1, 2, 3], max_tokens=10)
    assert summary(engine.step()) == [("1", "prefill", 3)]
    assert summary(engine.step()) == [("1", "decode", 1)]
    engine.add([1] * 5, max_tokens=10)
    engine.add([2] * 6, max_tokens=10)
    assert summary(engine.step()) == [("2", "prefill", 5), ("3", "prefill", 6)]  # 1 sits out
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "decode", 1), ("3", "decode", 1)]
    engine.add([0] * 10, max_tokens=10)
    engine.add([1] * 10, max_tokens=10)  # does not fit beside the first: waits a step
    assert summary(engine.step()) == [("4", "prefill", 10)]
    assert summary(engine.step()) == [("5", "prefill", 10)]
    assert [p for _, p, _ in summary(engine.step())] == ["decode"] * 5


def test_static_scheduling_admits_nobody_until_the_batch_has_finished() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=4, scheduling="static")
    engine = FakeEngine(config, num_blocks=32)
    a, b = engine.add([1, 2, 3], max_tokens=2), engine.add([4, 5], max_tokens=5)
    assert summary(engine.step()) == [("1", "prefill", 3), ("2", "prefill", 2)]
    c = engine.add([6, 7], max_tokens=1)  # seats and budget to spare, but the batch is running
    while not b.is_finished:
        out = engine.step()
        assert c not in [s.request for s in out.scheduled] and c.status is RequestStatus.WAITING
    assert a.is_finished
    assert summary(engine.step()) == [("3", "prefill", 2)]


def test_continuous_scheduling_admits_into_a_running_batch() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=4)
    engine = FakeEngine(config, num_blocks=32)
    engine.add([1, 2, 3], max_tokens=5)
    engine.step()
    engine.add([6, 7], max_tokens=1)
    assert summary(engine.step()) == [("1", "decode", 1), ("2", "prefill", 2)]


def test_preemption_evicts_the_newest_and_the_victim_recomputes_to_the_same_output() -> None:
    # A pool of 5 blocks of 2 tokens: two 3-token prompts take 2 blocks each, the third waits.
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=16)
    engine = FakeEngine(config, num_blocks=5)
    a = engine.add([1, 2, 0], max_tokens=6)
    b = engine.add([2, 1, 0], max_tokens=6)
    c = engine.add([0, 0, 1], max_tokens=6)
    assert summary(engine.step()) == [("1", "prefill", 3), ("2", "prefill", 3)]
    assert c.status is RequestStatus.WAITING and engine.bm.num_free_blocks == 1
    out = engine.step()  # both still fit in 2 blocks (4 tokens); 1 free block, c needs 2
    assert summary(out) == [("1", "decode", 1), ("2", "decode", 1)]
    out = engine.step()  # a takes the last block; b needs one too: b, the newest, goes
    assert out.preempted == [b] and summary(out) == [("1", "decode", 1)]
    assert engine.scheduler.num_preemptions == 1
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.block_table == [] and list(engine.scheduler.waiting) == [b, c]
    assert b.num_output_tokens == 2  # what it had produced survives; its K/V do not
    while not a.is_finished:
        assert b not in [s.request for s in engine.step().scheduled]
    out = engine.step()
    assert summary(out)[0] == ("2", "prefill", 5)  # prompt and output recomputed together
    assert out.scheduled[0].num_computed_tokens == 0
    while engine.scheduler.has_unfinished_requests():
        engine.step()
    for req in (a, b, c):
        assert req.output_token_ids == expected_output(req.prompt_token_ids, 6)
    assert engine.bm.num_free_blocks == 5


def test_small_pools_really_preempt() -> None:
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=16,
                          enable_prefix_caching=True)
    arrivals = [Arrival(0, [1, 2, 0, 1, 2], 8) for _ in range(4)]
    engine = run_workload(config, num_blocks=7, arrivals=arrivals)
    assert engine.scheduler.num_preemptions > 0
    assert any(out.preempted for out in engine.steps)
    assert engine.bm.prefix_cache_hits > 0


def test_preemption_without_chunking_recomputes_past_the_budget_in_pieces() -> None:
    # b's prompt fits the budget, but prompt plus output does not: its recompute is split.
    config = EngineConfig(block_size=2, max_num_seqs=2, max_num_batched_tokens=4,
                          enable_chunked_prefill=False)
    engine = FakeEngine(config, num_blocks=5)
    a, b = engine.add([1, 2, 0], max_tokens=6), engine.add([2, 1, 0, 0], max_tokens=6)
    while not engine.scheduler.num_preemptions:
        engine.step()
    assert b.status is RequestStatus.WAITING and b.num_tokens > 4
    while engine.scheduler.has_unfinished_requests():
        out = engine.step()
        assert out.num_tokens <= 4
    assert a.output_token_ids == expected_output([1, 2, 0], 6)
    assert b.output_token_ids == expected_output([2, 1, 0, 0], 6)
    assert any(s.request is b and s.phase == "prefill" and s.num_computed_tokens > 0
               for out in engine.steps for s in out.scheduled)
