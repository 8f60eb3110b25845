"""Scheduling under pressure end to end: preemption by swap or recompute and priorities, on the
shipped tiny model (real K/V copied to and from the host pool) and in the simulator (swaps
priced on the host link), plus the knobs' validation and the HTTP server's priority field.
"""

from __future__ import annotations

import random
import statistics

import pytest

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig
from minillm.serve.__main__ import add_arguments
from minillm.serve.protocol import APIError, parse_completion
from minillm.sim.simulator import simulate
from minillm.workloads.streams import RequestSpec

pytestmark = pytest.mark.ch09


def squeeze() -> tuple[list[list[int]], list[SamplingParams]]:
    """Twelve requests, half greedy and half seeded sampling, for a pool of 14 blocks that
    holds about a third of them at their longest."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 4096) for _ in range(rng.randint(5, 60))] for _ in range(12)]
    params = [SamplingParams(max_tokens=rng.randint(10, 60), temperature=t, seed=i,
                             ignore_eos=True) for i, t in enumerate([0.0, 0.8] * 6)]
    return prompts, params


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    prompts, params = squeeze()
    llm = LLM(num_kv_blocks=400)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] == 0
    return [o.token_ids for o in outs]


def host_pool_is_whole(llm: LLM) -> bool:
    sched = llm.engine.scheduler
    pending = sched.swap_space.pending_free  # swapped in by the last step, freed by the next
    return sched.swap_space.num_free_blocks + len(pending) == sched.swap_space.num_blocks


@pytest.mark.parametrize("kwargs", [
    {"preemption_mode": "recompute"},
    {"preemption_mode": "swap"},
    {"preemption_mode": "swap", "enable_prefix_caching": True},
    {"preemption_mode": "swap", "enable_prefix_caching": True, "prefix_caching": "radix"},
    {"preemption_mode": "swap", "enable_chunked_prefill": False,
     "max_num_batched_tokens": 128},
    {"preemption_mode": "swap", "scheduling_policy": "priority"},
])
def test_outputs_are_identical_under_recompute_swap_and_no_preemption(
        reference: list[list[int]], kwargs: dict) -> None:
    prompts, params = squeeze()
    llm = LLM(num_kv_blocks=14, **{"max_num_batched_tokens": 64, **kwargs})
    priority = [i % 3 for i in range(12)] if "scheduling_policy" in kwargs else None
    outs = llm.generate(prompts, params, use_tqdm=False, priority=priority)
    assert [o.token_ids for o in outs] == reference
    stats = llm.stats()
    assert stats["num_preemptions"] >= 3 and stats["num_free_blocks"] == 14
    assert stats["num_swapped"] == 0 and stats["num_waiting"] == stats["num_running"] == 0
    if kwargs["preemption_mode"] == "recompute":
        assert stats["num_swap_outs"] == 0 and stats["num_recomputed_tokens"] > 0
        return
    # A generous host pool: every preemption is a swap, nothing is computed twice.
    assert stats["num_swap_outs"] == stats["num_swap_ins"] == stats["num_preemptions"]
    assert stats["num_recomputed_tokens"] == 0
    assert stats["swap_out_bytes"] == stats["swap_in_bytes"] > 0
    assert stats["swap_out_bytes"] % llm.engine.runner.block_bytes == 0
    assert host_pool_is_whole(llm)


def test_the_trace_records_swaps_and_why_requests_wait() -> None:
    prompts, params = squeeze()
    llm = LLM(num_kv_blocks=14, max_num_batched_tokens=64, preemption_mode="swap")
    llm.generate(prompts, params, use_tqdm=False)
    trace, block_bytes = llm.trace, llm.engine.runner.block_bytes
    out_ids = [r for rec in trace for r in rec.swapped_out]
    in_ids = [r for rec in trace for r in rec.swapped_in]
    assert sorted(out_ids) == sorted(in_ids) and len(out_ids) == llm.stats()["num_swap_outs"]
    assert sum(rec.swap_out_blocks for rec in trace) * block_bytes == llm.stats()["swap_out_bytes"]
    for before, rec in zip(trace, trace[1:]):
        assert set(rec.swapped_out) <= set(rec.preempted)
        # swapped: every request whose K/V sit in the host pool after the step
        expected = (set(before.swapped) | set(rec.swapped_out)) - set(rec.swapped_in)
        assert set(rec.swapped) == expected
        assert not set(rec.swapped) & {e.request_id for e in rec.scheduled}
    causes = {rec.waiting_cause for rec in trace}
    assert "blocks" in causes and None in causes
    assert all((rec.waiting_cause is None) == (rec.num_waiting == 0) for rec in trace)


def test_a_small_host_pool_falls_back_to_recompute_and_still_matches(
        reference: list[list[int]]) -> None:
    prompts, params = squeeze()
    llm = LLM(num_kv_blocks=14, max_num_batched_tokens=64, preemption_mode="swap",
              swap_space=0.0003)  # 6 blocks of the tiny model's 48 KiB
    assert llm.engine.scheduler.swap_space.num_blocks == 6
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference
    stats = llm.stats()
    assert 0 < stats["num_swap_outs"] < stats["num_preemptions"]
    assert stats["num_recomputed_tokens"] > 0 and host_pool_is_whole(llm)


def test_aborting_a_swapped_request_frees_both_pools() -> None:
    prompts, params = squeeze()
    llm = LLM(num_kv_blocks=14, max_num_batched_tokens=64, preemption_mode="swap")
    engine = llm.engine
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while not any(rec.swapped for rec in engine.trace):
        engine.step()
    victim = engine.trace[-1].swapped[0]
    engine.abort_request(victim)
    for request_id in ids:
        if request_id in engine.requests:
            engine.abort_request(request_id)
    assert engine.stats()["num_free_blocks"] == 14 and host_pool_is_whole(llm)


def test_urgent_requests_overtake_a_backlog_and_nobody_starves() -> None:
    """A constructed overload: 16 long low-priority requests fill a pool of 24 blocks and its
    4 seats, then 6 short urgent ones arrive. Under "priority" with vLLM V0's preemption for
    waiting requests (priority_preemption="for_waiting") every urgent request's TTFT is
    below the median TTFT of the low-priority ones, and every request finishes; under FCFS the
    same arrivals queue behind the backlog."""
    def run(policy: str, **knobs: str) -> tuple[list[int], list[int], int]:
        llm = LLM(num_kv_blocks=24, max_num_seqs=4, max_num_batched_tokens=64,
                  scheduling_policy=policy, preemption_mode="swap", **knobs)
        engine, rng = llm.engine, random.Random(1)
        low = [engine.add_request([rng.randrange(1, 4096) for _ in range(40)],
                                  SamplingParams(max_tokens=40, ignore_eos=True), priority=1)
               for _ in range(16)]
        for _ in range(6):
            engine.step()
        high = [engine.add_request([rng.randrange(1, 4096) for _ in range(8)],
                                   SamplingParams(max_tokens=4, ignore_eos=True), priority=0)
                for _ in range(6)]
        reqs = {**{r: engine.requests[r] for r in low}, **{r: engine.requests[r] for r in high}}
        # TTFT counted in engine steps from the urgent arrivals (step 0), not in seconds: the
        # same on any machine, however busy.
        ttft: dict[str, int] = {}
        step = 0
        while engine.has_unfinished_requests():
            engine.step()
            step += 1
            ttft.update({r: step for r, req in reqs.items()
                         if r not in ttft and req.num_output_tokens > 0})
        assert all(req.is_finished for req in reqs.values()), "a request starved"
        return [ttft[r] for r in high], [ttft[r] for r in low], engine.stats()["num_preemptions"]

    high, low, preemptions = run("priority", priority_preemption="for_waiting")
    assert max(high) < statistics.median(low)
    assert preemptions > 0, "the urgent arrivals took seats from running low-priority requests"
    high_fcfs, low_fcfs, _ = run("fcfs")
    assert max(high_fcfs) > statistics.median(low_fcfs), "FCFS makes them wait: the test bites"


def test_the_simulator_prices_swaps_on_the_host_link() -> None:
    rng = random.Random(2)
    workload = [RequestSpec(0.001 * i, rng.randint(512, 2048), rng.randint(128, 512))
                for i in range(64)]
    kw = dict(num_kv_blocks=1500, max_num_seqs=64, record_block_tables=False)
    runs = {(mode, hw): simulate("llama-3-8b", hw, workload, preemption_mode=mode, **kw)
            for mode in ("recompute", "swap") for hw in ("H100-SXM", "GH200")}
    recompute, swap = runs["recompute", "H100-SXM"], runs["swap", "H100-SXM"]
    assert recompute.stats["num_preemptions"] > 0 and recompute.stats["num_recomputed_tokens"] > 0
    assert swap.stats["num_swap_outs"] > 0 and swap.stats["num_recomputed_tokens"] == 0
    steps = sum(len(rec.scheduled) for rec in recompute.trace)
    assert [o.token_ids for o in swap.outputs] == [o.token_ids for o in recompute.outputs]
    assert steps > 0
    # The same swaps over a link 7x faster (NVLink-C2C vs PCIe 5.0) take less time per byte.
    fast = runs["swap", "GH200"]

    def swap_seconds(result) -> float:
        link = result.hardware.host_link
        return (result.stats["swap_out_bytes"] + result.stats["swap_in_bytes"]) / link

    assert swap_seconds(fast) < swap_seconds(swap) / 5


def test_bad_settings_are_refused_with_their_names() -> None:
    with pytest.raises(ValueError, match="preemption_mode must be 'recompute' or 'swap'"):
        EngineConfig(preemption_mode="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="swap_space must be a number of GiB >= 0, got -1"):
        EngineConfig(swap_space=-1)
    llm = LLM(num_kv_blocks=16, scheduling_policy="priority")
    with pytest.raises(ValueError, match="got 1 priorities for 2 prompts"):
        llm.generate(["a", "b"], priority=[0], use_tqdm=False)
    with pytest.raises(ValueError, match="priority must be an int .* got 'high'"):
        llm.generate(["a", "b"], priority=[0, "high"], use_tqdm=False)
    assert llm.stats()["num_waiting"] == 0, "a refused call queues nothing"


def test_the_server_reads_priority_and_the_cli_the_knobs() -> None:
    assert parse_completion({"prompt": "hi", "priority": -3}).priority == -3
    assert parse_completion({"prompt": "hi"}).priority == 0
    with pytest.raises(APIError, match="priority must be an integer"):
        parse_completion({"prompt": "hi", "priority": "urgent"})
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--scheduling-policy", "priority", "--preemption-mode", "swap",
                              "--swap-space", "0.5", "--quantization", "int8"])
    assert (args.scheduling_policy, args.preemption_mode, args.swap_space, args.quantization) == (
        "priority", "swap", 0.5, "int8")
