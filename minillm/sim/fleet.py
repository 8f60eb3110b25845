"""A fleet in the simulator: N replicas behind a router, on one shared virtual clock.

Each replica is a minillm.simulator.Simulator, the engine's own Scheduler and BlockManager with
its own KV pool (prefix caching on), timed by the roofline model. The fleet interleaves them by
virtual time: of the pending arrival and the replicas' next steps, the earliest goes first (an
arrival before a step that starts at the same instant, as one simulator admits it; ties between
replicas go to the lower index). An arrival is routed when the clock reaches it, to the replica
the router picks, and joins that replica's queue at its next step boundary.

A step is applied when it starts, so a router that reads a replica's cache (ReplicaView) sees
it as it will stand after its step in flight (the blocks it is computing count as cached, its
finishing requests as gone): the true state with a lookahead of at most one step, which no real
router has.

Routers (minillm.router): "round_robin" cycles through the replicas, blind to the cache;
"prefix_aware" (PrefixAwareRouter, the oracle) sends a request to the replica whose true cache
holds the longest prefix of it unless that would overload it; "approximate_tree"
(ApproximateTreeRouter, as SGLang's router) routes on its own bounded tree of what it sent each
replica and never reads a cache; or any callable router(spec, replicas) -> replica index.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from minillm.calc import models, parallel, roofline
from minillm.config import EngineConfig
from minillm.metrics import Summary, summarize
from minillm.model_config import ModelConfig
from minillm.request import Request, RequestOutput
from minillm.sim.pricing import Pricing, StepTimer
from minillm.sim.router import (
    ApproximateTreeRouter,
    PrefixAwareRouter,
    ReplicaView,
    RoundRobinRouter,
    Router,
    RoutingName,
    make_router,
)
from minillm.sim.simulated_engine import Simulator, no_gc
from minillm.sim.simulated_pool import resolve_config
from minillm.trace import StepRecord
from minillm.workloads.prefixes import TokenRequestSpec
from minillm.workloads.streams import Arrivals, RequestSpec, Workload

# The routers live in minillm.router; a fleet's user finds them here too.
__all__ = ["ApproximateTreeRouter", "FleetResult", "PrefixAwareRouter", "ReplicaResult",
           "ReplicaView", "RoundRobinRouter", "Router", "RoutingName", "hit_rate", "make_router",
           "simulate_fleet"]


class HitRates:
    """hit_rate and token_hit_rate of whatever `stats` (LLM.stats()-style counters) holds."""

    stats: dict[str, int]

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hits / queried full blocks (nan if nothing was queried)."""
        return hit_rate(self.stats)

    @property
    def token_hit_rate(self) -> float:
        """Prompt tokens whose K/V were reused / prompt tokens looked up."""
        return hit_rate(self.stats, "tokens")


@dataclass(frozen=True)
class ReplicaResult(HitRates):
    """One replica's share of a fleet run: its requests (in workload order), counters, steps."""

    index: int
    outputs: list[RequestOutput]
    stats: dict[str, int]
    trace: list[StepRecord]

    @property
    def num_requests(self) -> int:
        return len(self.outputs)

    def summary(self, slo: dict[str, float] | None = None) -> Summary | None:
        """Latency and throughput over this replica's requests; None if it served none."""
        return summarize((o.metrics for o in self.outputs), slo) if self.outputs else None


@dataclass(frozen=True)
class FleetResult(HitRates):
    """A fleet run: outputs in workload order, which replica served each, and each replica's
    results; times on the virtual clock (s), wall_time on this machine (s)."""

    outputs: list[RequestOutput]
    assignment: list[int]
    replicas: list[ReplicaResult]
    routing: str
    config: EngineConfig
    model: ModelConfig
    hardware: roofline.Hardware
    wall_time: float

    @property
    def stats(self) -> dict[str, int]:
        """The replicas' counters (LLM.stats()'s), summed over the fleet."""
        return {key: sum(r.stats[key] for r in self.replicas) for key in self.replicas[0].stats}

    def summary(self, slo: dict[str, float] | None = None) -> Summary:
        """minillm.metrics.summarize over every request of the fleet."""
        return summarize((o.metrics for o in self.outputs), slo)

    def table(self) -> str:
        """Per replica and overall: requests, hit rates (blocks, tokens), TTFT p50/p99 (ms),
        output tokens/s; nan where a replica served nothing."""
        lines = [f"routing={self.routing}",
                 f"{'replica':>7} {'requests':>8} {'hit blk':>8} {'hit tok':>8} "
                 f"{'TTFT p50':>9} {'TTFT p99':>9} {'tok/s':>8}"]
        rows = [(str(r.index), r.num_requests, r.hit_rate, r.token_hit_rate, r.summary())
                for r in self.replicas]
        rows.append(("all", len(self.outputs), self.hit_rate, self.token_hit_rate,
                     self.summary()))
        for name, n, blocks, tokens, s in rows:
            p50, p99, rate = ((s.ttft.p50 * 1e3, s.ttft.p99 * 1e3, s.output_throughput) if s
                              else (math.nan,) * 3)
            lines.append(f"{name:>7} {n:>8} {blocks:>8.1%} {tokens:>8.1%} "
                         f"{p50:>9.1f} {p99:>9.1f} {rate:>8.0f}")
        return "\n".join(lines)


def hit_rate(stats: dict[str, int], unit: Literal["blocks", "tokens"] = "blocks") -> float:
    """Prefix-cache hits / lookups from LLM.stats()-style counters; nan if nothing was looked up.

    blocks: full blocks found / full blocks queried; tokens: prompt tokens reused / prompt
    tokens looked up (each prompt but its last token)."""
    hits, queries = (("prefix_cache_hits", "prefix_cache_queries") if unit == "blocks" else
                     ("prefix_cache_hit_tokens", "prefix_cache_query_tokens"))
    return stats[hits] / stats[queries] if stats[queries] else math.nan


def simulate_fleet(model: str | ModelConfig, hw: str | roofline.Hardware,
                   workload: Workload | Sequence[RequestSpec], *, num_replicas: int = 4,
                   routing: RoutingName | Router = "round_robin", load_bound: float = 8,
                   dtype_bytes: int = 2,
                   overheads: roofline.StepOverheads | Mapping[str, float] | None = None,
                   gpu_memory_utilization: float = 0.9, record_block_tables: bool = False,
                   step_time: StepTimer | None = None,
                   kv_dtype_bytes: float | None = None, tensor_parallel_size: int = 1,
                   interference: float = 0.0, **engine_kwargs: Any) -> FleetResult:
    """Serve workload on num_replicas simulated replicas of model on hw behind a router.

    routing: "round_robin", "prefix_aware" (PrefixAwareRouter(load_bound), the oracle that reads
    the replicas' caches), "approximate_tree" (ApproximateTreeRouter(balance_abs_threshold=
    load_bound), which remembers what it sent) or a callable router(spec, replicas) -> index
    into replicas, called once per request at its arrival with the spec (its ids in
    spec.prompt_ids) and one ReplicaView per replica; routing is a pure function of the
    workload and the router, so the same arguments route the same way (a named router is made
    fresh for each run; a callable that keeps state carries it from run to run).
    load_bound: requests a replica may carry beyond the least loaded and still be picked for
    its cache (prefix_aware; for approximate_tree, the imbalance beyond which it routes by load).
    engine_kwargs: EngineConfig's, for every replica; prefix caching is on unless
    enable_prefix_caching=False is passed. The pool, dtype_bytes,
    kv_dtype_bytes (1 for an int8 or fp8 KV cache: more blocks per replica, fewer KV bytes per
    step), overheads, gpu_memory_utilization and step_time are as in simulate, and
    so is record_block_tables, off by default here since a fleet run is long.
    tensor_parallel_size: GPUs of each replica (as in simulate: the pool is what each GPU
    holds of its shard, steps are priced by parallel_step_time), so the fleet has
    num_replicas x tensor_parallel_size GPUs.
    interference: how a step that mixes a prefill chunk with decodes is priced
    (roofline.serial_phases over the replicas' cost model): 0, the default, the roofline's
    max(compute, memory) of the whole step; 1, its two phases as two steps, added.
    A closed-loop workload keeps workload.concurrency requests in flight across the fleet.
    """
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    router = make_router(routing, load_bound)
    mc, hardware = models.as_config(model), roofline.get_hardware(hw)
    engine_kwargs.setdefault("enable_prefix_caching", True)
    layout = parallel.ParallelConfig(tensor_parallel_size).check(mc)
    pricing = Pricing(dtype_bytes, kv_dtype_bytes, overheads, step_time, interference)
    config = resolve_config(mc, hardware, dtype_bytes, gpu_memory_utilization, engine_kwargs,
                            kv_dtype_bytes, None, layout)
    sims = [Simulator(mc, hardware, config, pricing, record_block_tables, layout=layout)
            for _ in range(num_replicas)]
    for i, spec in enumerate(workload):
        sims[0].check_fits(i, spec)
    start = time.perf_counter()
    with no_gc():
        requests, assignment = Fleet(sims, router).run(workload)
    outputs = [RequestOutput.of(r) for r in requests]
    replicas = [ReplicaResult(k, [o for o, a in zip(outputs, assignment) if a == k],
                              sim.stats(), sim.trace) for k, sim in enumerate(sims)]
    name = (routing if isinstance(routing, str)
            else getattr(routing, "__name__", type(routing).__name__))
    return FleetResult(outputs, assignment, replicas, name, config, mc, hardware,
                       wall_time=time.perf_counter() - start)


class Fleet:
    """Simulators stepped in order of virtual time, with arrivals routed as the clock meets them."""

    def __init__(self, sims: list[Simulator], router: Router, *, draw_token_ids: bool = True):
        self.sims, self.router = sims, router
        self.views = [ReplicaView(k, sim) for k, sim in enumerate(sims)]
        # A router that reads prompts (prefix-aware) needs their ids drawn at arrival; one
        # that only counts load does not, and drawing them would cost more than routing.
        self.draw_token_ids = draw_token_ids

    def run(self, workload: Sequence[RequestSpec]) -> tuple[list[Request], list[int]]:
        """Serve every request; returns the Requests and their replicas, in workload order."""
        arrivals = Arrivals(workload)
        requests: list[Request | None] = [None] * len(workload)
        assignment: list[int | None] = [None] * len(workload)  # each request's replica
        while arrivals or any(s.scheduler.has_unfinished_requests() for s in self.sims):
            busy = [s for s in self.sims if s.scheduler.has_unfinished_requests()]
            sim = min(busy, key=lambda s: s.clock) if busy else None  # min keeps the lower index
            if arrivals and (sim is None or arrivals.next_time() <= sim.clock):
                arrival, i = arrivals.pop()
                assignment[i], requests[i] = self.route(i, workload[i], arrival)
                continue
            assert sim is not None
            for _ in sim.step():
                arrivals.finished(sim.clock)
        for sim in self.sims:
            bm = sim.block_manager
            if bm.num_free_blocks != bm.num_blocks:
                raise RuntimeError(f"a KV block was lost on a replica: {sim.stats()}")
        assert None not in assignment and None not in requests, "a request was never routed"
        return requests, assignment  # type: ignore[return-value]

    def route(self, index: int, spec: RequestSpec, arrival: float) -> tuple[int, Request]:
        """Ask the router for a replica at arrival and queue the request there."""
        vocab = self.sims[0].model.vocab_size
        if self.draw_token_ids and not isinstance(spec, TokenRequestSpec):  # once, for both
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(RequestSpec)}
            spec = TokenRequestSpec(**fields, prompt_ids=tuple(spec.token_ids(vocab)))
        choice = self.router(spec, self.views)
        if isinstance(choice, bool) or not isinstance(choice, int) or \
                not 0 <= choice < len(self.sims):
            raise ValueError(f"the router sent request {index} to replica {choice!r}; it must "
                             f"return an index in range({len(self.sims)})")
        sim = self.sims[choice]
        if not sim.scheduler.has_unfinished_requests():  # idle: its clock waits for this one
            sim.clock = max(sim.clock, arrival)
        return choice, sim.add_request(index, spec, arrival)
