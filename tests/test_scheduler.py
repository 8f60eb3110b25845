"""Scheduler (minillm.scheduler) with a real BlockManager and a fake model.

FakeEngine does what Engine.step does around the model: schedule, advance each scheduled
request's num_computed_tokens, register full blocks, and append a token to every request whose
known tokens are all computed. The "model" is a pure function of the tokens so far, so a request
that is preempted and recomputed must produce exactly the tokens it would have produced anyway.
A shadow KV pool records, per slot, the prefix the K/V were computed from; every step checks that
a request reads only K/V computed from its own tokens and writes only blocks it holds alone.
Under preemption by swap a shadow host pool takes the copies the scheduler asks for, so a
request swapped back in must find its own K/V again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import radix_tree

from minillm import waiting_queue
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.request import Request, RequestStatus
from minillm.sampling import SamplingParams
from minillm.scheduler import AdmissionStalled, Scheduler, SchedulerOutput
from minillm.swap import SwapSpace

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
    def __init__(self, config: EngineConfig, num_blocks: int, num_host_blocks: int = 0):
        self.config = config
        self.bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                               config.prefix_caching)
        self.swap = SwapSpace(num_host_blocks)
        self.scheduler = Scheduler(config, self.bm, self.swap)
        self.kv: dict[int, int] = {}  # slot -> prefix id of the K/V written there
        self.host_kv: dict[int, int] = {}  # host slot -> prefix id (the swap pool)
        self.finished: list[Request] = []
        self.steps: list[SchedulerOutput] = []
        self.count = 0

    def add(self, prompt: list[int], max_tokens: int, priority: int = 0) -> Request:
        c, n = self.config, len(prompt)
        # InputProcessor.check_fits: what the engine accepts, the scheduler must be able to finish.
        assert self.bm.num_blocks_for(n + max_tokens) <= self.bm.num_blocks
        assert c.enable_chunked_prefill or n <= c.max_num_batched_tokens
        self.count += 1
        req = Request(str(self.count), list(prompt), SamplingParams(max_tokens=max_tokens), 0.0,
                      priority=priority)
        self.scheduler.add_request(req)
        return req

    def step(self) -> SchedulerOutput:
        running_before = list(self.scheduler.running)
        out = self.scheduler.schedule()
        self.check_step(out, running_before)
        self.copy_swapped(out)
        self.written: dict[int, str] = {}  # slot -> the request that wrote it this step
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
            assert req not in reqs and req.block_table == [] and req in self.scheduler.waiting
            if req in out.swapped_out:
                assert req.status is RequestStatus.SWAPPED and req.num_computed_tokens > 0
                assert len(req.swap_blocks) == self.bm.num_blocks_for(req.num_computed_tokens)
            else:
                assert req.status is RequestStatus.WAITING and req.num_computed_tokens == 0
        if c.scheduling == "continuous" and out.preempted:
            # Victims go from the back of running: the newest, or under "priority" the worst
            # rank (running is kept in rank order), from those running before this step.
            assert out.preempted == running_before[::-1][:len(out.preempted)]
        if c.scheduling_policy == "priority":
            ranks = [self.scheduler.waiting.rank(r) for r in self.scheduler.running]
            assert ranks == sorted(ranks)
            check_priority_order(self.scheduler.waiting)

    def copy_swapped(self, out: SchedulerOutput) -> None:
        """The copies the engine makes: out to the host pool first, then back in."""
        P = self.config.block_size
        for pairs, src, dst in ((out.swap_out, self.kv, self.host_kv),
                                (out.swap_in, self.host_kv, self.kv)):
            for a, b in pairs:
                for i in range(P):
                    if a * P + i in src:
                        dst[b * P + i] = src[a * P + i]
                    else:
                        dst.pop(b * P + i, None)

    def run_model(self, req: Request, start: int, num_tokens: int) -> None:
        """Read the K/V of positions [0, start), write those of [start, start + num_tokens)."""
        P, ids, table = self.config.block_size, prefix_ids(req.token_ids), req.block_table
        for pos in range(start):
            assert self.kv.get(table[pos // P] * P + pos % P) == ids[pos], "stale K/V read"
        for pos in range(start, start + num_tokens):
            # A block is registered when its step is scheduled, so a later request of the same
            # step may already share it (it reads what this one writes: the reads above catch a
            # wrong order); but no two requests may write one slot in one step.
            slot = table[pos // P] * P + pos % P
            assert self.written.setdefault(slot, req.request_id) == req.request_id, \
                "two requests wrote one slot in one step"
            block = self.bm.blocks[table[pos // P]]
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
        # The host pool: every block is free, held by one swapped request, or waiting to be
        # freed after this step's copies in.
        host = [b for r in self.scheduler.waiting for b in r.swap_blocks]
        pending = self.swap.pending_free
        assert sorted(host + pending + self.swap.free_blocks) == list(range(self.swap.num_blocks))


# ---- random workloads -------------------------------------------------------------------------

SYSTEM_PROMPTS = ([1, 2, 0, 1] * 8, [2, 2, 1, 0, 1] * 6)  # shared openings, for prefix hits


@dataclass
class Arrival:
    step: int
    prompt: list[int]
    max_tokens: int
    priority: int = 0


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


def run_workload(config: EngineConfig, num_blocks: int, arrivals: list[Arrival],
                 num_host_blocks: int = 0) -> FakeEngine:
    engine = FakeEngine(config, num_blocks, num_host_blocks)
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
            requests.append((engine.add(a.prompt, a.max_tokens, a.priority), a))
        if engine.scheduler.has_unfinished_requests():
            engine.step()
            engine.check_blocks()
        step += 1
    assert len(engine.finished) == len(arrivals)
    for req, a in requests:
        assert req.is_finished and req.output_token_ids == expected_output(a.prompt, a.max_tokens)
    assert engine.bm.num_free_blocks == engine.bm.num_blocks
    assert all(b.ref_count == 0 for b in engine.bm.blocks)
    engine.scheduler.schedule()  # frees the host blocks of the last swap-ins
    assert engine.swap.num_free_blocks == engine.swap.num_blocks
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
    radix = radix_tree(engine.bm)
    if radix is not None:
        assert radix.holders == {} and all(n.ref_count == 0 for n in radix.nodes())
        assert sorted(engine.bm.cached_free_blocks()) == sorted(radix.block_node)


@st.composite
def pressure_workloads(draw: st.DrawFn) -> tuple[EngineConfig, int, list[Arrival], int]:
    """workloads() under either preemption mode (a host pool from none to ample) and any
    admission policy, with priorities from 0 to 2."""
    config, num_blocks, arrivals = draw(workloads())
    policies = ["fcfs", "priority"] + (["lpm"] if config.enable_prefix_caching else [])
    policy = draw(st.sampled_from(policies))
    config = dataclasses.replace(
        config, preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        scheduling_policy=policy,
        priority_preemption=draw(st.sampled_from(["out_of_blocks", "for_waiting"]))
        if policy == "priority" else "out_of_blocks",
        priority_aging_steps=draw(st.sampled_from([1, 3, 1000, None])),
        prefix_caching=draw(st.sampled_from(["hash", "radix"])) if config.enable_prefix_caching
        else "hash")
    arrivals = [dataclasses.replace(a, priority=draw(st.integers(0, 2))) for a in arrivals]
    return config, num_blocks, arrivals, draw(st.integers(0, 3) | st.integers(0, num_blocks))


@settings(max_examples=300, deadline=None)
@given(pressure_workloads())
@pytest.mark.ch09
def test_random_workloads_under_swap_and_priorities_finish_and_free_both_pools(
    workload: tuple[EngineConfig, int, list[Arrival], int],
) -> None:
    """Identical outputs (checked in run_workload against the fake model), K/V read back from
    the host pool intact (the shadow pools), no block leaked in either pool, nobody starved."""
    engine = run_workload(*workload)
    swap = engine.swap
    assert swap.num_swap_ins == swap.num_swap_outs and swap.swap_in_blocks == swap.swap_out_blocks
    if workload[0].preemption_mode == "recompute":
        assert swap.num_swap_outs == 0


@pytest.mark.ch09
def test_swap_keeps_the_computed_tokens_and_falls_back_to_recompute_when_the_host_is_full(
) -> None:
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=64,
                          preemption_mode="swap")
    engine = FakeEngine(config, num_blocks=6, num_host_blocks=3)
    a = engine.add([1, 2, 1, 2, 1], max_tokens=6)
    b = engine.add([2, 2, 2, 2, 2], max_tokens=6)
    preempted = []
    while engine.scheduler.has_unfinished_requests():
        out = engine.step()
        engine.check_blocks()
        preempted += [(r.request_id, r in out.swapped_out, r.num_computed_tokens)
                      for r in out.preempted]
    assert preempted, "the pool of 6 blocks cannot hold both requests' 11 tokens"
    rid, swapped, kept = preempted[0]
    assert rid == b.request_id and swapped and kept >= 5  # b's K/V went to the host pool
    assert a.output_token_ids == expected_output([1, 2, 1, 2, 1], 6)
    assert b.output_token_ids == expected_output([2, 2, 2, 2, 2], 6)
    # A host pool of one block cannot take a victim of 3+ blocks: recompute instead.
    engine = FakeEngine(config, num_blocks=6, num_host_blocks=1)
    engine.add([1, 2, 1, 2, 1], max_tokens=6)
    engine.add([2, 2, 2, 2, 2], max_tokens=6)
    while engine.scheduler.has_unfinished_requests():
        out = engine.step()
        assert not out.swapped_out and all(r.num_computed_tokens == 0 for r in out.preempted)
    assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_recomputed_tokens > 0


@pytest.mark.ch09
def test_aborting_a_swapped_request_frees_its_host_blocks() -> None:
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=64,
                          preemption_mode="swap")
    engine = FakeEngine(config, num_blocks=6, num_host_blocks=8)
    engine.add([1, 2, 1, 2, 1], max_tokens=6)
    b = engine.add([2, 2, 2, 2, 2], max_tokens=6)
    while not b.swap_blocks:
        engine.step()
    engine.scheduler.finish(b)
    assert b.swap_blocks == [] and engine.swap.num_free_blocks == 8
    engine.check_blocks()


@pytest.mark.ch09
def test_priority_admits_the_lowest_value_first_ties_by_arrival() -> None:
    config = EngineConfig(block_size=2, max_num_seqs=1, max_num_batched_tokens=64,
                          scheduling_policy="priority")
    engine = FakeEngine(config, num_blocks=32)
    for priority in (2, 1, 2, 0, 1):
        engine.add([1, 2, 3], max_tokens=1, priority=priority)
    assert admission_order(engine) == ["4", "2", "5", "1", "3"]


def check_priority_order(queue: waiting_queue.WaitingQueue) -> None:
    """The queue is in order of (aged rank, arrival) at every step: what a binary-search insert
    relies on, and what changing the ageing rate under a waiting queue would break."""
    keys = [queue._priority_key(r) for r in queue]
    assert keys == sorted(keys), "the priority queue is out of order"
    ranks = [queue.rank(r) for r in queue]  # the same order, rounded to whole priorities
    assert ranks == sorted(ranks), "a request waits behind one of a worse aged rank"


@pytest.mark.ch09
def test_an_urgent_arrival_preempts_the_worst_ranked_running_request_under_v0_rule() -> None:
    config = EngineConfig(block_size=2, max_num_seqs=2, max_num_batched_tokens=64,
                          scheduling_policy="priority", priority_preemption="for_waiting")
    engine = FakeEngine(config, num_blocks=32)
    low = engine.add([1, 2, 3], max_tokens=20, priority=2)
    mid = engine.add([1, 1, 1], max_tokens=20, priority=1)
    engine.step()
    urgent = engine.add([2, 2, 2], max_tokens=2, priority=0)
    out = engine.step()  # no seat: the worst rank gives up its seat
    assert out.preempted == [low] and {s.request for s in out.scheduled} == {mid, urgent}
    # Same rank never preempts: an equal arrival waits for a seat.
    tie = engine.add([2, 1, 2], max_tokens=2, priority=1)
    out = engine.step()
    assert not out.preempted and tie in engine.scheduler.waiting and out.waiting_cause == "seats"


def patient_request_admissions(aging_steps: int | None) -> tuple[list[str], dict[str, int], str]:
    """One priority-1 request behind an urgent (priority-0) arrival every step, on one seat:
    the admission order, each urgent request's arrival step, and the patient one's id."""
    config = EngineConfig(block_size=2, max_num_seqs=1, max_num_batched_tokens=64,
                          scheduling_policy="priority", priority_aging_steps=aging_steps)
    engine = FakeEngine(config, num_blocks=32)
    engine.add([1, 2, 3], max_tokens=3, priority=0)
    patient = engine.add([3, 3, 3], max_tokens=1, priority=1)
    order: list[str] = []
    urgent_at: dict[str, int] = {}  # request id -> the step it arrived before
    for step in range(40):  # an urgent request arrives every step
        urgent_at[engine.add([2, 2, 2], max_tokens=3, priority=0).request_id] = step
        for s in engine.step().scheduled:
            if s.request.request_id not in order:
                order.append(s.request.request_id)
        check_priority_order(engine.scheduler.waiting)
    return order, urgent_at, patient.request_id


@pytest.mark.ch09
@pytest.mark.parametrize("aging_steps", [4, 7])
def test_ageing_lifts_a_long_waiting_request_past_later_urgent_ones(aging_steps: int) -> None:
    order, urgent_at, patient = patient_request_admissions(aging_steps)
    assert patient in order, "ageing must let the patient request in"
    # One level of priority is worth priority_aging_steps steps of waiting: the patient request
    # goes after the urgent ones that arrived less than that many steps after it, before the rest.
    ahead = order[:order.index(patient)]
    assert ahead == ["1"] + [r for r, at in urgent_at.items() if at < aging_steps]


@pytest.mark.ch09
def test_without_ageing_the_patient_request_starves() -> None:
    order, urgent_at, patient = patient_request_admissions(None)
    assert patient not in order and len(order) > 10, "strict priority: it never gets the seat"


@pytest.mark.ch09
def test_ageing_rate_is_a_config_field_validated_and_read_by_the_queue() -> None:
    for bad in (0, -5, 2.5, True, "1000"):
        with pytest.raises(ValueError, match="priority_aging_steps must be a positive"):
            EngineConfig(scheduling_policy="priority", priority_aging_steps=bad)
    config = EngineConfig(scheduling_policy="priority", priority_aging_steps=123)
    scheduler = Scheduler(config, BlockManager(8, 16))
    assert scheduler.waiting.aging_steps == 123
    assert not hasattr(waiting_queue, "PRIORITY_AGING_STEPS"), "no module constant to patch"


@pytest.mark.ch09
def test_ageing_never_lets_one_class_take_turns_preempting_itself() -> None:
    """Found by the random workloads: one seat, two requests of one class, ageing of one step.
    If the waiting one's aged rank could preempt, each would age past the other while waiting
    and throw the other's tokens away, forever. Only a better class preempts (V0's test)."""
    config = EngineConfig(block_size=1, max_num_seqs=1, max_num_batched_tokens=1,
                          scheduling_policy="priority", priority_preemption="for_waiting",
                          priority_aging_steps=1)
    engine = run_workload(config, 4, [Arrival(0, [0], 3), Arrival(0, [0], 3)])
    assert engine.scheduler.num_preemptions == 0


@pytest.mark.ch09
def test_v1_rule_never_preempts_for_a_waiting_request_it_waits_for_a_seat() -> None:
    """vLLM V1 (the default): an urgent arrival with no free seat waits; nobody is preempted
    for it, and it takes the first seat that frees, ahead of the earlier, worse-ranked ones."""
    config = EngineConfig(block_size=2, max_num_seqs=2, max_num_batched_tokens=64,
                          scheduling_policy="priority")
    assert config.priority_preemption == "out_of_blocks"
    engine = FakeEngine(config, num_blocks=32)
    low = engine.add([1, 2, 3], max_tokens=20, priority=2)
    mid = engine.add([1, 1, 1], max_tokens=3, priority=1)
    engine.step()
    later_low = engine.add([2, 1, 1], max_tokens=2, priority=2)
    urgent = engine.add([2, 2, 2], max_tokens=2, priority=0)
    out = engine.step()
    assert not out.preempted and out.waiting_cause == "seats"
    assert {s.request for s in out.scheduled} == {low, mid}
    while mid not in engine.finished:
        assert not engine.step().preempted
    out = engine.step()  # mid's seat is free: the urgent request takes it, not later_low
    assert urgent in {s.request for s in out.scheduled} and later_low in engine.scheduler.waiting
    assert engine.scheduler.num_preemptions == 0


@pytest.mark.ch09
@pytest.mark.parametrize("policy, victim", [("priority", "low"), ("fcfs", "urgent")])
def test_out_of_blocks_the_victim_is_the_worst_ranked_not_the_newest(policy: str, victim: str
                                                                     ) -> None:
    """When a running request needs a block and the pool is dry, vLLM V1 preempts the
    lowest-priority running request (FCFS: the newest), even one admitted first."""
    config = EngineConfig(block_size=2, max_num_seqs=2, max_num_batched_tokens=64,
                          scheduling_policy=policy)
    engine = FakeEngine(config, num_blocks=6)
    reqs = {"low": engine.add([1, 2, 1], max_tokens=8, priority=1)}
    engine.step()
    reqs["urgent"] = engine.add([2, 2, 2], max_tokens=8, priority=0)
    preempted: list[Request] = []
    while not preempted:
        preempted = engine.step().preempted
    assert preempted == [reqs[victim]]


@pytest.mark.ch09
def test_the_v0_rule_needs_the_priority_policy_and_a_known_name() -> None:
    with pytest.raises(ValueError, match="needs scheduling_policy='priority'"):
        EngineConfig(priority_preemption="for_waiting")
    with pytest.raises(ValueError, match="priority_preemption must be 'out_of_blocks'"):
        EngineConfig(scheduling_policy="priority", priority_preemption="v0")


def run_resumptions(prefix_caching: bool) -> tuple[int, int, FakeEngine]:
    """Two requests that cannot both finish in 10 blocks: (tokens thrown away by recompute
    preemptions, of those the ones the victims found cached when they resumed, the engine)."""
    config = EngineConfig(block_size=2, max_num_seqs=2, max_num_batched_tokens=64,
                          enable_prefix_caching=prefix_caching)
    engine = FakeEngine(config, num_blocks=10)
    engine.add([1, 2, 1, 2, 1], max_tokens=8)
    engine.add([2, 2, 2, 1, 1], max_tokens=12)
    thrown, hit, victims = 0, 0, set()
    while engine.scheduler.has_unfinished_requests():
        before = engine.scheduler.num_recomputed_tokens
        out = engine.step()
        thrown += engine.scheduler.num_recomputed_tokens - before
        for s in out.scheduled:  # a victim's first chunk after it resumes: its cache hits
            if s.request.request_id in victims:
                hit += s.num_computed_tokens
                victims.discard(s.request.request_id)
        victims |= {r.request_id for r in out.preempted}
    return thrown, hit, engine


@pytest.mark.ch09
def test_with_prefix_caching_a_preempted_request_recomputes_mostly_from_the_cache() -> None:
    """vLLM V1 keeps prefix caching on and frees a request's blocks tail first: a victim's
    freed blocks stay cached, the tail is reused first, so on resumption most of what it had
    computed is a cache hit and only the tail is computed again."""
    thrown, hit, engine = run_resumptions(prefix_caching=True)
    assert engine.scheduler.num_preemptions >= 1 and thrown >= 10
    # The survivor took one block (the victim's tail) to finish: the other 4 of 5 are hits.
    assert hit >= 0.75 * thrown, f"only {hit} of {thrown} thrown-away tokens were cache hits"
    thrown_off, hit_off, _ = run_resumptions(prefix_caching=False)
    assert hit_off == 0 and thrown_off == thrown


@pytest.mark.ch09
def test_free_releases_the_tail_first_so_the_prefix_is_evicted_last() -> None:
    bm = BlockManager(6, 2, enable_prefix_caching=True)
    req = Request("a", [1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=1), 0.0)
    assert bm.allocate(req, 8)
    req.num_computed_tokens = 8
    bm.cache_full_blocks(req)
    table = list(req.block_table)
    bm.free(req)
    assert bm.cached_free_blocks() == table[::-1], "tail first: the first block goes last"
    other = Request("b", [9] * 4, SamplingParams(max_tokens=1), 0.0)
    assert bm.allocate(other, 4 + 2 * 2)  # 4 blocks: the 2 never used, then a's last 2
    assert bm.match_prefix(req.token_ids + [0]).block_ids == table[:2], \
        "a's prefix survives the eviction of its tail"


@pytest.mark.ch09
def test_waiting_cause_names_what_stopped_admission() -> None:
    def cause(**kw) -> str | None:
        base = dict(block_size=2, max_num_seqs=4, max_num_batched_tokens=64)
        engine = FakeEngine(EngineConfig(**{**base, **kw}), num_blocks=kw.pop("blocks", 32))
        for _ in range(3):
            engine.add([1, 2, 3, 1, 2, 3], max_tokens=4)
        return engine.step().waiting_cause

    assert cause() is None
    assert cause(max_num_seqs=2) == "seats"
    assert cause(max_num_batched_tokens=8) == "budget"
    assert cause(scheduling="static", max_num_seqs=1) == "seats"
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=64)
    engine = FakeEngine(config, num_blocks=5)
    for _ in range(3):
        engine.add([1, 2, 3, 1, 2, 3], max_tokens=4)
    assert engine.step().waiting_cause == "blocks"


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
    monkeypatch.setattr(waiting_queue, "LPM_MAX_OVERTAKES", 2)
    engine = warm_engine("lpm", "radix")
    engine.add([9, 9, 9, 9, 9], max_tokens=2)  # "2": shares nothing, arrives first
    for _ in range(4):  # "3" to "6": each shares three blocks
        engine.add([1, 2, 3, 4, 5, 6, 0], max_tokens=2)
    # "3" and "4" overtake "2" once each; then "2" has waited its bound and goes next.
    assert admission_order(engine) == ["3", "4", "2", "5", "6"]


@pytest.mark.ch08
def test_lpm_serves_a_long_queue_first_come_first_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting_queue, "LPM_MAX_WAITING", 2)
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


def batch_seats(limit: int):
    """An admission policy: requests of priority >= 1 (batch) hold at most `limit` seats."""
    def policy(req: Request, scheduler: Scheduler) -> bool:
        return req.priority == 0 or sum(r.priority >= 1 for r in scheduler.running) < limit
    return policy


@pytest.mark.ch09
def test_an_admission_policy_runs_inside_the_scheduler_and_passes_over_what_it_refuses() -> None:
    config = EngineConfig(block_size=2, max_num_seqs=3, max_num_batched_tokens=64)
    engine = FakeEngine(config, num_blocks=64)
    engine.scheduler.admission_policy = batch_seats(1)
    jobs = [engine.add([1, 2, 3], max_tokens=10, priority=1) for _ in range(3)]
    chat = engine.add([2, 2, 2], max_tokens=2, priority=0)
    out = engine.step()
    # One batch seat: the second and third jobs are passed over, the chat behind them starts.
    assert {s.request for s in out.scheduled} == {jobs[0], chat}
    assert list(engine.scheduler.waiting) == jobs[1:], "the refused keep their place, in order"
    assert out.waiting_cause == "seats"
    while engine.scheduler.has_unfinished_requests():
        engine.step()
        engine.check_blocks()
        assert sum(r.priority >= 1 for r in engine.scheduler.running) <= 1
    assert [r.output_token_ids for r in jobs] == [expected_output([1, 2, 3], 10)] * 3


@pytest.mark.ch09
def test_an_admission_policy_that_refuses_an_idle_server_is_named() -> None:
    engine = FakeEngine(EngineConfig(block_size=2, max_num_seqs=2), num_blocks=16)
    engine.scheduler.admission_policy = lambda req, scheduler: False
    engine.add([1, 2, 3], max_tokens=2)
    with pytest.raises(AdmissionStalled, match="refused all 1 waiting requests while none runs"):
        engine.scheduler.schedule()
