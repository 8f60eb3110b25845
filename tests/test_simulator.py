"""The simulator (minillm.simulator) and its calibration (minillm.calibration).

The simulator runs the engine's own Scheduler and BlockManager on a virtual clock, so for the
same requests it must make the engine's decisions step for step; the rest checks the bookkeeping
(no request lost, every block freed, metrics on the virtual clock) and the serving behaviour the
chapters quote (continuous over static, a goodput knee, prefix-cache hits). Timings of this
machine are never asserted here: calibration only has to return finite errors (its agreement
with the real engine, request by request, is asserted in test_calibration.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, default_model_path
from minillm.calc import roofline
from minillm.model_config import ModelConfig
from minillm.plan.calibration import calibrate, step_phase
from minillm.sampling import SamplingParams
from minillm.sim.simulator import goodput_curve, knee, simulate
from minillm.trace import StepRecord
from minillm.workloads import streams as workload
from minillm.workloads.streams import RequestSpec, Workload

SHIPPED = ModelConfig.from_pretrained(default_model_path())
SLO = {"ttft": 0.5, "tpot": 0.05}


def schedule(trace: list[StepRecord]) -> list[tuple]:
    return [([(e.request_id, e.phase, e.num_tokens, e.num_computed_tokens) for e in r.scheduled],
             r.preempted, r.finished, r.num_free_blocks) for r in trace]


@pytest.mark.parametrize(("engine_kwargs", "covers"), [
    (dict(max_num_seqs=3, max_num_batched_tokens=32, num_kv_blocks=14, block_size=8),
     "num_preemptions"),
    (dict(max_num_seqs=4, max_num_batched_tokens=96, enable_chunked_prefill=False, block_size=8,
          num_kv_blocks=14, enable_prefix_caching=True), "prefix_cache_hits"),
    (dict(max_num_seqs=3, scheduling="static", num_kv_blocks=64, block_size=4), None),
])
def test_the_simulator_schedules_exactly_what_the_engine_schedules(
        engine_kwargs: dict, covers: str | None) -> None:
    work = workload.shared_prefix(9, math.inf, prefix_len=16, num_prefixes=2,
                                  suffix_len=(4, 60), output_len=(3, 20), seed=1)
    llm = LLM(device="cpu", dtype="float32", **engine_kwargs)
    prompts = [spec.token_ids(SHIPPED.vocab_size) for spec in work]
    params = [SamplingParams(max_tokens=s.output_len, temperature=0.0, ignore_eos=True)
              for s in work]
    llm.generate(prompts, params, use_tqdm=False)
    sim = simulate(SHIPPED, "H100-SXM", work, **engine_kwargs)
    assert schedule(sim.trace) == schedule(llm.trace)
    assert [r.block_tables for r in sim.trace] == [r.block_tables for r in llm.trace]
    assert [r.cached_blocks for r in sim.trace] == [r.cached_blocks for r in llm.trace]
    assert sim.stats == llm.stats()
    if covers is not None:  # the case exercises what it is there for
        assert sim.stats[covers] > 0
    if llm.config.enable_prefix_caching:  # else no decision reads them: placeholders
        assert [o.prompt_token_ids for o in sim.outputs] == prompts


def test_every_request_finishes_and_every_block_is_freed_even_under_preemption() -> None:
    work = workload.poisson(40, 200.0, (16, 200), (1, 120), seed=2)
    sim = simulate("llama-3-8b", "H100-SXM", work, num_kv_blocks=24, max_num_seqs=16)
    assert sim.stats["num_preemptions"] > 0 and any(r.preempted for r in sim.trace)
    assert sim.stats["num_free_blocks"] == sim.stats["num_blocks"] == 24
    for spec, out in zip(work, sim.outputs):
        assert out.finished and out.finish_reason == "length" and out.text == ""
        assert len(out.token_ids) == len(out.metrics.token_times) == spec.output_len
        assert len(out.prompt_token_ids) == spec.prompt_len
        m = out.metrics
        assert m.arrival_time == spec.arrival_time <= m.first_scheduled_time < m.first_token_time
        assert m.token_times == sorted(m.token_times) and m.finished_time == m.token_times[-1]


def test_steps_follow_each_other_on_the_virtual_clock_and_record_block_tables() -> None:
    work = workload.poisson(12, 50.0, (16, 64), (2, 10), seed=3)
    trace = simulate("llama-3.2-1b", "L4", work, block_size=16).trace
    assert [r.step for r in trace] == list(range(len(trace)))
    assert all(r.end > r.start >= 0 for r in trace)
    assert all(b.start >= a.end for a, b in zip(trace, trace[1:]))
    for r in trace:
        assert set(r.block_tables) == {e.request_id for e in r.scheduled}
        for e in r.scheduled:
            assert len(r.block_tables[e.request_id]) * 16 >= e.num_computed_tokens + e.num_tokens
    light = simulate("llama-3.2-1b", "L4", work, block_size=16, record_block_tables=False).trace
    assert all(r.block_tables == {} for r in light) and schedule(light) == schedule(trace)
    assert sum(len(r.finished) for r in trace) == 12


def test_the_kv_pool_is_sized_from_memory_and_bad_input_is_named() -> None:
    sim = simulate("llama-3-8b", "H100-SXM", workload.poisson(2, 1.0, 64, 4))
    block_bytes = 2 * 32 * 16 * 8 * 128 * 2
    assert sim.stats["num_blocks"] == int((80e9 * 0.9 - 2 * 8030261248) // block_bytes)
    assert sim.config.max_model_len == 8192
    with pytest.raises(ValueError, match="weights"):
        simulate("llama-3-70b", "L4", workload.poisson(2, 1.0, 64, 4))
    with pytest.raises(ValueError, match="max_model_len"):
        simulate("llama-3-8b", "H100-SXM", Workload([RequestSpec(0.0, 8000, 500)]))
    with pytest.raises(ValueError, match="num_kv_blocks=4"):
        simulate("llama-3-8b", "H100-SXM", workload.poisson(1, 1.0, 64, 16), num_kv_blocks=4)
    with pytest.raises(ValueError, match="unknown hardware"):
        simulate("llama-3-8b", "H9000", workload.poisson(1, 1.0, 64, 16))


def test_prefix_caching_hits_on_shared_system_prompts() -> None:
    work = workload.shared_prefix(30, 20.0, prefix_len=512, num_prefixes=2, suffix_len=(16, 64),
                                  output_len=(8, 32), seed=4)
    cold = simulate("llama-3-8b", "H100-SXM", work)
    warm = simulate("llama-3-8b", "H100-SXM", work, enable_prefix_caching=True)
    assert cold.stats["prefix_cache_hits"] == 0
    assert warm.stats["prefix_cache_hits"] > 0.8 * 512 // 16 * 28  # all but the first of each
    assert warm.summary().ttft.p50 < cold.summary().ttft.p50


def test_a_closed_loop_never_exceeds_its_concurrency() -> None:
    work = workload.closed_loop(30, 4, (16, 128), (4, 40), seed=5)
    sim = simulate("llama-3-8b", "H100-SXM", work, max_num_seqs=64)
    metrics = [o.metrics for o in sim.outputs]
    finishes = sorted(m.finished_time for m in metrics)
    for m in metrics:
        in_flight = sum(o.arrival_time <= m.arrival_time < o.finished_time for o in metrics)
        assert in_flight <= 4
    assert sorted(m.arrival_time for m in metrics)[4:] == finishes[:26]  # sent as one finishes
    assert max(len(r.scheduled) for r in sim.trace) == 4


@pytest.mark.ch05
def test_continuous_batching_beats_static_on_a_heavy_tailed_spread() -> None:
    lengths = workload.Mixture([(0.85, (8, 64)), (0.15, (400, 600))])
    work = workload.poisson(96, math.inf, (32, 256), lengths, seed=6)
    runs = {s: simulate("llama-3-8b", "H100-SXM", work, max_num_seqs=16, scheduling=s)
            for s in ("continuous", "static")}
    tput = {s: r.summary().output_throughput for s, r in runs.items()}
    assert tput["continuous"] > 1.5 * tput["static"]


def test_goodput_rises_with_the_rate_then_collapses_past_the_knee() -> None:
    def make(rate: float) -> Workload:
        return workload.poisson(150, rate, (64, 512), (16, 128), seed=7)

    rates = [2.0, 8.0, 32.0, 128.0]
    curve = goodput_curve("llama-3-8b", "A100-80GB", rates, SLO, make, max_num_seqs=32)
    goodput = [s.goodput for _, s in curve]
    peak = goodput.index(max(goodput))
    assert 0 < peak < len(rates) - 1 and knee(curve) == rates[peak]
    assert goodput[-1] < 0.5 * goodput[peak] and goodput[0] < goodput[peak]


def test_summary_with_an_slo_counts_goodput() -> None:
    sim = simulate("llama-3-8b", "H100-SXM", workload.poisson(50, 20.0, (64, 256), (8, 64)))
    plain, judged = sim.summary(), sim.summary(SLO)
    assert plain.goodput is None and plain.num_requests == 50
    assert 0 < judged.goodput <= judged.request_throughput
    assert sim.summary({"ttft": 1e-9}).goodput == 0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.sampled_from([None, 1, 3]), st.booleans(), st.booleans(),
       st.integers(20, 60), st.integers(0, 1000))
def test_random_small_runs_lose_nothing(n: int, concurrency: int | None, chunked: bool,
                                        caching: bool, num_blocks: int, seed: int) -> None:
    specs = workload.shared_prefix(n, 30.0, prefix_len=8, num_prefixes=2, suffix_len=(1, 40),
                                   output_len=(1, 30), seed=seed)
    work = Workload(specs, concurrency=concurrency)
    sim = simulate("qwen2.5-0.5b", "L4", work, block_size=4, max_num_seqs=3,
                   max_num_batched_tokens=64, enable_chunked_prefill=chunked,
                   enable_prefix_caching=caching, num_kv_blocks=num_blocks)
    assert [len(o.token_ids) for o in sim.outputs] == [s.output_len for s in work]
    assert sim.stats["num_free_blocks"] == sim.stats["num_blocks"]
    assert sim.stats["num_running"] == sim.stats["num_waiting"] == 0


def test_calibration_returns_finite_errors_for_every_kind_of_step() -> None:
    torch.manual_seed(0)
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=2, max_num_batched_tokens=128)
    work = workload.poisson(5, math.inf, (16, 100), (4, 12), seed=8)
    hw = roofline.measure_machine(seconds=0.2)
    report = calibrate(llm, work, hw=hw, fit_workload=workload.poisson(3, math.inf, 40, 6))
    assert report.schedules_match and report.fitted_on == "fit run"
    assert report.overhead >= 0 and report.overhead_per_token >= 0
    assert all(report.num_steps[p] > 0 for p in ("prefill", "decode", "mixed"))
    assert all(math.isfinite(e) and e >= 0 for e in report.median_error.values())
    real_steps = llm.trace[-len(report.steps):]
    assert [s.phase for s in report.steps] == [step_phase(r) for r in real_steps]
    # a step's real time is its whole engine.step() call: the record's span and what follows it
    assert all(s.real >= r.duration for s, r in zip(report.steps, real_steps))
    assert report.real_summary.num_requests == report.simulated_summary.num_requests == 5
    assert [c.metric for c in report.requests] == ["ttft p50", "ttft p99", "tpot p50", "tpot p99"]
    assert all(c.real > 0 and c.simulated > 0 for c in report.requests)

    held_out = calibrate(llm, work, hw=hw, clock="cpu")  # fit on even steps, report odd ones
    assert held_out.fitted_on == "even steps" and held_out.schedules_match
    assert held_out.clock == "cpu" and all(s.real > 0 for s in held_out.steps)
    assert [s.step for s in held_out.steps] == [r.step for r in llm.trace[-len(real_steps):][1::2]]
    assert all(math.isfinite(held_out.median_error[p]) for p, n in held_out.num_steps.items() if n)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(ValueError, match="set_num_threads"):
            calibrate(llm, work, hw=hw, clock="cpu")
    finally:
        torch.set_num_threads(threads)


def test_the_simulate_benchmark_runs_every_part_small(capsys: pytest.CaptureFixture) -> None:
    from minillm.bench.__main__ import main

    argv = ["simulate", "--num-requests", "100", "--static-requests", "40", "--sweep-requests",
            "40", "--rates", "10,100", "--calibration-requests", "4", "--defaults-requests", "4",
            "--max-num-seqs", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for part in ("(a)", "(b)", "(c)", "(d)", "(e) at the engine's defaults", "wall time",
                 "continuous", "knee", "median |error|", "TPOT p99", "simulated / real"):
        assert part in out


def test_a_cost_model_of_ones_own_prices_every_step() -> None:
    def one_ms(model, hw, entries, *args, **kwargs):  # every step costs exactly 1 ms
        ref = roofline.step_time(model, hw, entries, *args, **kwargs)
        return roofline.StepCost(ref.flops, ref.bytes, ref.compute_time, ref.memory_time,
                                 0.0, 1e-3)

    work = workload.poisson(8, float("inf"), prompt_len=64, output_len=8, seed=0)
    result = simulate("llama-3-8b", "H100-SXM", work, step_time=one_ms)
    assert {round(rec.end - rec.start, 9) for rec in result.trace} == {1e-3}
    assert result.summary().duration == pytest.approx(1e-3 * len(result.trace))
