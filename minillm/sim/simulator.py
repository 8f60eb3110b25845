"""simulate(): a workload through the simulated engine (minillm.simulated_engine), priced on a
GPU by the roofline, with the same outputs, trace and stats an LLM run gives; goodput curves.

Under pipeline parallelism p virtual engines keep p batches in flight (minillm.virtual_engines);
otherwise one Simulator steps the workload. Its pricing options become one Pricing
(minillm.sim.pricing). Simulator and StepTimer are importable from here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minillm.calc import models, parallel, roofline
from minillm.config import EngineConfig
from minillm.metrics import Summary, summarize
from minillm.model_config import ModelConfig
from minillm.request import Request, RequestOutput
from minillm.scheduler import AdmissionPolicy
from minillm.sim.pricing import Pricing, StepTimer
from minillm.sim.simulated_engine import Simulator, no_gc
from minillm.sim.simulated_pool import resolve_config
from minillm.sim.virtual_engines import run_pipelined
from minillm.spec.simulate import split_speculation
from minillm.trace import StepRecord
from minillm.workloads.streams import RequestSpec, Workload


@dataclass
class SimulationResult:
    """What simulate returns: the same outputs, trace and stats an LLM run gives.

    outputs: one RequestOutput per request, in workload order (metrics on the virtual clock, in
    seconds from the start of the run; token_ids fake). prompt_token_ids are the workload's
    (RequestSpec.token_ids) with prefix caching on; with it off no decision reads token values,
    so they are placeholders of the right length, which spares drawing millions.
    stats: LLM.stats()'s counters. wall_time: seconds the simulation took on this machine.
    """

    outputs: list[RequestOutput]
    trace: list[StepRecord]
    stats: dict[str, int]
    config: EngineConfig
    model: ModelConfig
    hardware: roofline.Hardware
    wall_time: float
    draft_model: ModelConfig | None = None  # the draft priced under speculative decoding
    layout: parallel.ParallelConfig = parallel.ParallelConfig()  # the TP x PP GPUs it ran on

    def summary(self, slo: dict[str, float] | None = None) -> Summary:
        """minillm.metrics.summarize over every request; slo as in meets_slo (seconds)."""
        return summarize((o.metrics for o in self.outputs), slo)


def simulate(model: str | ModelConfig, hw: str | roofline.Hardware,
             workload: Workload | Sequence[RequestSpec], *,
             dtype_bytes: int = 2,
             overheads: roofline.StepOverheads | Mapping[str, float] | None = None,
             gpu_memory_utilization: float = 0.9, record_block_tables: bool = True,
             step_time: StepTimer | None = None, kv_dtype_bytes: float | None = None,
             acceptance_rate: float | None = None, draft_model: str | ModelConfig | None = None,
             tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
             admission_policy: AdmissionPolicy | None = None,
             **engine_kwargs: Any) -> SimulationResult:
    """Serve workload with the real scheduler on hw, timing each step with the roofline model.

    model: a name (minillm.models) or a ModelConfig; hw: a name or a roofline.Hardware.
    workload: open loop (arrival times honoured; a plain list of RequestSpec is one) or closed
    loop (workload.concurrency requests in flight, the next sent as one finishes).
    engine_kwargs: EngineConfig's (block_size, max_num_seqs, ...); without num_kv_blocks the
    pool is what gpu_memory_utilization of hw.memory leaves after the weights.
    The options, each checked into one value at the door:
    - pricing (one minillm.sim.pricing.Pricing): dtype_bytes per weight, and per K/V number
      unless kv_dtype_bytes (1 for fp8: the pool's blocks and a swap's bytes too); overheads,
      what a step costs beyond its roof (roofline.StepOverheads or a dict of its fields, fitted
      by minillm.calibration); step_time, the cost model, called as roofline.step_time is
      (None: the roofline's, or parallel_step_time's on several GPUs).
    - speculation: speculative_config={"method": "ngram", "num_speculative_tokens": k} (an
      engine kwarg) with acceptance_rate, each proposal's chance of acceptance (i.i.d., seeded
      by seed=); method "draft_model" prices draft_model's forwards too (a name or ModelConfig;
      default: speculative_config's "model" folder). minillm.spec.simulate; stats() adds the
      spec_decode_* counters.
    - layout: tensor_parallel_size x pipeline_parallel_size GPUs of hw (vLLM's names,
      minillm.parallel): each holds its shard of weights and K/V, each step is priced with its
      all-reduces; under PP, p virtual engines keep p batches in flight (minillm.virtual_engines;
      with a step_time of one's own, one step at a time). Not with speculative decoding.
    - admission_policy: Scheduler.admission_policy (minillm.scheduler); not under PP.
    record_block_tables=False leaves StepRecord.block_tables, cached_blocks and prefix_cache
    empty, which saves time and memory on runs of thousands of requests (see Simulator).
    """
    mc, hardware = models.as_config(model), roofline.get_hardware(hw)
    layout = parallel.ParallelConfig(tensor_parallel_size, pipeline_parallel_size).check(mc)
    engine_kwargs, speculation = split_speculation(engine_kwargs, acceptance_rate, draft_model,
                                                   engine_kwargs.get("seed", 0))
    pipelined = layout.pipeline_parallel_size > 1 and step_time is None
    _check_combination(layout, speculation, pipelined, admission_policy)
    draft = speculation.draft if speculation else None
    pricing = Pricing(dtype_bytes, kv_dtype_bytes, overheads, step_time)
    config = resolve_config(mc, hardware, dtype_bytes, gpu_memory_utilization, engine_kwargs,
                            kv_dtype_bytes, draft, layout)

    def make_engine(engine_config: EngineConfig) -> Simulator:
        return Simulator(mc, hardware, engine_config, pricing, record_block_tables,
                         speculation=speculation, layout=layout)

    start = time.perf_counter()
    with no_gc():  # millions of small objects and no cycles: collections would only rescan
        requests, trace, stats = (  # under PP, p batches in flight, one per virtual engine
            run_pipelined(mc, hardware, config, layout, workload, make_engine) if pipelined else
            _run(make_engine(config), workload, admission_policy))
        outputs = [RequestOutput.of(r) for r in requests]
    return SimulationResult(outputs, trace, stats, config, mc, hardware,
                            wall_time=time.perf_counter() - start,
                            draft_model=draft, layout=layout)


def _run(sim: Simulator, workload: Workload | Sequence[RequestSpec],
         admission_policy: AdmissionPolicy | None
         ) -> tuple[list[Request], list[StepRecord], dict[str, int]]:
    """One simulated engine serves the workload: its requests, trace and stats."""
    sim.scheduler.admission_policy = admission_policy
    return sim.run(workload), sim.trace, sim.stats()


def _check_combination(layout: parallel.ParallelConfig, speculation: object, pipelined: bool,
                       admission_policy: AdmissionPolicy | None) -> None:
    """Refuse the options simulate cannot combine, naming what to change."""
    if layout.world_size > 1 and speculation is not None:
        raise ValueError("speculative decoding is not modelled on several GPUs; use "
                         "tensor_parallel_size=1 and pipeline_parallel_size=1 with it")
    if pipelined and admission_policy is not None:
        raise ValueError("admission_policy is not plumbed into pipeline-parallel virtual "
                         "engines; use pipeline_parallel_size=1 with it")


def goodput_curve(model: str | ModelConfig, hw: str | roofline.Hardware, rates: Sequence[float],
                  slo: dict[str, float], make_workload: Callable[[float], Workload],
                  **kwargs: Any
                  ) -> list[tuple[float, Summary]]:
    """(rate, summary under slo) for each rate in requests/s; make_workload(rate) -> Workload.

    kwargs go to simulate. Goodput (requests/s that meet the SLO) rises with the offered rate
    until queueing breaks the TTFT bound, then collapses: the knee is the rate where it peaks.
    """
    kwargs.setdefault("record_block_tables", False)
    return [(rate, simulate(model, hw, make_workload(rate), **kwargs).summary(slo))
            for rate in rates]


def knee(curve: Sequence[tuple[float, Summary]]) -> float:
    """The rate of a goodput_curve with the highest goodput (requests/s)."""
    return max(curve, key=lambda point: point[1].goodput or 0.0)[0]
