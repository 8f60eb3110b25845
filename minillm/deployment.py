"""A deployment on many GPUs, and its modelled run under a workload and an SLO.

A Deployment is what an operator writes down: each engine's layout (tensor_parallel_size x
pipeline_parallel_size GPUs), how many engines (replicas: data parallelism), and each engine's
scheduler settings under vLLM's names. run_deployment prices it in the simulator, the way
minillm.recipe.recommend prices every configuration it tries and the chapter 11 capstone grades
a reader's: a router spreads requests evenly, so one replica serving every replicas-th request
stands for all of them, and the fleet's goodput is replicas times its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from minillm import parallel
from minillm.hardware import Hardware, get_hardware
from minillm.metrics import Summary, meets_slo, percentile
from minillm.models import ModelLike
from minillm.simulator import SimulationResult, simulate
from minillm.sizing import cost_per_million_tokens
from minillm.workload import RequestSpec, Workload

GPU_MEMORY_UTILIZATION = 0.9  # the share of memory the engine takes (vLLM's default)


@dataclass(frozen=True)
class Deployment:
    """replicas engines of tensor_parallel_size x pipeline_parallel_size GPUs each, with their
    scheduler settings (vLLM's defaults where it has one)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    replicas: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "replicas",
                     "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be True or False, got "
                             f"{self.enable_chunked_prefill!r}")

    @property
    def layout(self) -> parallel.ParallelConfig:
        return parallel.ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.replicas

    def engine_kwargs(self) -> dict[str, Any]:
        """One replica's settings as simulate()'s (and vLLM's) keyword arguments."""
        kwargs = asdict(self)
        del kwargs["replicas"]
        return kwargs


@dataclass(frozen=True)
class DeploymentRun:
    """A deployment's modelled run. result: one replica's simulation; shares: the share of its
    finished requests meeting each SLO bound alone and "all" of them; goodput: the fleet's
    requests/s meeting the SLO; dollars_per_million_tokens: output tokens at the workload's
    rate, None on an unpriced GPU."""

    deployment: Deployment
    result: SimulationResult
    summary: Summary
    shares: dict[str, float]
    goodput: float
    dollars_per_million_tokens: float | None

    @property
    def attainment(self) -> float:
        return self.shares["all"]


def typical_length(workload: Sequence[RequestSpec]) -> int:
    """Tokens of a typical sequence of workload, as the recipe sizes the KV cache and the chunk
    for it: the 90th percentile of prompt + output."""
    return math.ceil(percentile([s.prompt_len + s.output_len for s in workload], 90))


def replica_share(workload: Sequence[RequestSpec], replicas: int) -> Workload:
    """The requests one of replicas engines serves under an even router: every replicas-th
    request (arrival times kept, so its rate is 1/replicas of the whole); a closed loop's
    concurrency is split too."""
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive int, got {replicas!r}")
    specs = list(workload)[::replicas]
    concurrency = getattr(workload, "concurrency", None)
    rate = getattr(workload, "rate", None)
    return Workload(specs, None if concurrency is None else max(concurrency // replicas, 1),
                    None if rate is None else rate / replicas)


def attainment(result: SimulationResult, slo: dict[str, float]) -> dict[str, float]:
    """The share of finished requests that meet each bound of slo alone, and "all": every one."""
    done = [o.metrics for o in result.outputs if o.metrics.finished_time is not None]
    shares = {name: sum(meets_slo(m, {name: bound}) for m in done) / len(done)
              for name, bound in slo.items()}
    shares["all"] = sum(meets_slo(m, slo) for m in done) / len(done)
    return shares


def run_deployment(model: ModelLike, hw: Hardware | str, workload: Sequence[RequestSpec],
                   slo: dict[str, float], deployment: Deployment, *, sim_requests: int = 300,
                   overheads: dict[str, float] | None = None) -> DeploymentRun:
    """Simulate one replica of deployment on its share of workload (at most sim_requests
    requests), and scale goodput and cost to the fleet. overheads: simulate()'s step overheads
    (None: the roofline's peaks). ValueError from simulate when the layout does not fit."""
    device = get_hardware(hw)
    share = replica_share(workload, deployment.replicas)[:sim_requests]
    result = simulate(model, device, share, record_block_tables=False,
                      gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                      **deployment.engine_kwargs(), **(overheads or {}))
    summary = result.summary(slo)
    dollars = None
    if device.dollars_per_hour is not None and summary.output_throughput > 0:
        dollars = cost_per_million_tokens(device.dollars_per_hour * deployment.gpus,
                                          summary.output_throughput * deployment.replicas)
    return DeploymentRun(deployment, result, summary, attainment(result, slo),
                         (summary.goodput or 0.0) * deployment.replicas, dollars)
