"""Pipeline parallelism in the simulator keeps p batches in flight (vLLM's virtual engines):
a lone request sees the stages one after another, a busy engine fills the pipeline, and the
shared stages run one micro-batch at a time, first come first served."""

from __future__ import annotations

import pytest

from minillm import simulate
from minillm.calc import parallel
from minillm.calc.parallel import ParallelConfig
from minillm.sim.virtual_engines import Pipeline, PipelinedStep, fewest_unfinished
from minillm.workloads import streams as workload

pytestmark = pytest.mark.ch11

L70 = "llama-3-70b"


class Clocked:
    """Stands in for a Simulator: the pipeline only reads its clock."""

    def __init__(self, clock: float = 0.0):
        self.clock = clock


def test_stages_are_first_come_first_served() -> None:
    layout = ParallelConfig(4, 2)
    pipe = Pipeline(layout)
    a, b = Clocked(0.0), Clocked(0.0)
    entries = [(1, 1024)] * 16
    cost = parallel.parallel_step_time(L70, "H100-SXM", entries, layout)
    s0, s1 = (s.time for s in cost.stages)
    first = pipe.timer(a)(L70, "H100-SXM", entries)
    second = pipe.timer(b)(L70, "H100-SXM", entries)
    assert first == PipelinedStep(s0 + s1, 0.0)  # an empty pipeline: the stages in turn
    # b was ready at 0 too, but enters stage 0 when a leaves it, and stage 1 when a leaves it.
    assert second.time == pytest.approx(s0 + max(s0 + s1, s0 + s0) - s0 + s1 - s0 + s0)
    assert second.time == pytest.approx(max(s0 + s0, s0 + s1) + s1)
    assert second.waited == pytest.approx(second.time - s0 - s1)
    assert pipe.free == [pytest.approx(2 * s0), pytest.approx(second.time)]


def test_a_lone_request_sees_every_stage_in_turn() -> None:
    """One request cannot overlap with itself: its TPOT is the summed stages, exactly what one
    step at a time gives."""
    alone = [workload.RequestSpec(arrival_time=0.0, prompt_len=1000, output_len=50)]
    layout = ParallelConfig(4, 2)
    pipelined = simulate(L70, "H100-SXM", alone, tensor_parallel_size=4,
                         pipeline_parallel_size=2, record_block_tables=False)
    one_at_a_time = simulate(L70, "H100-SXM", alone, tensor_parallel_size=4,
                             pipeline_parallel_size=2, record_block_tables=False,
                             step_time=parallel.step_timer(layout))
    a, b = pipelined.outputs[0].metrics, one_at_a_time.outputs[0].metrics
    assert a.token_times == pytest.approx(b.token_times)
    assert a.tpot == pytest.approx(parallel.decode_tpot(L70, "H100-SXM", layout, 1, 1025),
                                   rel=0.05)


def test_a_busy_engine_fills_the_pipeline() -> None:
    """p virtual engines each running the batch one engine would run give nearly p times its
    throughput: the stages that sat idle now work on the other engines' micro-batches. The
    steps overlap in the trace, and every block comes back."""
    per_engine = 48
    for pp in (2, 4):
        layout = ParallelConfig(4, pp)

        def run(clients: int, stages: int, **kwargs):
            busy = workload.closed_loop(3 * clients, clients, (200, 600), (100, 200), seed=5)
            return simulate(L70, "H100-SXM", busy, tensor_parallel_size=4,
                            pipeline_parallel_size=stages, record_block_tables=False, **kwargs)

        pipelined = run(per_engine * pp, pp)
        one_at_a_time = run(per_engine, pp, step_time=parallel.step_timer(layout))
        ratio = (pipelined.summary().output_throughput
                 / one_at_a_time.summary().output_throughput)
        assert 0.75 * pp <= ratio <= 1.05 * pp, (pp, ratio)  # less the fill and the drain
        trace = pipelined.trace
        assert [r.step for r in trace] == list(range(len(trace)))
        assert any(nxt.start < cur.end for cur, nxt in zip(trace, trace[1:])), "in flight"
        assert pipelined.stats["num_free_blocks"] == pipelined.stats["num_blocks"]


def test_new_requests_go_to_the_engine_with_the_fewest_unfinished() -> None:
    class View:
        def __init__(self, load: int):
            self.load = load

    assert fewest_unfinished(None, [View(3), View(1), View(1)]) == 1
    assert fewest_unfinished(None, [View(0), View(0)]) == 0
