"""The roofline model: peak FLOP/s, memory bandwidth, and the time a step of work needs.

A step that does F FLOPs and moves M bytes takes at least max(F / peak FLOP/s, M / bandwidth).
Its arithmetic intensity F / M (FLOPs per byte) against the device's ridge point
(peak FLOP/s / bandwidth) says which bound it hits: decode reads every weight to produce one
token per sequence (intensity ~ batch size, memory-bound); prefill reuses each weight across the
prompt (intensity ~ prompt length, compute-bound). The simulator advances its clock by
`step_time`, so this module is pure Python arithmetic. The devices' peaks (Hardware, HARDWARE,
HOST_LINKS, get_hardware) live in minillm.hardware and this machine's measured ones
(measure_machine, which imports torch) in minillm.calc.machine_peaks, and what a priced step
is (StepCost, SerialStepCost) in minillm.calc.step_cost; all are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from minillm.calc.hardware import HARDWARE as HARDWARE
from minillm.calc.hardware import HOST_LINKS as HOST_LINKS
from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.machine_peaks import measure_machine as measure_machine
from minillm.calc.models import ModelLike, as_config
from minillm.calc.step_cost import SerialStepCost, StepCost
from minillm.calc.step_overheads import OVERHEAD_TERMS as OVERHEAD_TERMS
from minillm.calc.step_overheads import StepOverheads
from minillm.calc.step_overheads import attention_pairs as attention_pairs
from minillm.model_config import ModelConfig


def ridge_point(hw: Hardware | str) -> float:
    """FLOPs per byte where the roofline bends: peak FLOP/s / bandwidth. Work below it is
    memory-bound, above it compute-bound (H100-SXM: ~295)."""
    device = get_hardware(hw)
    return device.flops / device.bandwidth


@dataclass(frozen=True)
class _Shape:
    """Per-model constants of the cost model, in parameters and elements (not yet bytes)."""

    layer_matmul_params: int  # weights of every layer's projections: FLOPs 2 * this per token
    lm_head_params: int  # vocab x hidden: FLOPs 2 * this per row that computes logits
    read_params: int  # weights read in full each step (an untied embedding is only gathered)
    attn_flops_per_pair: int  # 4 * H * D * L: q.k and p.v over one (query, key) pair, all layers
    kv_elems_per_token: int  # 2 * L * K * D


@lru_cache(maxsize=256)
def _shape(config: ModelConfig) -> _Shape:
    E, H, K, D, F, L = (config.hidden_size, config.num_attention_heads,
                        config.num_key_value_heads, config.head_dim, config.intermediate_size,
                        config.num_hidden_layers)
    lm_head = config.vocab_size * E
    return _Shape(
        layer_matmul_params=L * (2 * E * H * D + 2 * E * K * D + 3 * E * F),
        lm_head_params=lm_head,
        read_params=config.num_params - (0 if config.tie_word_embeddings else lm_head),
        attn_flops_per_pair=4 * H * D * L,
        kv_elems_per_token=2 * L * K * D,
    )


def _config(model: ModelLike) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else as_config(model)


def step_flops_bytes(model: ModelLike, entries: Iterable[tuple[int, int]],
                     dtype_bytes: float = 2, *,
                     kv_dtype_bytes: float | None = None) -> tuple[float, float]:
    """(FLOPs, bytes) of one forward step over a mixed batch.

    entries: one (num_new_tokens, context_len) pair per request, context_len counting the
    tokens of context after this step (decode: (1, S); a whole prefill: (P, P); a chunk over a
    cached prefix: (C, prefix + C)).
    FLOPs: 2 * projection weights * T new tokens, + 2 * lm_head once per request (the row that
    samples; a chunk that does not finish its prompt samples none, so this is an upper bound),
    + 4 * H * D * L per visible (query, key) pair, causal within the new tokens.
    Bytes: the weights once per step (shared by the batch), + each request's K/V read over its
    context, + K/V written for the new tokens. Activations and logits are not counted: at the
    batch sizes that serve they are small next to the weights, or hidden under compute.
    dtype_bytes prices each weight, kv_dtype_bytes each K/V number (None: dtype_bytes); an fp8
    or int8 cache halves the KV term of a bf16 model and leaves the weights' term alone.
    """
    if kv_dtype_bytes is not None and not 0 < kv_dtype_bytes < math.inf:
        raise ValueError(f"kv_dtype_bytes must be a positive number or None, got "
                         f"{kv_dtype_bytes!r}")
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    s = _shape(_config(model))
    tokens = rows = pairs = kv_tokens = 0
    for n, c in entries:
        if n < 1 or c < n:
            raise ValueError(f"entry (num_new_tokens={n}, context_len={c}): need "
                             "1 <= num_new_tokens <= context_len")
        tokens += n
        rows += 1
        pairs += n * c - n * (n - 1) // 2  # query at position p sees p + 1 keys
        kv_tokens += c + n
    if rows == 0:
        raise ValueError("entries is empty: a step runs at least one request")
    flops = (2 * s.layer_matmul_params * tokens + 2 * s.lm_head_params * rows
             + s.attn_flops_per_pair * pairs)
    return flops, s.read_params * dtype_bytes + s.kv_elems_per_token * kv_tokens * kv_bytes


def step_time(model: ModelLike, hw: Hardware | str, entries: Iterable[tuple[int, int]],
              dtype_bytes: float = 2, overhead: float = 0.0,
              overhead_per_token: float = 0.0, overhead_per_seq: float = 0.0,
              overhead_per_pair: float = 0.0, *,
              kv_dtype_bytes: float | None = None) -> StepCost:
    """The roofline time of one step over a mixed batch (see step_flops_bytes for entries):
    max(FLOPs / peak FLOP/s, bytes / bandwidth) plus the overheads, in seconds (StepOverheads
    says what each counts). Peak rates are never reached in practice; calibrate the overheads
    (minillm.calibration), or pass measured rates as a Hardware. kv_dtype_bytes: bytes per K/V
    number, as in step_flops_bytes."""
    overheads = StepOverheads(overhead, overhead_per_token, overhead_per_seq, overhead_per_pair)
    device = hw if isinstance(hw, Hardware) else get_hardware(hw)
    entries = entries if isinstance(entries, Sequence) else list(entries)
    flops, moved = step_flops_bytes(model, entries, dtype_bytes, kv_dtype_bytes=kv_dtype_bytes)
    compute_time, memory_time = flops / device.flops, moved / device.bandwidth
    extra = overheads.seconds(entries)
    return StepCost(flops, moved, compute_time, memory_time, extra,
                    max(compute_time, memory_time) + extra)


def split_phases(entries: Iterable[tuple[int, int]]
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(prefill part, decode part) of a step's entries: an entry of one new token is a decode,
    any other a prompt or a chunk of one. A one-token chunk (the last token of a prompt, or the
    tail a decode replica recomputes) is priced as a decode: it costs what one does."""
    prefill: list[tuple[int, int]] = []
    decode: list[tuple[int, int]] = []
    for entry in entries:
        (decode if entry[0] == 1 else prefill).append(entry)
    return prefill, decode


def serial_phases(base: Callable[..., StepCost] | None = None,
                  interference: float = 1.0) -> Callable[..., StepCost | SerialStepCost]:
    """A cost model for simulate(step_time=...) that prices prefill-decode interference.

    A mixed step (a prefill chunk beside decodes) has two bounds. The optimistic one is base's
    own (step_time: max(compute, memory) of the whole batch): the chunk's FLOPs hide under the
    decodes' weight and K/V reads, so a chunk below the ridge point rides along a memory-bound
    decode step almost free. Nothing can beat it, since it is the roofline of the work. The
    pessimistic one prices the step's prefill part and its decode part as two roofline steps
    and adds them: nothing of the chunk overlaps the decodes, each part reads the weights. An
    engine that never mixes phases pays exactly that (vLLM's V0 default scheduler,
    Scheduler._schedule_default, runs no decodes in a step that prefills; minillm's scheduler
    mixes them, as vLLM's V1 does), so a mixed step should cost no more. Real kernels land in
    between: the linear layers of a fused batch read each weight once, but prefill and decode
    attention run as different kernels one after the other, and a GEMM near the ridge point
    runs below both roofs (DistServe, Splitwise and Sarathi-Serve measure the gap on GPUs).
    interference: where in between, 0 the optimistic bound (base's cost), 1 (the default) the
    pessimistic one, linear in between. Pure steps, all prefill or all decode, cost exactly
    what base says. base: a cost model called as step_time is (default step_time; for a TP x
    PP layout, minillm.parallel.step_timer(layout)). The fixed per-step overhead is paid once:
    the engine still runs one step of its loop. Not for speculative decoding, whose verified
    decodes carry several new tokens and would be priced as chunks."""
    if not 0 <= interference <= 1:
        raise ValueError(f"interference must be between 0 (max(compute, memory) of the whole "
                         f"step) and 1 (its phases priced apart and added), got "
                         f"{interference!r}")
    timer = step_time if base is None else base

    def price(model: ModelLike, hw: Hardware | str, entries: Iterable[tuple[int, int]],
              dtype_bytes: float = 2, overhead: float = 0.0, *per_unit: float,
              **kwargs: float) -> StepCost | SerialStepCost:
        entries = list(entries)
        prefill, decode = split_phases(entries)
        whole = timer(model, hw, entries, dtype_bytes, overhead, *per_unit, **kwargs)
        if not prefill or not decode or interference == 0:
            return whole
        parts = (timer(model, hw, prefill, dtype_bytes, 0.0, *per_unit, **kwargs),
                 timer(model, hw, decode, dtype_bytes, overhead, *per_unit, **kwargs))
        serial = parts[0].time + parts[1].time
        return SerialStepCost(parts, whole, interference,
                              whole.time + interference * (serial - whole.time))
    return price


def _check_counts(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def decode_step_time(model: ModelLike, hw: Hardware | str, batch: int, context_len: int,
                     dtype_bytes: float = 2, overhead: float = 0.0, *,
                     kv_dtype_bytes: float | None = None) -> StepCost:
    """One decode step: `batch` sequences each add one token to a context of context_len tokens
    (counting the new one). At batch 1 this is the time per output token (TPOT).
    kv_dtype_bytes: bytes per K/V number (None: dtype_bytes)."""
    _check_counts(batch=batch, context_len=context_len)
    return step_time(model, hw, [(1, context_len)] * batch, dtype_bytes, overhead,
                     kv_dtype_bytes=kv_dtype_bytes)


def batching_gain(model: ModelLike, hw: Hardware | str, batch: int, context_len: int,
                  dtype_bytes: float = 2) -> float:
    """The tokens/s a decode step of `batch` sequences makes over a step of one, on hw's roof
    (modelled): batch x t(1) / t(batch). Up to the ridge it is about `batch`: the sequences
    share one read of the weights. On a device whose ridge sits below a single sequence's
    intensity (a CPU computing in bf16: its matmuls are compute-bound from B = 1) it is about 1,
    and no measurement there can show batching pay."""
    one = decode_step_time(model, hw, 1, context_len, dtype_bytes).time
    return batch * one / decode_step_time(model, hw, batch, context_len, dtype_bytes).time


def prefill_time(model: ModelLike, hw: Hardware | str, prompt_len: int, batch: int = 1,
                 dtype_bytes: float = 2, overhead: float = 0.0, *,
                 kv_dtype_bytes: float | None = None) -> StepCost:
    """One step that prefills `batch` prompts of prompt_len tokens from scratch: the time to
    first token, before queueing. kv_dtype_bytes: bytes per K/V number (None: dtype_bytes)."""
    _check_counts(prompt_len=prompt_len, batch=batch)
    return step_time(model, hw, [(prompt_len, prompt_len)] * batch, dtype_bytes, overhead,
                     kv_dtype_bytes=kv_dtype_bytes)


def prefill_crossover(model: ModelLike, hw: Hardware | str, dtype_bytes: float = 2) -> int:
    """The shortest prompt (tokens) whose prefill step is compute-bound on hw: the prompt length
    at which prefill crosses the ridge point. Below it a prefill step costs about one read of
    the weights, like a decode step; above it, time grows with the prompt. Llama-3-8B in BF16:
    ~300 tokens on an H100-SXM, ~160 on an A100-80GB; on a CPU in fp32, a handful of tokens.

    Prefill's intensity (2*W*P + attention) / (weight bytes + KV bytes) rises with P, so the
    crossing is found by bisection on prefill_time(...).bound."""
    device = get_hardware(hw)

    def compute_bound(prompt_len: int) -> bool:
        return prefill_time(model, device, prompt_len, dtype_bytes=dtype_bytes).bound == "compute"

    lo, hi = 1, 1
    while not compute_bound(hi):
        lo, hi = hi, hi * 2
        if hi > 2**30:
            raise ValueError(f"prefill never turns compute-bound on {device.name} below 2^30 "
                             "tokens: check the hardware's flops and bandwidth")
    if hi == 1:
        return 1
    while hi - lo > 1:  # bisect: lo is memory-bound, hi compute-bound
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def arithmetic_intensity(model: ModelLike, batch: int, phase: Literal["prefill", "decode"],
                         context_len: int, prompt_len: int | None = None,
                         dtype_bytes: float = 2) -> float:
    """FLOPs per byte of one step. decode: `batch` sequences at context_len tokens (about
    `batch`); prefill: `batch` chunks of prompt_len new tokens (default: all context_len) ending
    at context_len (about prompt_len)."""
    _check_counts(batch=batch, context_len=context_len, prompt_len=prompt_len)
    if phase == "decode":
        if prompt_len is not None:
            raise ValueError(f"prompt_len={prompt_len} is for phase='prefill'; decode adds 1 token")
        new = 1
    elif phase == "prefill":
        new = context_len if prompt_len is None else prompt_len
    else:
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    flops, moved = step_flops_bytes(model, [(new, context_len)] * batch, dtype_bytes)
    return flops / moved
