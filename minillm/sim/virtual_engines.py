"""Pipeline parallelism in the simulator: p batches in flight, as vLLM's virtual engines.

Under pipeline parallelism a step's stages run on different GPUs one after another, so an
engine that waited for each step before scheduling the next would leave p - 1 of its p stages
idle. vLLM keeps p batches in flight instead (its "virtual engines"): p schedulers, each owning
1/p of the KV blocks and taking each new request when it has the fewest unfinished ones, and
each scheduler's next batch entering the first stage as soon as that stage is free. One batch
is a micro-batch of the pipeline, and the gaps where a stage waits are its bubbles. As in vLLM
V0's Scheduler (vllm/core/scheduler.py: one per virtual engine, each built from the same
SchedulerConfig, dividing cache_config.num_gpu_blocks by pipeline_parallel_size), every virtual
engine here has the whole max_num_seqs and max_num_batched_tokens and 1/p of the blocks.

Here each virtual engine is a minillm.simulator.Simulator (the engine's own Scheduler and
BlockManager), stepped in order of virtual time by minillm.fleet.Fleet, and one Pipeline times
them all: stage s of a step starts when the step's stage s - 1 is done and stage s has finished
the step before it (parallel.parallel_step_time prices each stage: its layers' roofline time,
its all-reduces and its send to the next stage). A virtual engine's steps still follow one
another, so a request's TPOT is still the sum of the stages; what the pipeline adds is p times
the requests in flight.

Model (stated so it can be argued with): stages are FIFO, one micro-batch at a time; a step's
host overhead comes before its first stage; swaps are priced on the host link as in simulate
but do not hold a stage. Optimistic in that a micro-batch's send never waits for the link;
as vLLM's own scheduling, unbalanced micro-batches (a long prefill in one virtual engine) hold
up the others at every stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minillm.calc import parallel
from minillm.config import EngineConfig
from minillm.model_config import ModelConfig
from minillm.request import Request
from minillm.sim.fleet import Fleet
from minillm.sim.router import ReplicaView
from minillm.sim.simulated_engine import Simulator
from minillm.trace import StepRecord
from minillm.workloads.streams import RequestSpec


@dataclass(frozen=True)
class PipelinedStep:
    """A step's cost as its virtual engine sees it: time from the engine's clock (when the step
    was ready) to the end of its last stage; waited: the part of it spent queued for stages."""

    time: float
    waited: float


class Pipeline:
    """The p stages' GPU groups, shared by the virtual engines: when each is next free."""

    def __init__(self, layout: parallel.ParallelConfig):
        self.layout = layout
        self.free = [0.0] * layout.pipeline_parallel_size

    def timer(self, engine: Simulator) -> Any:
        """engine's cost model: prices a step on the layout, then runs it through the stages
        from engine.clock (when the step is ready: its swaps are done, and Simulator.execute
        prices before it moves the clock on)."""
        def price(model: ModelConfig, hw: Any, entries: Sequence[tuple[int, int]],
                  *args: float, **kwargs: float) -> PipelinedStep:
            cost = parallel.parallel_step_time(model, hw, entries, self.layout, *args, **kwargs)
            ready = engine.clock
            t, busy = ready + cost.overhead, cost.overhead
            for s, stage in enumerate(cost.stages):
                t = max(t, self.free[s]) + stage.time
                self.free[s] = t
                busy += stage.time
            return PipelinedStep(t - ready, t - ready - busy)
        return price


def fewest_unfinished(spec: RequestSpec, engines: list[ReplicaView]) -> int:
    """vLLM's rule: a new request goes to the virtual engine with the fewest unfinished
    requests (the first on a tie)."""
    return min(range(len(engines)), key=lambda k: engines[k].load)


def run_pipelined(model: ModelConfig, hw: Any, config: EngineConfig,
                  layout: parallel.ParallelConfig, workload: Sequence[RequestSpec],
                  make_engine: Any) -> tuple[list[Request], list[StepRecord], dict[str, int]]:
    """Serve workload on layout.pipeline_parallel_size virtual engines, each given config with
    1/p of its KV blocks; make_engine(config) -> Simulator. Returns the requests in
    workload order, every engine's steps in order of start (renumbered), and the engines'
    counters summed."""
    p = layout.pipeline_parallel_size
    assert config.num_kv_blocks is not None
    share = dataclasses.replace(config, num_kv_blocks=config.num_kv_blocks // p)
    pipeline = Pipeline(layout)
    engines: list[Simulator] = []
    for _ in range(p):
        engine = make_engine(share)
        engine.step_time = pipeline.timer(engine)
        engines.append(engine)
    for index, spec in enumerate(workload):
        engines[0].check_fits(index, spec)
    requests, _ = Fleet(engines, fewest_unfinished, draw_token_ids=False).run(workload)
    records = sorted((r for e in engines for r in e.trace), key=lambda r: (r.start, r.end))
    trace = [dataclasses.replace(r, step=i) for i, r in enumerate(records)]
    stats: dict[str, int] = {}
    for engine in engines:
        for key, value in engine.stats().items():
            stats[key] = stats.get(key, 0) + value
    return requests, trace, stats
