"""The device side of the engine: the weights, the paged K/V pool, CUDA graphs, a step's tensors.

The engine's loop (minillm.engine) decides what a step runs and does the bookkeeping around it;
everything that touches the device's memory is here: the pool (and its scales, for a quantized
one), the host pool that swaps copy to and from, the attention backend, the decode graphs, and
the step's batch tensors. Keeping the two apart is nano-vllm's split (its ModelRunner), and the
one that lets the host schedule step n+1 while the device still runs step n.
"""

from __future__ import annotations

from typing import Any

import torch

from minillm.attention import get_backend
from minillm.batch import Batch, build_batch
from minillm.config import EngineConfig
from minillm.cuda_graph import DecodeGraphRunner
from minillm.model import LlamaForCausalLM
from minillm.quant.kv_pool import allocate_kv_pool
from minillm.scheduler import ScheduledRequest
from minillm.swap import KVSwapper, num_swap_blocks


class ModelRunner:
    """Owns the weights' forward, the K/V pool and the copies between its blocks.

    config must be resolved (num_kv_blocks set). tokenizer: for the calibration passage of a
    quantized K/V pool (None: ids cycling over the vocabulary)."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: Any, config: EngineConfig):
        self.model, self.config = model, config
        self.device = model.lm_head.weight.device
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

    def prepare(self, scheduled: list[ScheduledRequest]) -> Batch:
        """The step's tensors on the device: token ids, positions, slots, block tables."""
        return build_batch(scheduled, self.config.block_size, self.device)

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
