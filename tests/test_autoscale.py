"""minillm.autoscale: the signals an autoscaler reads (busy time, queue depth, SLO attainment,
from a trace or from /metrics) and the replica count each rule settles on."""

import math

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from minillm.plan import autoscale
from minillm.sim.simulator import simulate
from minillm.trace import StepRecord
from minillm.workloads.streams import poisson


def step(start: float, end: float, waiting: int = 0) -> StepRecord:
    return StepRecord(step=0, start=start, end=end, scheduled=[], num_free_blocks=0,
                      block_tables={}, num_waiting=waiting)


def test_busy_fraction_counts_overlapping_intervals_once() -> None:
    # [0, 2] covered by two overlapping requests, [3, 4] by one: 3 of 4 seconds
    assert autoscale.busy_fraction([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(0.75)
    assert autoscale.busy_fraction([(1, 2)], start=0, end=4) == pytest.approx(0.25)
    assert autoscale.busy_fraction([(0, 3), (1, 2)]) == pytest.approx(1.0)  # nested
    assert autoscale.busy_fraction([]) == 0.0


def test_mean_waiting_holds_each_count_until_the_next_step() -> None:
    # 4 waiting for 1 s, then 0 for 3 s (an idle gap counts at the last step's count: 0)
    trace = [step(0, 0.5, 4), step(1, 1.5, 0), step(3.5, 4, 0)]
    assert autoscale.mean_waiting(trace) == pytest.approx(1.0)


def test_hpa_step_is_kubernetes_formula_with_its_tolerance() -> None:
    assert autoscale.hpa_replicas(50, 90, 75) == 60  # the Kubernetes docs' example
    assert autoscale.hpa_replicas(4, 0.74, 0.7) == 4  # 6% over target: within tolerance
    assert autoscale.hpa_replicas(4, 1.0, 0.7) == 6
    assert autoscale.hpa_replicas(3, 0, 5) == 1  # an empty queue never scales to zero
    assert autoscale.hpa_replicas(1, 1.0, 0.7) == 2  # busy saturates: at most double a step


def test_replicas_for_uses_the_highest_rate_accepted_without_a_gap() -> None:
    sweep = [autoscale.Signals(rate, busy, waiting, att) for rate, busy, waiting, att in
             [(1, 0.4, 0, 1.0), (2, 0.6, 0, 1.0), (4, 0.9, 0, 1.0), (8, 1.0, 3, 0.95),
              (16, 1.0, 9, 0.5), (32, 1.0, 2, 0.95)]]  # the last: a lucky run past a refusal
    assert autoscale.replicas_for(autoscale.gpu_util_rule(0.7), sweep, 100) == 50
    assert autoscale.replicas_for(autoscale.queue_depth_rule(5), sweep, 100) == 13
    assert autoscale.replicas_for(autoscale.goodput_rule(0.9), sweep, 100) == 13
    assert autoscale.replicas_for(autoscale.goodput_rule(0.9), sweep, 16) == 2
    with pytest.raises(ValueError, match="lowest rate"):
        autoscale.replicas_for(autoscale.gpu_util_rule(0.3), sweep, 10)
    with pytest.raises(ValueError, match="unknown signal"):
        autoscale.Rule("x", "gpu", 1)


def test_on_a_gpu_busy_saturates_long_before_the_slo_breaks() -> None:
    """The chapter's finding on a small model: at a rate where every request meets the SLO
    and nothing waits, the replica is already busy nearly all the time."""
    slo = {"ttft": 0.5, "tpot": 0.05}
    res = simulate("llama-3.2-1b", "H100-SXM", poisson(200, 200.0, 64, 32, seed=1),
                   max_num_seqs=64, record_block_tables=False)
    s = autoscale.simulated_signals(200.0, res.trace, (o.metrics for o in res.outputs), slo)
    assert s.attainment == 1.0 and s.waiting == 0.0
    assert s.busy > 0.9
    assert not autoscale.gpu_util_rule(0.7).accepts(s)
    assert autoscale.queue_depth_rule(5).accepts(s) and autoscale.goodput_rule(0.9).accepts(s)


def test_overload_fills_the_queue_in_the_trace() -> None:
    res = simulate("llama-3.2-1b", "H100-SXM", poisson(120, math.inf, 64, 32, seed=1),
                   max_num_seqs=16, record_block_tables=False)
    # 120 at once on 16 seats: 104 wait at first, the queue drains by 16 every ~32 steps
    assert 30 < autoscale.mean_waiting(res.trace) < 104


def exposition(ttfts: list[float], waiting: float) -> str:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "w", ["model_name"], registry=registry) \
        .labels(model_name="m").set(waiting)
    h = Histogram("vllm:time_to_first_token_seconds", "t", ["model_name"], registry=registry,
                  buckets=(0.1, 0.5, 1.0)).labels(model_name="m")
    for t in ttfts:
        h.observe(t)
    return generate_latest(registry).decode()


def test_metrics_text_gives_the_gauge_and_the_share_between_scrapes() -> None:
    before = exposition([0.05, 2.0], 3)
    after = exposition([0.05, 2.0, 0.3, 0.4, 0.7, 5.0], 7)  # four more: two of them <= 0.5
    assert autoscale.metric_value(after, "vllm:num_requests_waiting") == 7
    name = "vllm:time_to_first_token_seconds"
    assert autoscale.histogram_share(before, after, name, 0.5) == pytest.approx(0.5)
    assert autoscale.histogram_share(before, after, name, 1.0) == pytest.approx(0.75)
    assert autoscale.histogram_buckets(after, name)[math.inf] == 6
    with pytest.raises(ValueError, match="bucket edge"):
        autoscale.histogram_share(before, after, name, 0.3)
    with pytest.raises(KeyError):
        autoscale.metric_value(after, "vllm:num_requests_running")


def test_parse_metrics_reads_labels_with_escapes() -> None:
    text = 'a_total{x="1",y="q\\"z"} 2.5\n# HELP b doc\nb 3\n'
    samples = autoscale.parse_metrics(text)
    assert [(s.name, s.value) for s in samples] == [("a_total", 2.5), ("b", 3.0)]
    assert samples[0].labels["x"] == "1"
    with pytest.raises(ValueError, match="not a Prometheus sample"):
        autoscale.parse_metrics("not a sample line here")


def test_at_rate_stretches_arrivals_to_the_rate_asked() -> None:
    specs = poisson(101, 5.0, (100, 200), (10, 20), seed=0)
    faster = autoscale.at_rate(specs, 20.0)
    assert faster.rate == 20.0
    assert faster[-1].arrival_time == pytest.approx(100 / 20.0)
    assert [s.prompt_len for s in faster] == [s.prompt_len for s in specs]
    with pytest.raises(ValueError, match="rate must be positive"):
        autoscale.at_rate(specs, 0.0)


def test_slo_replicas_divides_demand_by_the_highest_rate_the_slo_holds_at() -> None:
    from minillm.plan.deployment import Deployment

    specs = poisson(120, 10.0, (200, 800), (50, 150), seed=0)
    slo = {"ttft": 0.5, "tpot": 0.05}
    engine = Deployment(max_num_seqs=64)
    count, sweep = autoscale.slo_replicas("llama-3-8b", "H100-SXM", specs, slo, engine, 200.0,
                                          rates=[10.0, 20.0, 40.0, 80.0, 160.0],
                                          sim_requests=120)
    accepted = [s.rate for s in sweep if s.attainment >= 0.9]
    refused = [s.rate for s in sweep if s.attainment < 0.9]
    assert accepted and refused, "the sweep must cross the SLO's knee"
    assert max(accepted) < min(refused)
    assert count == math.ceil(200.0 / max(accepted))
