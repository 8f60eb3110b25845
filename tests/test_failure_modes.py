"""Each failure-mode row is proved by what an operator measures, and the proof can fail.

The simulator is deterministic, so the figures in comments are the measured ones; the rows'
margins sit well inside them (a change to the scheduler or the cost model that moves a figure
that far changes the story the chapter tells). The dashboard's own arithmetic is checked on
hand-made traces, where the right answer is known without the code under test."""

from __future__ import annotations

import dataclasses
import math

import pytest

from minillm.calc import models, roofline
from minillm.metrics import RequestMetrics, percentile
from minillm.plan import failure_modes as fm
from minillm.trace import ScheduledEntry, StepRecord


@pytest.fixture(scope="module")
def rows() -> dict[str, fm.Reproduction]:
    return {row.name: row for row in fm.reproduce_all()}


def unfixed(row: fm.Reproduction) -> fm.Reproduction:
    """The row with the fix disabled: the sick run on both sides (the simulator is
    deterministic, so reproduce(mode, {}) gives exactly this; one test checks it does)."""
    return dataclasses.replace(row, fixed=row.sick, fixed_run=row.sick_run)


def test_every_row_holds_on_enough_requests(rows: dict[str, fm.Reproduction]) -> None:
    assert list(rows) == list(fm.MODES)
    for row in rows.values():
        assert row.holds, [text for text, ok in row.checks() if not ok]
        assert min(row.sick.num_requests, row.fixed.num_requests) >= fm.MIN_REQUESTS
    text = fm.table(list(rows.values()))
    assert text.count("\n") == len(rows) + 1 and text.count("| yes |") == len(rows)


def test_a_row_with_its_fix_disabled_fails(rows: dict[str, fm.Reproduction]) -> None:
    for row in rows.values():
        assert not unfixed(row).holds, f"{row.name} holds without its fix"
    static = fm.reproduce(fm.MODES["static_batching"], {})
    assert static.fixed == static.sick and not static.holds


def test_a_weaker_fix_fails_and_the_other_fix_holds(rows: dict[str, fm.Reproduction]) -> None:
    mode, sick = fm.MODES["kv_pressure"], rows["kv_pressure"].sick_run
    too_many = fm.reproduce(mode, {"max_num_seqs": 64}, sick_run=sick)  # more than the pool holds
    assert too_many.fixed.preemptions_per_min > 0 and not too_many.holds
    # vLLM's own first advice: more KV memory (1.5x the pool) fixes the stalls and the queue.
    more_memory = fm.reproduce(mode, {"num_kv_blocks": fm.KV_POOL * 3 // 2}, sick_run=sick)
    assert more_memory.holds
    assert more_memory.fixed.ttft_p99 < more_memory.sick.ttft_p99 / 10  # measured: 989 -> 30 ms


def test_holds_needs_every_claim_and_enough_requests(rows: dict[str, fm.Reproduction]) -> None:
    row = rows["batch_too_large"]
    # The trade is part of the proof: a fix that kept the big batch's throughput would be a
    # different story (and the goodput claim alone would not notice).
    kept = dataclasses.replace(row, fixed=dataclasses.replace(
        row.fixed, output_throughput=row.sick.output_throughput))
    assert not kept.holds
    few = dataclasses.replace(row, fixed=dataclasses.replace(row.fixed, num_requests=150))
    assert not few.holds, "a p99 over 150 requests is not asserted"


def test_claims_compare_as_they_say() -> None:
    d = fm.Dashboard(*([1.0] * len(dataclasses.fields(fm.Dashboard))))
    sick, fixed = dataclasses.replace(d, ttft_p99=10.0), dataclasses.replace(d, ttft_p99=2.0)
    assert fm.Claim("ttft_p99", "falls", 5.0).test(sick, fixed)
    assert not fm.Claim("ttft_p99", "falls", 5.1).test(sick, fixed)
    assert not fm.Claim("ttft_p99", "rises", 1.0).test(sick, fixed)
    assert fm.Claim("ttft_p99", "rises", 5.0).test(fixed, sick)
    assert fm.Claim("ttft_p99", "stays", 5.0).test(sick, fixed)
    assert not fm.Claim("ttft_p99", "stays", 4.9).test(fixed, sick)
    gone = dataclasses.replace(d, preemptions_per_min=0.0)
    assert fm.Claim("preemptions_per_min", "falls", 1e9).test(d, gone), "0 is infinitely fewer"
    assert not fm.Claim("preemptions_per_min", "falls", 2.0).test(gone, gone), "none to remove"
    assert fm.Level("gpu_util", "both", 0.95).test(d, d)
    assert not fm.Level("gpu_util", "both", 0.95, at_most=True).test(d, d)
    with pytest.raises(ValueError, match="unknown Dashboard figure 'p99'"):
        fm.Claim("p99", "falls", 2.0)
    with pytest.raises(ValueError, match="unknown Dashboard figure 'gpu'"):
        fm.Level("gpu", "sick", 0.9)
    with pytest.raises(ValueError, match="factor must be >= 1, got 0.5"):
        fm.Claim("ttft_p99", "falls", 0.5)


def step(i: int, start: float, end: float, free: int, batch: list[tuple[int, int]],
         preempted: int = 0, waiting: int = 0) -> StepRecord:
    return StepRecord(i, start, end, [ScheduledEntry(f"r{j}", "decode", n, c - n)
                                      for j, (n, c) in enumerate(batch)], free, {},
                      preempted=[f"v{i}-{k}" for k in range(preempted)], num_waiting=waiting)


def test_preemption_rate_and_kv_usage_on_a_known_trace() -> None:
    # Preemptions at 1 s (2 of them) and 4 s; a 3-second window.
    trace = [step(0, 0.0, 1.0, 10, [(1, 8)], preempted=2), step(1, 1.0, 2.0, 0, [(1, 8)]),
             step(2, 2.0, 4.0, 5, [(1, 8)], preempted=1), step(3, 4.0, 4.5, 30, [(1, 8)])]
    rate = fm.preemption_rate_series(trace, window=3.0)
    assert [t for t, _ in rate] == [1.0, 2.0, 4.0, 4.5]
    # At 4 s the window (1 s, 4 s] holds only the last one: the pair at exactly 1 s has left.
    assert [r for _, r in rate] == [40.0, 40.0, 20.0, 20.0]
    assert fm.kv_usage_series(trace, 40) == [(1.0, 0.75), (2.0, 1.0), (4.0, 0.875),
                                             (4.5, 0.25)]


def test_dashboard_reads_a_known_run() -> None:
    model, gpu = models.get("llama-3-8b"), roofline.get_hardware("H100-SXM")
    # Two requests over 4 s of a 10 s run: one stalls 3 s between its tokens (a victim).
    metrics = [RequestMetrics(0.0, 0.0, 0.5, 4.0, [0.5, 1.0, 4.0]),
               RequestMetrics(1.0, 1.0, 1.2, 10.0, [1.2, 1.3, 1.4, 10.0])]
    trace = [step(0, 0.0, 2.0, 75, [(1, 100), (1, 200)], waiting=3),
             step(1, 2.0, 4.0, 25, [(1, 100)], preempted=1, waiting=1)]
    d = fm.dashboard_of(metrics, trace, {"num_blocks": 100, "num_preemptions": 2}, model, gpu,
                        {"itl": 1.0})
    assert d.duration == 10.0 and d.num_requests == 2
    assert d.preemptions_per_min == 12.0, "2 preemptions in 10 s"
    assert d.kv_usage_peak == 0.75 and d.kv_usage_mean == 0.5, "25% and 75% for 2 s each"
    assert d.running_mean == 1.5 and d.waiting_mean == 2.0
    assert d.gpu_util == 0.4, "a step ran 4 of the 10 seconds"
    assert d.slo_miss == 1.0 and d.goodput == 0.0, "both streams froze past 1 s"
    assert d.stall_p99 == pytest.approx(percentile([3.0, 8.6], 99))
    assert math.isnan(d.prefix_hit_rate), "no prefix-cache counters: no hit rate"
    flops, moved = (sum(x) for x in zip(*(roofline.step_flops_bytes(model, b) for b in
                                          ([(1, 100), (1, 200)], [(1, 100)]))))
    assert d.dram_active == pytest.approx(moved / (10.0 * gpu.bandwidth))
    assert d.tensor_active == pytest.approx(flops / (10.0 * gpu.flops))


def test_static_batching_idles_seats_while_the_gpu_reads_busy(rows: dict[str, fm.Reproduction]
                                                              ) -> None:
    row = rows["static_batching"]  # measured: 1,521 -> 4,042 tokens/s; TTFT p99 10.8 s -> 338 ms
    assert row.fixed.output_throughput > 2.5 * row.sick.output_throughput
    # The seats idle while requests wait (8 of 32 running, 67 waiting), yet GPU-Util reads 100%:
    # a step of one request is still a kernel running.
    assert row.sick.running_mean < 10 and row.sick.waiting_mean > 30
    assert abs(row.sick.gpu_util - row.fixed.gpu_util) < 0.02
    assert max(fm.batch_sizes(row.sick_run)) == 32, "the batch does fill, then drains"


def test_long_prefill_freezes_most_streams_until_chunked(rows: dict[str, fm.Reproduction]
                                                         ) -> None:
    row = rows["long_prefill_blocking"]  # measured: ITL p99 135 -> 9.2 ms; misses 68% -> 0
    assert row.sick.slo_miss > 0.5 and row.fixed.slo_miss == 0
    assert row.sick.stall_p99 > 0.1 > 0.015 > row.fixed.stall_p99
    assert max(s.num_tokens for s in row.sick_run.trace) >= 8000, "a whole prompt in a step"
    assert max(s.num_tokens for s in row.fixed_run.trace) <= 512


def test_kv_pressure_preempts_at_a_full_pool_and_the_cap_queues(rows: dict[str, fm.Reproduction]
                                                                ) -> None:
    row = rows["kv_pressure"]  # measured: 98 preemptions/min -> 0; worst stall 350 -> 26 ms
    sick, fixed = row.sick_run, row.fixed_run
    pool = sick.stats["num_blocks"]
    assert pool == fm.KV_POOL and sick.stats["num_preemptions"] >= 40
    usage = fm.kv_usage_series(sick.trace, pool)
    first = next(i for i, s in enumerate(sick.trace) if s.preempted)
    # KV usage climbs to the full pool before the first preemption: no crash, a preemption.
    assert max(u for _, u in usage[:first]) >= 0.99 and usage[0][1] < 0.1
    assert max(r for _, r in fm.preemption_rate_series(sick.trace)) > 200  # measured: 420/min
    assert all(not s.preempted for s in fixed.trace)
    # The cap's cost: the queue moves from the streams to the waiting room (TTFT p99 2.7x).
    assert row.fixed.ttft_p99 > 2 * row.sick.ttft_p99
    assert row.fixed.waiting_mean > 3 * row.sick.waiting_mean


def test_small_batch_is_bandwidth_bound_and_gpu_util_cannot_tell(rows: dict[str, fm.Reproduction]
                                                                 ) -> None:
    row = rows["memory_bound_small_batch"]  # measured: 867 -> 8,658 tokens/s; ITL p50 4.6 -> 5.7
    assert row.fixed.output_throughput > 8 * row.sick.output_throughput
    assert row.fixed.itl_p50 < 1.3 * row.sick.itl_p50, "the same step time, 16x the tokens"
    assert row.sick.gpu_util > 0.99 and row.fixed.gpu_util > 0.99, "GPU-Util: 100% either way"
    ridge = roofline.ridge_point(row.sick_run.hardware)
    # Tensor-active ~ B / ridge (4 / 295) plus the prompts' prefill: measured 3.8%.
    assert 4 / ridge < row.sick.tensor_active < 4 * 4 / ridge
    assert row.sick.dram_active > 0.98 and row.fixed.tensor_active > 5 * row.sick.tensor_active


def test_big_batch_trades_goodput_for_throughput(rows: dict[str, fm.Reproduction]) -> None:
    row = rows["batch_too_large"]  # measured: goodput 3.69 -> 15.3 req/s; 8,958 -> 5,960 tok/s
    assert row.fixed.goodput > 3 * row.sick.goodput
    assert row.sick.preemptions_per_min == 0, "a big batch, not a KV squeeze"
    assert row.sick.tpot_p99 > fm.SLO_TPOT > row.fixed.tpot_p99  # measured: 24.8 and 10.9 ms


def test_prefix_caching_cuts_the_tails(rows: dict[str, fm.Reproduction]) -> None:
    row = rows["no_prefix_caching"]  # measured: TTFT p99 405 -> 35 ms; ITL p99 30 -> 6.4 ms
    assert row.sick.ttft_p99 > 8 * row.fixed.ttft_p99
    assert math.isnan(row.sick.prefix_hit_rate) and row.fixed.prefix_hit_rate > 0.9
    prefill = [fm.prefill_tokens(r) for r in (row.sick_run, row.fixed_run)]
    assert prefill[0] > 15 * prefill[1], "the cache's hits are prefill the GPU no longer does"
