"""Tensor and pipeline parallelism as arithmetic: what each GPU holds, and what a step costs.

Tensor parallelism (TP, Megatron-LM: Shoeybi et al. 2019) splits every layer across t GPUs:
query heads, KV heads and the MLP's intermediate width are divided, so each GPU holds and reads
1/t of a layer's weights, and two all-reduces a layer (after attention's o_proj and after the
MLP's down_proj) sum the partial activations. Pipeline parallelism (PP, GPipe: Huang et al.
2019) gives each of p stages a run of whole layers; a step's activations cross each stage
boundary once. A layout of t x p GPUs is a ParallelConfig (vLLM's tensor_parallel_size and
pipeline_parallel_size).

Model (stated so it can be argued with): each stage is a roofline step (minillm.roofline) over
its share of the work per GPU; a TP group's all-reduces run the algorithm its layout names
(ParallelConfig.all_reduce, minillm.collectives): by default one ring on the Link that joins
the group (NVLink inside a node, the inter-node link once the group spans nodes), or a
two-level all-reduce that crosses nodes only between per-node shards, or NVLink SHARP inside
one NVLink domain, or the fastest of these per message ("auto", as NCCL picks); a stage
boundary is one send. Optimistic where the roofline is (peak FLOP/s and bandwidth on every
GPU) and in pricing every collective at the link's peak (NCCL's ring reaches ~80% of it);
pessimistic in that compute and communication never overlap.

What each GPU holds (ParallelConfig, the shards, the pool that fits) is minillm.calc.sharding,
re-exported here; this module prices the steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from minillm.calc.collectives import (  # noqa: F401 (parallel re-exports the ones it does not call)
    ALL_REDUCE_ALGORITHMS,
    all_reduce_time,
    bubble_fraction,
    bus_bandwidth,
    gather_time,
    group_all_reduce_time,
    pipeline_time,
    send_time,
)
from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.models import ModelLike, as_config

# What each GPU holds, re-exported: chapters write parallel.ParallelConfig and so on.
from minillm.calc.sharding import ParallelConfig as ParallelConfig
from minillm.calc.sharding import StageShape as StageShape
from minillm.calc.sharding import fits as fits
from minillm.calc.sharding import kv_block_bytes_per_gpu as kv_block_bytes_per_gpu
from minillm.calc.sharding import kv_bytes_per_token_per_gpu as kv_bytes_per_token_per_gpu
from minillm.calc.sharding import kv_heads_per_gpu as kv_heads_per_gpu
from minillm.calc.sharding import max_concurrency as max_concurrency
from minillm.calc.sharding import num_kv_blocks as num_kv_blocks
from minillm.calc.sharding import stage_shapes
from minillm.calc.sharding import weight_bytes_per_gpu as weight_bytes_per_gpu
from minillm.calc.step_overheads import StepOverheads


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage's share of a step, per GPU of its TP group: a roofline step over its
    layers (flops, bytes, compute_time, memory_time) plus all_reduce_time (2 a layer, and the
    lm_head's logits gathered on the last stage); send_time: its activations to the next stage."""

    layers: int
    flops: float
    bytes: float
    compute_time: float
    memory_time: float
    all_reduce_time: float
    send_time: float

    @property
    def time(self) -> float:
        """Seconds the stage is busy with one step, its send included."""
        return max(self.compute_time, self.memory_time) + self.all_reduce_time + self.send_time


@dataclass(frozen=True)
class ParallelStepCost:
    """A step over a TP x PP layout. time: its latency, the stages one after another plus the
    overheads (what one step of the engine's loop waits for); slowest_stage: the stage time that
    bounds throughput once micro-batches keep every stage busy. float(cost) is cost.time."""

    stages: tuple[StageCost, ...]
    overhead: float

    @property
    def time(self) -> float:
        return sum(s.time for s in self.stages) + self.overhead

    @property
    def slowest_stage(self) -> float:
        return max(s.time for s in self.stages)

    @property
    def communication_time(self) -> float:
        """Seconds of the step spent in all-reduces and sends (not overlapped with compute)."""
        return sum(s.all_reduce_time + s.send_time for s in self.stages)

    def __float__(self) -> float:
        return self.time


def parallel_step_time(model: ModelLike, hw: Hardware | str, entries: Iterable[tuple[int, int]],
                       layout: ParallelConfig, dtype_bytes: float = 2, overhead: float = 0.0,
                       overhead_per_token: float = 0.0, overhead_per_seq: float = 0.0,
                       overhead_per_pair: float = 0.0, *, kv_dtype_bytes: float | None = None,
                       activation_bytes: float | None = None,
                       matmul_speedup: float = 1.0) -> ParallelStepCost:
    """The cost of one step (entries as roofline.step_flops_bytes: (new tokens, context) per
    request) on a layout. Each stage: its layers' FLOPs and weight and K/V bytes per GPU on the
    roofline, 2 all-reduces a layer of tokens x hidden x activation_bytes by layout.all_reduce
    (and the logits of the sampled rows gathered from the vocab shards on the last stage), then
    tokens x hidden x activation_bytes sent to the next stage. activation_bytes: None is
    max(dtype_bytes, 2) (int8 / fp8 weights still compute in bf16). matmul_speedup: the weight
    matmuls' peak over hw.flops (2 for FP8 W8A8 on FP8 tensor cores; minillm.quant.schemes);
    attention and the output head stay at hw.flops. The overheads (as in
    roofline.step_time) are added once a step. At t = p = 1 the FLOPs, bytes and time are
    roofline.step_time's."""
    c, device = as_config(model), get_hardware(hw)
    overheads = StepOverheads(overhead, overhead_per_token, overhead_per_seq, overhead_per_pair)
    if not 0 < matmul_speedup < math.inf:
        raise ValueError(f"matmul_speedup must be a positive number, got {matmul_speedup!r}")
    shapes = stage_shapes(c, layout)
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    act = max(dtype_bytes, 2) if activation_bytes is None else activation_bytes
    tokens = rows = pairs = kv_tokens = 0
    entries = list(entries)
    for n, ctx in entries:
        if n < 1 or ctx < n:
            raise ValueError(f"entry (num_new_tokens={n}, context_len={ctx}): need "
                             "1 <= num_new_tokens <= context_len")
        tokens, rows, kv_tokens = tokens + n, rows + 1, kv_tokens + ctx + n
        pairs += n * ctx - n * (n - 1) // 2  # query at position p sees p + 1 keys
    if rows == 0:
        raise ValueError("entries is empty: a step runs at least one request")
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    layer_reduce = layout.all_reduce_time(tokens * c.hidden_size * act, device)
    stages = []
    for stage, s in enumerate(shapes):
        matmul_flops = 2 * s.matmul_params * tokens
        flops = matmul_flops + 2 * s.head_params * rows + s.attn_flops_per_pair * pairs
        compute = (flops - matmul_flops * (1 - 1 / matmul_speedup)) / device.flops
        moved = s.read_params * dtype_bytes + s.kv_elems_per_token * kv_tokens * kv_bytes
        reduce = 2 * s.layers * layer_reduce
        if s.head_params and tp > 1:  # vLLM's LogitsProcessor gathers the vocab shards
            reduce += gather_time(rows * c.vocab_size * act, tp, layout.tensor_link(device))
        send = (send_time(tokens * c.hidden_size * act, layout.boundary_link(device, stage))
                if stage < pp - 1 else 0.0)
        stages.append(StageCost(s.layers, flops, moved, compute,
                                moved / device.bandwidth, reduce, send))
    return ParallelStepCost(tuple(stages), overheads.seconds(entries))


def step_timer(layout: ParallelConfig) -> Callable[..., ParallelStepCost]:
    """A cost model for simulate(step_time=...): called as roofline.step_time is, it prices the
    step on layout (parallel_step_time)."""
    def price(model: ModelLike, hw: Hardware | str, entries: Sequence[tuple[int, int]],
              *args: float, **kwargs: float) -> ParallelStepCost:
        return parallel_step_time(model, hw, entries, layout, *args, **kwargs)
    return price


def decode_tpot(model: ModelLike, hw: Hardware | str, layout: ParallelConfig, batch: int,
                context_len: int, dtype_bytes: float = 2, *,
                kv_dtype_bytes: float | None = None) -> float:
    """Seconds per output token of batch sequences decoding at context_len on layout: one
    decode step's latency, every stage in turn (no micro-batches)."""
    for name, value in (("batch", batch), ("context_len", context_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return parallel_step_time(model, hw, [(1, context_len)] * batch, layout, dtype_bytes,
                              kv_dtype_bytes=kv_dtype_bytes).time


# --- pipelines and their bubbles (minillm.collectives: bubble_fraction, pipeline_time) -----


def pipeline_decode_throughput(model: ModelLike, hw: Hardware | str, layout: ParallelConfig,
                               micro_batch_size: int, micro_batches: int, context_len: int,
                               dtype_bytes: float = 2, *, kv_dtype_bytes: float | None = None
                               ) -> tuple[float, float]:
    """(tokens/s, the no-bubble bound in tokens/s) of m micro-batches of micro_batch_size
    sequences decoding one token each through layout's stages. The bound is one micro-batch
    per slowest stage; the ratio tends to 1 as m grows (for equal stages, 1 - bubble)."""
    cost = parallel_step_time(model, hw, [(1, context_len)] * micro_batch_size, layout,
                              dtype_bytes, kv_dtype_bytes=kv_dtype_bytes)
    stage_times = [s.time for s in cost.stages]
    total = pipeline_time(stage_times, micro_batches)
    return micro_batches * micro_batch_size / total, micro_batch_size / cost.slowest_stage
