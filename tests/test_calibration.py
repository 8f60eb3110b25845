"""Calibration (minillm.calibration): the fit, the CPU clock, and the simulator's agreement with
the real engine request by request.

The last test is the one timing check of the suite, and it is a ratio measured in one process:
the real engine serves a small burst on this machine, the simulator serves the same burst with
overheads fitted on half of the real steps, and TTFT and TPOT at p50 and p99 must agree within
25%. Its margins are argued at the test.
"""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from minillm import LLM
from minillm.calc import roofline
from minillm.plan.calibration import (
    CalibrationReport,
    calibrate,
    fit_overheads,
    phase_weights,
    simulate_like,
    step_terms,
)
from minillm.serve.real_run import run_real
from minillm.sim.simulator import simulate
from minillm.trace import ScheduledEntry, StepRecord
from minillm.workloads import streams as workload
from minillm.workloads.streams import RequestSpec, Workload


def record(*entries: tuple[str, int, int]) -> StepRecord:
    """A StepRecord of (phase, num_tokens, num_computed_tokens) entries."""
    return StepRecord(0, 0.0, 1.0, [ScheduledEntry(str(i), *e) for i, e in enumerate(entries)],
                      num_free_blocks=0, block_tables={})


def test_attention_pairs_and_the_new_overhead_terms_add_to_the_step_time() -> None:
    entries = [(1, 100), (1, 7), (16, 16), (8, 40)]  # two decodes, a prefill, a later chunk
    pairs = 100 + 7 + 16 * 17 // 2 + (8 * 40 - 8 * 7 // 2)
    assert roofline.attention_pairs(entries) == pairs == 535
    base = roofline.step_time("qwen2.5-0.5b", "L4", entries)
    cost = roofline.step_time("qwen2.5-0.5b", "L4", entries, overhead=1e-3,
                              overhead_per_token=1e-6, overhead_per_seq=1e-4,
                              overhead_per_pair=1e-8)
    assert cost.overhead == pytest.approx(1e-3 + 26e-6 + 4e-4 + 535e-8)
    assert cost.time == pytest.approx(base.time + cost.overhead)
    with pytest.raises(ValueError, match="overhead_per_pair=-1"):
        roofline.step_time("qwen2.5-0.5b", "L4", entries, overhead_per_pair=-1.0)
    assert step_terms(record(("decode", 1, 99), ("prefill", 16, 0))) == (1, 17, 2, 100 + 136)


def test_step_overheads_are_one_value_from_the_fit_to_the_clock() -> None:
    entries = [(1, 100), (16, 16)]
    ov = roofline.StepOverheads(1e-3, 1e-6, 1e-4, 1e-8)
    # seconds() is the coefficients against what each multiplies (terms, which the fit uses)
    assert ov.seconds(entries) == pytest.approx(
        sum(c * t for c, t in zip(ov.as_tuple(), roofline.StepOverheads.terms(entries))))
    assert roofline.StepOverheads.of(ov.as_keywords()) == ov
    assert roofline.StepOverheads.of(None) == roofline.StepOverheads()
    with pytest.raises(ValueError, match="unknown overhead 'launch'; use overhead, "):
        roofline.StepOverheads.of({"launch": 1e-3})
    for bad in (-1e-3, float("nan"), True, "1ms"):
        with pytest.raises(ValueError, match=f"overhead_per_seq={bad!r}"):
            roofline.StepOverheads(overhead_per_seq=bad)  # type: ignore[arg-type]
    work = workload.poisson(4, 20.0, (16, 40), (2, 5), seed=2)
    as_value = simulate("llama-3.2-1b", "L4", work, overheads=ov)
    as_dict = simulate("llama-3.2-1b", "L4", work, overheads=ov.as_keywords())
    assert [r.end for r in as_value.trace] == [r.end for r in as_dict.trace]
    assert as_value.trace[-1].end > simulate("llama-3.2-1b", "L4", work).trace[-1].end


def test_the_simulator_prices_each_step_with_every_overhead() -> None:
    overheads = roofline.StepOverheads(overhead=2e-3, overhead_per_token=1e-5,
                                       overhead_per_seq=3e-4, overhead_per_pair=1e-8)
    sim = simulate("llama-3.2-1b", "L4", workload.poisson(6, 20.0, (16, 80), (2, 9), seed=1),
                   max_num_batched_tokens=48, overheads=overheads)
    for rec in sim.trace:
        entries = [(e.num_tokens, e.num_computed_tokens + e.num_tokens) for e in rec.scheduled]
        modelled = roofline.step_time("llama-3.2-1b", "L4", entries,
                                      **overheads.as_keywords()).time
        assert rec.duration == pytest.approx(modelled)


def test_fit_overheads_recovers_known_terms_and_keeps_them_nonnegative() -> None:
    rng = random.Random(0)
    truth = (3e-3, 5e-5, 1.5e-3, 4e-7)
    terms = [(1, t, b, p) for t, b, p in
             ((rng.randint(1, 256), rng.randint(1, 8), rng.randint(1, 60_000)) for _ in range(50))]
    modelled = [1e-3 * x[1] / 100 for x in terms]
    real = [m + sum(c * x for c, x in zip(truth, xs)) for m, xs in zip(modelled, terms)]
    assert fit_overheads(real, modelled, terms) == pytest.approx(truth, rel=1e-6)
    # a term that only hurts the fit is clamped at 0 rather than going negative
    shifted = [r - 1e-3 * xs[2] for r, xs in zip(real, terms)]
    assert min(fit_overheads(shifted, modelled, terms)) >= 0


def test_a_shared_scale_keeps_the_fitted_total_unbiased_where_relative_errors_do_not() -> None:
    # Steps of one phase whose real time scatters around 10 ms (log-normal, sigma 0.3, about
    # the scatter of a busy CPU): a per-step relative error is cheaper for under-estimates, so
    # its fit lands low; with the phase's median as the scale the total comes out right.
    rng = random.Random(1)
    real = [0.01 * math.exp(rng.gauss(0, 0.3)) for _ in range(400)]
    terms, modelled = [(1,)] * 400, [0.0] * 400
    (relative,) = fit_overheads(real, modelled, terms)
    (shared,) = fit_overheads(real, modelled, terms, scales=[0.01] * 400)
    mean = sum(real) / len(real)
    assert relative < 0.95 * mean  # the bias: ~ -2 sigma^2 of the real times
    assert shared == pytest.approx(mean, rel=1e-9)


def test_phase_weights_give_each_phase_the_same_total_weight() -> None:
    trace = [record(("decode", 1, 9))] * 6 + [record(("prefill", 8, 0))] * 2
    weights = phase_weights(trace)
    assert sum(weights[:6]) == pytest.approx(sum(weights[6:])) == pytest.approx(1.0)


def test_the_real_run_drives_a_closed_loop_as_the_simulator_does() -> None:
    """One driver (Arrivals) for both: two clients, so the first two requests are sent at 0 s
    and each next one the moment a request finishes; never more than two in flight, and the
    schedule step for step is the simulator's."""
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=4)
    work = workload.closed_loop(5, 2, 12, (2, 6), seed=4)
    run = run_real(llm, work)
    metrics = [r.metrics for r in run.requests]
    start = metrics[0].arrival_time
    assert [m.arrival_time - start for m in metrics[:2]] == [0.0, 0.0]
    finish_times = sorted(m.finished_time for m in metrics)
    for i, m in enumerate(metrics[2:]):  # sent as the i-th request finished
        assert m.arrival_time == finish_times[i]
    assert all(len(r.scheduled) + r.num_waiting <= 2 for r in run.trace)
    sim = simulate_like(llm, work, roofline.get_hardware("H100-SXM"), 4)

    def schedule(trace: list[StepRecord]) -> list[list[tuple[str, str, int]]]:
        return [[(e.request_id, e.phase, e.num_tokens) for e in r.scheduled] for r in trace]

    assert schedule(sim.trace) == schedule(run.trace)


def test_the_cpu_clock_skips_idle_time_and_stamps_requests_on_thread_time() -> None:
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=2)
    saved = llm.engine.clock
    late = Workload([RequestSpec(0.0, 12, 3), RequestSpec(500.0, 12, 3)])  # 500 s apart
    tic = time.perf_counter()
    run = run_real(llm, late, clock="cpu")
    assert time.perf_counter() - tic < 60  # the idle 500 s were skipped, not slept
    assert llm.engine.clock is saved
    first, second = (r.metrics for r in run.requests)
    assert second.arrival_time - first.arrival_time == pytest.approx(500.0)
    for m in (first, second):  # a few steps of CPU time: far from the 500 s gap
        assert 0 < m.ttft < 5 and m.first_scheduled_time >= m.arrival_time
    assert len(run.step_times) == len(run.trace) and all(t > 0 for t in run.step_times)


def test_simulated_requests_agree_with_the_real_engine_within_25_percent() -> None:
    """TTFT and TPOT, p50 and p99, of the simulator against the real engine on this machine.

    The workload is a burst (every request at 0 s, 24 requests, 8 at a time, prompts in
    256-token chunks), so both runs schedule the same steps (schedules_match) and the request
    figures differ only through the priced steps: queueing is in it (TTFT runs from one chunk to
    the whole queue), without the chaos of spread arrivals, where one early step moves a request
    into another window. clock="cpu" times the engine thread alone, so other jobs on a shared
    CPU slow the run less; what remains (caches and memory bandwidth shared with them) shifts a
    whole run, which the fit on its interleaved even steps absorbs.
    Margin: held-out steps err by 10-20% each, but without bias in any phase (the fit's total
    per phase is unbiased), and a request figure sums at least 8 steps (the shortest output), so
    independent step errors shrink to about 20% / sqrt(8) = 7%; measured here the ratios sit
    within 0.9-1.1. 25% leaves room for load that changes within the run, and a second attempt
    for a run that a burst of other work disturbs. The per-step and per-token model that this
    replaced missed by 26-35% on TPOT p99 on this burst (and by 2x on TPOT p50 in open loop).
    """
    torch.manual_seed(0)
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=8, max_num_batched_tokens=256)
    hw = roofline.measure_machine(seconds=0.3)
    reports: list[CalibrationReport] = []
    for seed in (0, 1):
        work = workload.poisson(24, math.inf, (64, 768), (8, 32), seed=seed)
        reports.append(calibrate(llm, work, hw=hw, clock="cpu"))
        if reports[-1].worst_request_error() < 0.25:
            break
    report = min(reports, key=CalibrationReport.worst_request_error)
    assert report.schedules_match, "a burst is scheduled the same on both clocks"
    assert report.overheads().as_tuple() == (report.overhead, report.overhead_per_token,
                                             report.overhead_per_seq, report.overhead_per_pair)
    assert report.worst_request_error() < 0.25, report.table()
