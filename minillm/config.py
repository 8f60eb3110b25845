"""Engine settings: one frozen dataclass, validated once, passed down explicitly."""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, fields
from typing import Literal

from minillm.spec.config import SpeculativeConfig

Scheduling = Literal["continuous", "static"]
AttentionBackendName = Literal["auto", "torch", "triton"]
PrefixCaching = Literal["hash", "radix", "radix-token"]
SchedulingPolicy = Literal["fcfs", "priority", "lpm"]
PreemptionMode = Literal["recompute", "swap"]
PriorityPreemption = Literal["out_of_blocks", "for_waiting"]
Quantization = Literal["int8"]
KVCacheDtype = Literal["auto", "int8", "fp8"]
# What a choice's values mean, appended to the error that refuses a value outside them.
CHOICE_NOTES = {
    "priority_preemption": " ('out_of_blocks': vLLM V1's rule, 'for_waiting': V0's)",
    "quantization": " (weight-only int8, per output channel)",
    "kv_cache_dtype": " (fp8: e4m3)",
}
# Above this many blocks a step's trace copy of the cached free blocks (up to the whole pool)
# would rival the step itself; chapters' pools stay well under it (8,192 at most).
TRACE_BLOCKS_MAX_POOL = 16_384


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches, pages and schedules; names follow vLLM's engine arguments.

    block_size: tokens per KV block (a power of two).
    max_num_seqs: most sequences in one step's batch.
    max_num_batched_tokens: the token budget of one step (prefill chunks plus decodes).
    enable_chunked_prefill: split long prompts into chunks that share steps with decodes.
    enable_prefix_caching: reuse the KV blocks of an identical, already computed prefix.
    prefix_caching: how cached blocks are found and evicted: "hash" (vLLM's chain of block
        hashes, least recently freed block reused first), "radix" (SGLang's RadixAttention
        tree, least recently used unheld leaf evicted; whole blocks, so the same hits as "hash")
        or "radix-token" (the same tree matched token by token, as SGLang's default page size
        of 1 does: a match that ends inside a block reuses its first tokens by copying that
        block); see minillm.kv_cache.
    scheduling_policy: the order waiting requests are admitted in: "fcfs" (arrival),
        "priority" (each request's priority, lower first as in vLLM, ties by arrival; waiting
        ages a request's priority, priority_aging_steps, so nothing starves) or "lpm"
        (SGLang's longest prefix match: the longest cached prefix first, with a bound on how
        long a request can be passed over; needs prefix caching).
        See minillm.scheduler.
    priority_preemption: under "priority", when a running request is preempted for another.
        "out_of_blocks" (vLLM V1's rule, the default): only when a running request needs blocks
        and the pool is dry, the victim being the worst-ranked running request; a waiting
        request, however urgent, waits for a seat and for blocks. "for_waiting" (vLLM V0's
        _schedule_priority_preemption): besides, before a step is scheduled, running requests
        of a worse rank and priority than the head of the queue are preempted until it has a
        seat and the blocks for its first chunk (ageing alone never preempts). Needs
        scheduling_policy="priority".
    priority_aging_steps: under "priority", a waiting request's rank improves by one level for
        every this many engine steps it waits (default 1,000: tens of seconds of a busy GPU
        server), so a stream of urgent requests delays the rest but cannot starve them. None
        turns ageing off (strict priority: a low class can wait forever). minillm's own rule:
        vLLM has no ageing.
    preemption_mode: what happens to a request preempted when the KV pool runs dry: "recompute"
        (its blocks are freed; its K/V are computed again when it resumes) or "swap" (its
        blocks are copied to a host pool of swap_space GiB and back when it resumes; when the
        host pool is full it is recomputed instead). See minillm.swap.
    swap_space: GiB of host memory for swapped-out KV blocks (vLLM's name and default); used
        only with preemption_mode="swap".
    scheduling: "continuous" (iteration-level, Orca/vLLM) or "static" (run a batch to completion).
    num_kv_blocks: size of the KV pool in blocks; None sizes it from memory.
    max_model_len: longest sequence (prompt + output) in tokens; None takes the model's.
    enable_cuda_graphs: replay decode-only steps as CUDA graphs, one per batch-size bucket
        (minillm.cuda_graph); applies on CUDA with the triton backend, ignored elsewhere.
    trace_block_tables: whether each step's StepRecord copies the scheduled block tables and the
        cached free blocks (what the widgets draw). None records them while the pool has at most
        TRACE_BLOCKS_MAX_POOL blocks (every chapter's pool), so that a step on a GPU-sized pool
        costs the same whatever the pool's size.
    max_trace_steps: keep at least the last max_trace_steps StepRecords and at most twice as
        many (trimmed in one cut, so a step stays O(1) on average); None keeps every step, as
        chapters that replay a whole run need. A long GPU run or a server sets it.
    quantization: None (weights in the model's dtype) or "int8" (vLLM's name): the decoder
        layers' projection weights quantized at load time to int8 with one scale per output
        channel, activations kept in the model's dtype; see minillm.quant.int8.
    kv_cache_dtype: how the KV pool stores K and V (vLLM's name): "auto" (the model's dtype),
        "int8" or "fp8" (e4m3), one byte per value with a scale per layer, K/V and KV head:
        quantized as they are written, dequantized inside paged attention, so the same bytes
        hold 2x the tokens of a 16-bit pool (4x of fp32); see minillm.quant.kv.
    max_logprobs: the most log-probabilities a request may ask for per token (vLLM's name and
        default, 20): a request's logprobs=k above it is refused before it is queued.
    speculative_config: None, or speculative decoding's settings (minillm.spec): a
        SpeculativeConfig or vLLM's dict, e.g. {"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 3} or {"model": PATH, "num_speculative_tokens": 4}.
    async_scheduling: schedule and launch step n+1 before reading step n's tokens (vLLM's
        name), so the host's work overlaps the device's; a token that ends its request is found
        one step late and the token sampled after it is discarded. Off by default: on a CPU
        the device is the host, so there is nothing to overlap (minillm.bench overhead).
        Not with speculative_config.
    """

    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    prefix_caching: PrefixCaching = "hash"
    scheduling_policy: SchedulingPolicy = "fcfs"
    priority_preemption: PriorityPreemption = "out_of_blocks"
    priority_aging_steps: int | None = 1000
    preemption_mode: PreemptionMode = "recompute"
    swap_space: float = 4.0
    scheduling: Scheduling = "continuous"
    attention_backend: AttentionBackendName = "auto"
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    enable_cuda_graphs: bool = True
    trace_block_tables: bool | None = None
    max_trace_steps: int | None = None
    quantization: Quantization | None = None
    kv_cache_dtype: KVCacheDtype = "auto"
    speculative_config: SpeculativeConfig | None = None
    async_scheduling: bool = False
    max_logprobs: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        check_choices(self)
        if not isinstance(self.block_size, int) or self.block_size < 1 or (
            self.block_size & (self.block_size - 1)
        ):
            raise ValueError(f"block_size must be a power of two, got {self.block_size!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._check_prefix_caching()
        self._check_priority()
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, (int, float)) \
                or not 0 <= self.swap_space < float("inf"):
            raise ValueError(f"swap_space must be a number of GiB >= 0, got {self.swap_space!r}")
        if self.num_kv_blocks is not None and (
            not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1
        ):
            raise ValueError(
                f"num_kv_blocks must be a positive integer, got {self.num_kv_blocks!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if not isinstance(self.enable_cuda_graphs, bool):
            raise ValueError(
                f"enable_cuda_graphs must be True or False, got {self.enable_cuda_graphs!r}")
        if not (self.trace_block_tables is None or isinstance(self.trace_block_tables, bool)):
            raise ValueError(f"trace_block_tables must be None, True or False, "
                             f"got {self.trace_block_tables!r}")
        if self.max_trace_steps is not None and (
            not isinstance(self.max_trace_steps, int) or self.max_trace_steps < 1
        ):
            raise ValueError(
                f"max_trace_steps must be a positive integer or None, got {self.max_trace_steps!r}")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) \
                or self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be an integer >= 0, got {self.max_logprobs!r}")
        if isinstance(self.speculative_config, dict):  # vLLM's form, kept as the dataclass
            object.__setattr__(self, "speculative_config",
                               SpeculativeConfig.from_dict(self.speculative_config))
        elif not (self.speculative_config is None
                  or isinstance(self.speculative_config, SpeculativeConfig)):
            raise ValueError(f"speculative_config must be None, a dict or a SpeculativeConfig, "
                             f"got {self.speculative_config!r}")
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(
                f"async_scheduling must be True or False, got {self.async_scheduling!r}")
        if self.async_scheduling and self.speculative_config is not None:
            raise ValueError("async_scheduling=True does not combine with speculative_config in "
                             "minillm: a step's proposals are checked against tokens the host "
                             "must read first; turn one of them off")
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 1
        ):
            raise ValueError(
                f"max_model_len must be a positive integer, got {self.max_model_len!r}")

    def _check_priority(self) -> None:
        # Outside "priority" there are no ranks to preempt by: say so rather than ignore it.
        if self.priority_preemption == "for_waiting" and self.scheduling_policy != "priority":
            raise ValueError("priority_preemption='for_waiting' preempts running requests for "
                             "a better-ranked waiting one, which needs "
                             "scheduling_policy='priority'")
        steps = self.priority_aging_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 1):
            raise ValueError(f"priority_aging_steps must be a positive number of steps, or None "
                             f"for no ageing, got {steps!r}")

    def _check_prefix_caching(self) -> None:
        # Both would be silently ignored without a cache: a run meant to measure them would
        # measure nothing, so say so.
        if self.prefix_caching != "hash" and not self.enable_prefix_caching:
            raise ValueError(f"prefix_caching={self.prefix_caching!r} picks the cache's design "
                             "but the cache is off: pass enable_prefix_caching=True as well")
        if self.scheduling_policy == "lpm" and not self.enable_prefix_caching:
            raise ValueError("scheduling_policy='lpm' admits the longest cached prefix first, "
                             "which needs enable_prefix_caching=True")


def literal_choices(annotation: object) -> tuple[object, ...] | None:
    """The values a Literal type allows (None among them for `Literal[...] | None`), or None
    for any other type."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        literals = [literal_choices(m) for m in members if m is not type(None)]
        if len(literals) == 1 and literals[0] is not None:
            return ((None,) if type(None) in members else ()) + literals[0]
    return None


def _either(values: tuple[object, ...]) -> str:
    spelled = [repr(v) for v in values]
    return spelled[0] if len(spelled) == 1 else f"{', '.join(spelled[:-1])} or {spelled[-1]}"


@functools.cache
def choice_fields(cls: type) -> dict[str, tuple[object, ...]]:
    """A dataclass's fields typed by a Literal, and the values each allows. Cached: resolving
    the annotations costs more than building a config, which simulations do often."""
    hints = typing.get_type_hints(cls)
    return {f.name: choices for f in fields(cls)
            if (choices := literal_choices(hints[f.name])) is not None}


def check_choices(config: object) -> None:
    """Refuse a value outside its field's Literal type, naming the field, the choices and the
    value: the types are the one list of the choices, so they cannot drift from this check."""
    for name, choices in choice_fields(type(config)).items():
        value = getattr(config, name)
        if value not in choices:
            raise ValueError(f"{name} must be {_either(choices)}{CHOICE_NOTES.get(name, '')}, "
                             f"got {value!r}")
