"""The device side of the engine: the weights, the paged K/V pool, CUDA graphs, a step's tensors.

The engine's loop (minillm.engine) decides what a step runs and does the bookkeeping around it;
everything that touches the device's memory is here: the pool (and its scales, for a quantized
one), the host pool that swaps copy to and from, the attention backend, the decode graphs, and
the step's batch tensors, and how many blocks the pool gets in the memory there is
(num_kv_blocks_for_memory, from a MemoryReport of the largest step on a GPU). Keeping the
two apart is nano-vllm's split (its ModelRunner), and the one that lets the host schedule step
n+1 while the device still runs step n (asynchronous scheduling: InFlight is that step, and
prepare takes the inputs it is still sampling from it, on the device).
"""

from __future__ import annotations

import dataclasses
import os
import platform
from typing import Any

import torch

from minillm.attention import get_backend
from minillm.batch import Batch, build_batch, to_device
from minillm.config import EngineConfig
from minillm.cuda_graph import DecodeGraphRunner
from minillm.host_allocator import keep_freed_memory
from minillm.layers.weight_layout import transpose_weights
from minillm.model import LlamaForCausalLM
from minillm.quant.kv_pool import allocate_kv_pool, kv_pool_block_bytes
from minillm.request import ScheduledRequest
from minillm.sampling import DeviceSample, host_to_device
from minillm.step_loop import Executed
from minillm.swap import KVSwapper, num_swap_blocks

X86 = ("x86_64", "AMD64")  # platform.machine()'s names, Linux and Windows


@dataclasses.dataclass
class InFlight:
    """A step whose forward and sampling are queued on the device; collect() reads its tokens.
    done is there at once where the host read them already (speculative decoding, or a batch
    whose sampling failed and was retried one request at a time)."""

    sampled: list[ScheduledRequest]
    sample: DeviceSample | None = None
    done: Executed | None = None

    def collect(self) -> Executed:
        if self.done is None:
            assert self.sample is not None
            result = self.sample.read()
            self.done = Executed(self.sampled, [[t] for t in result.token_ids],
                                 [[lp] for lp in result.logprobs])
        return self.done

    def device_tokens(self, device: torch.device) -> torch.Tensor:
        """(S,) each sampled request's token on the device, in sampled's order (0 for a
        request whose sampling failed: it ends, and what it computes next is discarded)."""
        if self.sample is not None:
            return self.sample.tokens
        assert self.done is not None
        return host_to_device([t[-1] if t else 0 for t in self.done.tokens], torch.int64, device)


class ModelRunner:
    """Owns the weights' forward, the K/V pool and the copies between its blocks.

    config must be resolved (num_kv_blocks set). tokenizer: for the calibration passage of a
    quantized K/V pool (None: ids cycling over the vocabulary)."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: Any, config: EngineConfig):
        self.model, self.config = model, config
        self.device = model.lm_head.weight.device
        if self.device.type == "cpu":
            keep_freed_memory()  # the step's tensors reused, not paged in anew each step
            if model.lm_head.weight.dtype == torch.float32 and platform.machine() in X86:
                # MKL's faster layout for float32 (see weight_layout's docstring)
                transpose_weights(model, tied=model.model.embed_tokens.weight)
        # kv_scales (L, 2, K): None for a pool in the model's dtype (kv_cache_dtype="auto").
        self.kv_cache, self.kv_scales = allocate_kv_pool(model, tokenizer, config)
        # One block across all layers, K and V: what a swap moves per block.
        self.block_bytes = self.kv_cache[:, :, 0].numel() * self.kv_cache.element_size()
        self.swapper = (KVSwapper(self.kv_cache, num_swap_blocks(config.swap_space,
                                                                 self.block_bytes))
                        if config.preemption_mode == "swap" else None)
        self.backend = get_backend(config.attention_backend, self.device)
        self.graph_runner: DecodeGraphRunner | None = None
        if (config.enable_cuda_graphs and self.device.type == "cuda"
                and self.backend.name == "triton"):
            self.graph_runner = DecodeGraphRunner(model, self.kv_cache, self.backend, config,
                                                  kv_scales=self.kv_scales)

    @property
    def num_swap_blocks(self) -> int:
        """Blocks of the host pool (0 without swap preemption)."""
        return 0 if self.swapper is None else self.swapper.host.shape[0]

    def move_blocks(self, swap_out: list[tuple[int, int]], copies: list[tuple[int, int]],
                    swap_in: list[tuple[int, int]]) -> None:
        """A step's block moves, before its forward overwrites blocks, in the one safe order: a
        swap-out reads blocks that preemption just freed and a copy or a swap-in may refill; a
        copy reads a cached block that a swap-in's fresh block may have just evicted."""
        if self.swapper is not None and swap_out:
            self.swapper.copy(swap_out, [])
        self.copy_blocks(copies)
        if self.swapper is not None and swap_in:
            self.swapper.copy([], swap_in)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy on write for the token-granular radix cache: (source, destination) blocks, all
        layers, K and V. One gather then one scatter, so every source is read as it stood."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        pool = self.kv_cache
        if pool.dtype == torch.float8_e4m3fn:  # no fp8 CPU indexing kernels: move the bytes
            pool = pool.view(torch.uint8)
        pool[:, :, dst] = pool[:, :, src]

    def prepare(self, scheduled: list[ScheduledRequest], previous: InFlight | None = None
                ) -> Batch:
        """The step's tensors on the device: token ids, positions, slots, block tables. An
        input still being sampled (asynchronous scheduling) is copied from previous, the step
        in flight, on the device: the host never waits for it."""
        batch = build_batch(scheduled, self.config.block_size, self.device)
        if batch.placeholder_rows:
            assert previous is not None, "a placeholder input with no step in flight"
            row_of = {s.request.request_id: i for i, s in enumerate(previous.sampled)}
            rows, sources = to_device([[row for row, _ in batch.placeholder_rows],
                                       [row_of[rid] for _, rid in batch.placeholder_rows]],
                                      torch.int64, self.device)
            batch.input_ids[rows] = previous.device_tokens(self.device)[sources]
        return batch

    def forward(self, batch: Batch) -> torch.Tensor:
        """Hidden states (T, E). A decode-only step replays a CUDA graph when one fits it."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch.attn):
            return self.graph_runner.run(batch.input_ids, batch.positions, batch.attn)
        if self.kv_scales is None:  # a pool in the model's dtype: the call as it always was
            return self.model(batch.input_ids, batch.positions, self.kv_cache, batch.attn,
                              self.backend)
        return self.model(batch.input_ids, batch.positions, self.kv_cache, batch.attn,
                          self.backend, kv_scales=self.kv_scales)

    def logits(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The logits (S, V) fp32 of the step's sample rows."""
        return self.model.compute_logits(hidden[batch.sample_indices])


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """The GPU's memory around a warm-up of the largest step, in bytes (profile_memory).

    total: the device's memory. free: free on the device after the warm-up, so other processes'
    memory is already out of it. allocated: this process's tensors at rest (the weights).
    peak: the most this process's tensors held during the warm-up step.
    """

    total: int
    free: int
    allocated: int
    peak: int

    @property
    def step_bytes(self) -> int:
        """Activations, logits and workspace of the largest step, freed when it ends."""
        return self.peak - self.allocated


def kv_pool_bytes(report: MemoryReport, gpu_memory_utilization: float) -> int:
    """Bytes the KV pool may take: this process's share of the device less its own peak
    (weights plus the largest step), and no more than what is free less that step, since other
    processes keep what they hold but are not charged to this engine's share."""
    share = report.total * gpu_memory_utilization - report.peak
    free = report.free - report.step_bytes
    return max(int(min(share, free)), 0)


def num_kv_blocks_for_memory(config: EngineConfig, model: LlamaForCausalLM, max_model_len: int,
                             report: MemoryReport | None = None) -> int:
    """The pool size that fits in memory: on a GPU (report from profile_memory), kv_pool_bytes;
    on a CPU, a quarter of gpu_memory_utilization's share of the RAM. Either way no more than
    every seat holding a full-length sequence: more blocks would only keep more cached
    prefixes, and a tiny model would get millions of blocks on a big GPU."""
    block_bytes = kv_pool_block_bytes(model, config)
    seats = config.max_num_seqs * -(-max_model_len // config.block_size)
    if report is not None:
        blocks = kv_pool_bytes(report, config.gpu_memory_utilization) // block_bytes
        if blocks < 1:
            raise ValueError(
                f"no GPU memory left for the KV cache: the weights and the largest step peak at "
                f"{report.peak / 2**30:.2f} GiB of {report.total / 2**30:.2f} GiB with "
                f"{report.free / 2**30:.2f} GiB free; raise gpu_memory_utilization="
                f"{config.gpu_memory_utilization} or lower max_num_batched_tokens")
        return min(blocks, seats)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(min(int(ram * config.gpu_memory_utilization * 0.25 // block_bytes), seats), 1)


def describe_pool(num_blocks: int, block_bytes: int, block_size: int,
                  report: MemoryReport) -> str:
    """One line on the pool chosen and what it was sized against."""
    gib = 2**30
    return (f"KV pool: {num_blocks:,} blocks x {block_size} tokens = {num_blocks * block_size:,} "
            f"tokens, {num_blocks * block_bytes / gib:.2f} GiB (GPU {report.total / gib:.1f} GiB:"
            f" weights {report.allocated / gib:.2f} GiB, largest step "
            f"{report.step_bytes / gib:.2f} GiB, free {report.free / gib:.2f} GiB)")
