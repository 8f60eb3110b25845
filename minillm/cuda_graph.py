"""CUDA graphs for decode steps: record one forward per batch size once, then replay it.

A decode step of a small model is hundreds of short kernels (Llama-3.2-1B: ~650 unfused, ~170
with minillm.fused_ops), and launching them one by one from Python can take longer than running
them. A CUDA graph records the launches of one forward and
replays them all with a single launch. A replay repeats exactly what was recorded, hence:

- Fixed addresses: the graphs read static input buffers, and each step copies its batch in.
- Fixed shapes: one graph per batch-size bucket (bucket_sizes); a batch of B requests runs in
  the smallest bucket >= B, and the rows past B are padding. A padding row is token 0 at
  position 0 that owns no cache slot (PADDING_SLOT, which the KV write kernel skips) and
  attends to a context of one token through block 0; its output is dropped.
- The block table has a fixed width, ceil(max_model_len / block_size) blocks, so the decode
  kernel's launch (its split count) is the same for every step a graph serves.
- No host reads of device values: what the host decides is baked in at capture. So graphs need
  the Triton backend, whose decode launch depends on shapes only; the torch reference reads
  max(seq_lens) back to the host, and its KV write cannot skip padding slots.

Only decode-only steps qualify (can_run); prefill and mixed steps run the model eagerly.
With capture=False the runner takes the same padded static-buffer path eagerly, on any device:
that is how the CPU tests check the padding and bucketing, and what a reader can step through.
Shapes: B requests (one token each), E hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minillm.batch import AttentionMetadata
from minillm.config import EngineConfig
from minillm.model import LlamaForCausalLM

if TYPE_CHECKING:  # importing triton here would fix its interpreter mode too early
    from minillm.attention.triton_backend import TritonAttention

PADDING_SLOT = -1  # the KV write kernel skips negative slots: a padding row owns no cache slot


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, then every 16, and max_num_seqs itself.

    Padding a batch to the next bucket wastes at most 15 rows, cheap next to the weights every
    decode step reads, while keeping the graphs (and their capture time) few.
    """
    small = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    return small + list(range(16, max_num_seqs, 16)) + [max_num_seqs]


@dataclass
class StaticInputs:
    """The buffers every graph reads, sized for the largest bucket; bucket b reads rows :b."""

    input_ids: torch.Tensor  # (B,) int64
    positions: torch.Tensor  # (B,) int64
    slot_mapping: torch.Tensor  # (B,) int64
    seq_lens: torch.Tensor  # (B,) int32
    block_tables: torch.Tensor  # (B, max_blocks) int32
    query_start_loc: torch.Tensor  # (B + 1,) int32: 0, 1, ..., B, as every request has 1 token

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, device: torch.device) -> StaticInputs:
        """Buffers whose rows are all padding."""
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        inputs = cls(zeros(max_batch, dtype=torch.int64), zeros(max_batch, dtype=torch.int64),
                     zeros(max_batch, dtype=torch.int64), zeros(max_batch, dtype=torch.int32),
                     zeros(max_batch, max_blocks, dtype=torch.int32),
                     torch.arange(max_batch + 1, dtype=torch.int32, device=device))
        inputs.pad(0, max_batch)
        return inputs

    def load(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
             bucket: int) -> None:
        """Copy a decode batch of B <= bucket requests into rows :B and pad rows B:bucket."""
        B, width = meta.num_seqs, meta.block_tables.shape[1]
        self.input_ids[:B].copy_(input_ids)
        self.positions[:B].copy_(positions)
        self.slot_mapping[:B].copy_(meta.slot_mapping)
        self.seq_lens[:B].copy_(meta.seq_lens)
        self.block_tables[:B, :width].copy_(meta.block_tables)
        self.block_tables[:B, width:] = 0  # zeros past each table, as build_batch pads (unread)
        self.pad(B, bucket)

    def pad(self, start: int, stop: int) -> None:
        """Make rows start:stop padding: token 0 at position 0, no cache slot, a context of one
        token in block 0. Every value is in range, so the kernels read nothing out of bounds."""
        self.input_ids[start:stop] = 0
        self.positions[start:stop] = 0
        self.slot_mapping[start:stop] = PADDING_SLOT
        self.seq_lens[start:stop] = 1
        self.block_tables[start:stop] = 0

    def metadata(self, bucket: int, block_size: int, max_model_len: int) -> AttentionMetadata:
        """AttentionMetadata over rows :bucket. The host-side lists must hold for every batch the
        bucket serves: one token per request, and seq_lens_cpu the bound max_model_len (the
        graphed decode path reads context lengths on the device only)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            query_start_loc=self.query_start_loc[:bucket + 1],
            seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            query_lens=[1] * bucket,
            seq_lens_cpu=[max_model_len] * bucket,
            query_start_cpu=list(range(bucket + 1)),
            block_size=block_size,
        )


class DecodeGraphRunner:
    """Runs decode-only steps through one CUDA graph per batch-size bucket.

    model, kv_cache (L, 2, N, P, K, D) and backend are the engine's; config must be resolved
    (max_model_len set). capture=True records the graphs now (CUDA only); capture=False runs
    the same padded static buffers eagerly. kv_scales (L, 2, K): the scales of an int8 or fp8
    pool (minillm.quant.kv), captured by address like the pool, so the graphs dequantize too.
    """

    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor, backend: TritonAttention,
                 config: EngineConfig, capture: bool = True,
                 kv_scales: torch.Tensor | None = None):
        if backend.name != "triton":
            raise ValueError("decode graphs need the triton attention backend: the torch "
                             "reference reads max(seq_lens) back to the host, which a graph "
                             "cannot replay, and cannot skip the padding rows' cache slots")
        if capture and kv_cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, but the KV cache is on "
                             f"{kv_cache.device}; use capture=False to run the padded path eagerly")
        if config.max_model_len is None:
            raise ValueError("config.max_model_len must be resolved: it fixes the block tables' "
                             "width")
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.kv_scales = kv_scales
        self.buckets = bucket_sizes(config.max_num_seqs)
        max_blocks = -(-config.max_model_len // config.block_size)
        self.inputs = StaticInputs.allocate(self.buckets[-1], max_blocks, kv_cache.device)
        self.metadata = {b: self.inputs.metadata(b, config.block_size, config.max_model_len)
                         for b in self.buckets}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each graph's output, (bucket, E)
        if capture:
            self.capture()

    def can_run(self, meta: AttentionMetadata) -> bool:
        """Whether a step fits a graph: every request decodes one token, the batch fits the
        largest bucket and its block tables fit the fixed width."""
        return (meta.max_query_len == 1 and meta.num_seqs <= self.buckets[-1]
                and meta.block_tables.shape[1] <= self.inputs.block_tables.shape[1])

    def bucket_for(self, num_seqs: int) -> int:
        """The smallest bucket that holds num_seqs requests."""
        return next(b for b in self.buckets if b >= num_seqs)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
            ) -> torch.Tensor:
        """Hidden states (B, E) of a decode step that can_run, as the model's forward gives.

        With graphs this is a view of the graph's output buffer: read it before the next run.
        """
        if not self.can_run(meta):
            raise ValueError(f"not a decode step that fits a graph: query_lens "
                             f"{meta.query_lens[:8]}, {meta.num_seqs} requests, buckets up to "
                             f"{self.buckets[-1]}; check can_run first")
        B = meta.num_seqs
        bucket = self.bucket_for(B)
        self.inputs.load(input_ids, positions, meta, bucket)
        return self.forward_bucket(bucket)[:B]  # (bucket, E) -> (B, E): padding rows dropped

    def forward_bucket(self, bucket: int) -> torch.Tensor:
        """The forward over rows :bucket of the static buffers, as loaded: (bucket, E)."""
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket]
        meta = self.metadata[bucket]
        return self.model(self.inputs.input_ids[:bucket], self.inputs.positions[:bucket],
                          self.kv_cache, meta, self.backend, kv_scales=self.kv_scales)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per bucket, largest first, all in one memory pool.

        Every graph's intermediates share the pool: replays never overlap, and a step reads its
        output before the next replay. Largest first, so smaller graphs fit in what it freed.
        The static rows are all padding meanwhile, so warm-up and capture write no cache slot.
        """
        self.inputs.pad(0, self.buckets[-1])
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            self._warm_up(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = self.forward_bucket(bucket)
            self.graphs[bucket] = graph
        torch.cuda.synchronize()

    def _warm_up(self, bucket: int) -> None:
        """Run the bucket's forward once, eagerly, on a side stream (as torch's CUDA graph notes
        advise): it compiles the Triton kernels and sets up cuBLAS, which a capture must not."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.forward_bucket(bucket)
        torch.cuda.current_stream().wait_stream(stream)
