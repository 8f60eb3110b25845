"""Prefill-decode interference as a stated, switchable part of the cost model
(minillm.roofline.serial_phases): pure steps cost what step_time says, a mixed step costs the
sum of its two phases priced apart (or a share of the way there), on one GPU and on a TP
layout; a colocated fleet pays it and its tuned chunk follows it, the disaggregated pools do
not mix phases and so price the same under it (but for the prompt tail a decode replica
recomputes); and with it priced, disaggregation beats every colocated chunk on RAG."""

from __future__ import annotations

import dataclasses

import pytest

from minillm.calc import parallel, roofline
from minillm.plan.disaggregation import (
    compare_disaggregation,
    simulate_disaggregated,
    tuned_colocated_kwargs,
)
from minillm.sim.fleet import simulate_fleet
from minillm.sim.simulator import simulate
from minillm.workloads import streams as workload

pytestmark = pytest.mark.ch11

MODEL, HW = "llama-3-8b", "H100-SXM"
SLO = {"ttft": 1.0, "tpot": 0.008}
CHUNK, DECODES = [(512, 512)], [(1, 6000)] * 6  # the recipe's RAG chunk, a replica's decodes


def rag(n: int = 120, rate: float = 16.0) -> workload.Workload:
    return workload.poisson(n, rate, (4000, 8000), 64, seed=0)


def test_pure_steps_cost_exactly_what_step_time_says() -> None:
    serial = roofline.serial_phases()
    for entries in (CHUNK, DECODES, [(512, 512), (300, 2000)], [(1, 1), (1, 40)]):
        assert serial(MODEL, HW, entries, 2, 1e-4, 1e-6) == \
            roofline.step_time(MODEL, HW, entries, 2, 1e-4, 1e-6)


def test_a_mixed_step_costs_its_phases_priced_apart_and_added() -> None:
    overhead = 2e-4  # the fixed per-step overhead is paid once, per-token ones per token
    chunk = roofline.step_time(MODEL, HW, CHUNK, 2, 0.0, 1e-7).time
    decodes = roofline.step_time(MODEL, HW, DECODES, 2, overhead, 1e-7).time
    whole = roofline.step_time(MODEL, HW, CHUNK + DECODES, 2, overhead, 1e-7).time
    full = roofline.serial_phases()(MODEL, HW, CHUNK + DECODES, 2, overhead, 1e-7)
    half = roofline.serial_phases(interference=0.5)(MODEL, HW, CHUNK + DECODES, 2, overhead,
                                                     1e-7)
    assert full.time == pytest.approx(chunk + decodes, rel=1e-12)
    assert half.time == pytest.approx((whole + chunk + decodes) / 2, rel=1e-12)
    # the optimism it removes: the decodes' weight read hid the 512-token chunk's FLOPs almost
    # whole, so the max() step is far under the sum (here by more than 40% of it)
    assert whole < 0.6 * full.time
    assert float(roofline.serial_phases(interference=0.0)(MODEL, HW, CHUNK + DECODES)) == \
        roofline.step_time(MODEL, HW, CHUNK + DECODES).time


def test_on_a_tensor_parallel_layout_it_wraps_the_layouts_timer() -> None:
    layout = parallel.ParallelConfig(2)
    serial = roofline.serial_phases(parallel.step_timer(layout))
    parts = [parallel.parallel_step_time(MODEL, HW, e, layout).time for e in (CHUNK, DECODES)]
    assert serial(MODEL, HW, CHUNK + DECODES).time == pytest.approx(sum(parts), rel=1e-12)
    assert serial(MODEL, HW, DECODES).time == parts[1]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_bad_interference_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match="interference must be between 0"):
        roofline.serial_phases(interference=bad)
    with pytest.raises(ValueError, match="interference must be between 0"):
        simulate_fleet(MODEL, HW, rag(4), num_replicas=1, interference=bad)


def test_simulate_and_the_fleet_price_the_same_interference() -> None:
    work = rag(40)
    plain = simulate(MODEL, HW, work, max_num_batched_tokens=512).summary(SLO)
    serial = simulate(MODEL, HW, work, max_num_batched_tokens=512,
                      step_time=roofline.serial_phases()).summary(SLO)
    fleet = simulate_fleet(MODEL, HW, work, num_replicas=1, max_num_batched_tokens=512,
                           enable_prefix_caching=False, interference=1.0).summary(SLO)
    assert serial.tpot.p50 > 1.2 * plain.tpot.p50  # the decodes now pay for the chunks
    assert fleet.tpot.p50 == serial.tpot.p50 and fleet.ttft.p99 == serial.ttft.p99


def test_the_disaggregated_pools_do_not_mix_phases_so_price_the_same() -> None:
    # prompts of 16k + 1 tokens: the decode replica recomputes one token, a decode's worth
    aligned = [dataclasses.replace(s, prompt_len=16 * (s.prompt_len // 16) + 1) for s in rag()]
    runs = [simulate_disaggregated(MODEL, HW, aligned, prefill_gpus=2, decode_gpus=2,
                                   interference=f) for f in (0.0, 1.0)]
    times = [[(o.metrics.first_token_time, o.metrics.finished_time) for o in r.outputs]
             for r in runs]
    assert times[0] == times[1]
    # other prompts leave a tail of up to 16 tokens to recompute beside the running decodes:
    # that step is a mixed one, and the bound prices it (a little later, never earlier)
    tails = [simulate_disaggregated(MODEL, HW, rag(), prefill_gpus=2, decode_gpus=2,
                                    interference=f).summary() for f in (0.0, 1.0)]
    assert tails[1].tpot.p50 > tails[0].tpot.p50


def test_the_tuned_colocated_chunk_is_chosen_under_the_same_bound() -> None:
    # at a 40 ms TPOT the recipe's max() step admits a 2,048-token chunk beside 55 decodes;
    # priced apart, that step is over the bound and the chunk halves
    loose = {"ttft": 1.0, "tpot": 0.04}
    optimistic = tuned_colocated_kwargs(MODEL, HW, rag(), loose)
    priced = tuned_colocated_kwargs(MODEL, HW, rag(), loose, interference=1.0)
    assert priced["max_num_seqs"] == optimistic["max_num_seqs"]
    assert priced["max_num_batched_tokens"] == optimistic["max_num_batched_tokens"] // 2


def test_with_interference_priced_disaggregation_beats_every_colocated_chunk_on_rag() -> None:
    work = rag(200)
    c = compare_disaggregation(MODEL, HW, work, SLO, prefill_gpus=2, decode_gpus=2,
                               interference=1.0)
    best_colocated = max(
        simulate_fleet(MODEL, HW, work, num_replicas=4, enable_prefix_caching=False,
                       max_num_seqs=c.colocated_kwargs["max_num_seqs"],
                       max_num_batched_tokens=chunk, interference=1.0).summary(SLO).goodput
        for chunk in (256, 1024, 4096))
    assert c.goodput[0] > 1.3 * max(best_colocated, c.goodput[1])
