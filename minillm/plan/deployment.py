"""A deployment on many GPUs, and its modelled run under a workload and an SLO.

A Deployment is what an operator writes down: each engine's layout (tensor_parallel_size x
pipeline_parallel_size GPUs), how many engines (replicas: data parallelism), and each engine's
scheduler settings under vLLM's names. run_deployment prices it in the simulator, the way
minillm.recipe.recommend prices every configuration it tries and the chapter 11 capstone grades
a reader's: a router spreads requests evenly, so one replica serving every replicas-th request
stands for all of them, and the fleet's goodput is replicas times its own.

Goodput and cost are read in the run's steady state (minillm.metrics.steady_state): the
requests arriving in the middle of the arrival span, not first arrival to last finish, whose
drain a run of a few hundred requests would count. quantization prices the weights with
minillm.quant.schemes (K/V stay bf16).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from minillm.calc import parallel
from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.models import ModelLike, as_config
from minillm.calc.roofline import StepOverheads
from minillm.calc.sizing import cost_per_million_tokens
from minillm.metrics import SteadyState, Summary, meets_slo, percentile, steady_state
from minillm.quant.schemes import get_scheme
from minillm.sim.simulator import SimulationResult, simulate
from minillm.workloads.streams import RequestSpec, Workload

GPU_MEMORY_UTILIZATION = 0.9  # the share of memory the engine takes (vLLM's default)
# What the other 10% holds, as vLLM's V1 worker sizes memory (vllm/v1/worker/gpu_worker.py,
# determine_available_memory, at commit 0012cf6): the KV pool gets gpu_memory_utilization of
# the GPU minus the peak of a profile forward of max_num_batched_tokens tokens (the weights and
# that step's activations) and minus memory allocated outside torch (NCCL's buffers); the CUDA
# graphs captured afterwards (compile_or_warm_up_model -> capture_model), the sampler's
# preallocated buffers and the caching allocator's fragmentation come out of the rest, the
# 1 - gpu_memory_utilization left over. minillm's simulator gives the pool all of the 90% that
# the weights leave: activation_peak_bytes prices what vLLM would deduct.


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
    quantization: str | None = None  # vLLM's --quantization: None (bf16), "int8", "int4", "fp8"

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "replicas",
                     "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be True or False, got "
                             f"{self.enable_chunked_prefill!r}")
        get_scheme(self.quantization)  # ValueError naming the schemes for an unknown one

    @property
    def layout(self) -> parallel.ParallelConfig:
        return parallel.ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.replicas

    def engine_kwargs(self) -> dict[str, Any]:
        """One replica's layout and scheduler settings as simulate()'s (and vLLM's) keyword
        arguments; the quantization is not one of simulate()'s: run_deployment prices it."""
        kwargs = asdict(self)
        del kwargs["replicas"], kwargs["quantization"]
        return kwargs


@dataclass(frozen=True)
class DeploymentRun:
    """A deployment's modelled run. result: one replica's simulation; shares: the share of its
    finished requests meeting each SLO bound alone and "all" of them; goodput: the fleet's
    requests/s meeting the SLO in steady state; dollars_per_million_tokens: the GPUs' price
    over the output tokens/s the fleet sustains in steady state, None on an unpriced GPU;
    steady: one replica's steady state (minillm.metrics.steady_state), which goodput and the
    cost are read from."""

    deployment: Deployment
    result: SimulationResult
    summary: Summary
    shares: dict[str, float]
    goodput: float
    dollars_per_million_tokens: float | None
    steady: SteadyState | None = None

    @property
    def attainment(self) -> float:
        return self.shares["all"]

    @property
    def finite_run_goodput(self) -> float:
        """The fleet's goodput over first arrival to last finish (drain included), as
        summarize() counts it: what this module reported before it read the steady state."""
        return (self.summary.goodput or 0.0) * self.deployment.replicas

    @property
    def output_throughput(self) -> float:
        """The fleet's output tokens/s in steady state."""
        assert self.steady is not None
        return self.steady.output_throughput * self.deployment.replicas


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


def activation_peak_bytes(model: ModelLike, layout: parallel.ParallelConfig, tokens: int,
                          rows: int, activation_bytes: float = 2) -> float:
    """Bytes of the largest step's activations on one GPU of layout: what vLLM's profile run
    of max_num_batched_tokens (tokens) measures on top of the weights. A layer's peak holds the
    residual stream and its normed copy (tokens x hidden each) beside the wider of attention's
    q, k, v and output shards or the MLP's gate-and-up output and its activation (tokens x 3
    intermediate / t); after the last layer, the hidden states beside the logits of the
    sampled rows (rows x vocab / t, in fp32 as the sampler reads them). A model of the live
    tensors, not a trace of one allocator: fused kernels hold less, an eager PyTorch more."""
    c = as_config(model)
    for name, value in (("tokens", tokens), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    t = layout.tensor_parallel_size
    head_dim = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    residual = 2 * tokens * c.hidden_size
    attention = tokens * (2 * q + 2 * kv) / t
    mlp = tokens * 3 * c.intermediate_size / t
    layer_peak = (residual + max(attention, mlp)) * activation_bytes
    logits_peak = tokens * c.hidden_size * activation_bytes + rows * c.vocab_size / t * 4
    return max(layer_peak, logits_peak)


def quantized_step_kwargs(deployment: Deployment, device: Hardware) -> dict[str, Any]:
    """simulate()'s keywords that price deployment.quantization (minillm.quant.schemes):
    weight bytes for the memory and the reads, K/V in bf16, and for a scheme that changes the
    activations or the matmuls' peak (fp8) a step_time that prices them. ValueError on a GPU
    that cannot run the scheme, and for fp8 under pipeline parallelism, where a step_time of
    one's own would run the stages one batch at a time (simulate's rule) and so misprice it."""
    scheme = get_scheme(deployment.quantization)
    scheme.check(device)
    kwargs: dict[str, Any] = dict(dtype_bytes=scheme.weight_bytes, kv_dtype_bytes=2)
    step = scheme.step_kwargs()
    if step["activation_bytes"] == max(scheme.weight_bytes, 2) and step["matmul_speedup"] == 1:
        return kwargs  # the default cost model prices it from the bytes alone
    if deployment.pipeline_parallel_size > 1:
        raise ValueError(f"quantization {scheme.name!r} is modelled for tensor parallelism only "
                         f"(pipeline_parallel_size {deployment.pipeline_parallel_size}): use "
                         "pipeline_parallel_size=1, or 'int8' / 'int4' across pipeline stages")
    layout = deployment.layout

    def priced(model: ModelLike, hw: Hardware | str, entries: Sequence[tuple[int, int]],
               *args: float, **extra: float) -> parallel.ParallelStepCost:
        return parallel.parallel_step_time(
            model, hw, entries, layout, *args, **extra,
            activation_bytes=step["activation_bytes"], matmul_speedup=step["matmul_speedup"])

    return kwargs | {"step_time": priced}


def run_deployment(model: ModelLike, hw: Hardware | str, workload: Sequence[RequestSpec],
                   slo: dict[str, float], deployment: Deployment, *, sim_requests: int = 300,
                   overheads: StepOverheads | None = None) -> DeploymentRun:
    """Simulate one replica of deployment on its share of workload (at most sim_requests
    requests), and scale goodput and cost to the fleet, both read in the run's steady state
    (minillm.metrics.steady_state): goodput is the good requests/s of the window's arrivals,
    the cost the GPUs' $/h over the output tokens/s the fleet owes them. overheads:
    simulate()'s (None: the roofline's peaks). ValueError from simulate when
    the layout does not fit, and from quantized_step_kwargs for a scheme the GPU lacks."""
    device = get_hardware(hw)
    share = replica_share(workload, deployment.replicas)[:sim_requests]
    result = simulate(model, device, share, record_block_tables=False,
                      gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                      **deployment.engine_kwargs(), **quantized_step_kwargs(deployment, device),
                      overheads=overheads)
    summary = result.summary(slo)
    steady = steady_state([o.metrics for o in result.outputs], slo)
    dollars = None
    if device.dollars_per_hour is not None and steady.output_throughput > 0:
        dollars = cost_per_million_tokens(device.dollars_per_hour * deployment.gpus,
                                          steady.output_throughput * deployment.replicas)
    return DeploymentRun(deployment, result, summary, attainment(result, slo),
                         steady.goodput * deployment.replicas, dollars, steady)
