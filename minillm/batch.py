"""Flatten one step's scheduled requests into the tensors the model and attention read.

All tokens of the step sit in one flat row of T tokens, request after request (no padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.sampling import host_to_device
from minillm.scheduler import ScheduledRequest


@dataclass
class AttentionMetadata:
    """What paged attention needs to find each token's place and context. B requests, T tokens.

    slot_mapping (T,) int64: cache slot (block * P + offset) where each new token's K/V go.
    query_start_loc (B+1,) int32: request b's tokens are rows query_start_loc[b]:[b+1].
    seq_lens (B,) int32: context length of each request after this step (cached + new).
    block_tables (B, max_blocks) int32: physical blocks of each request, padded with 0.
    query_lens, seq_lens_cpu, query_start_cpu: the same as Python lists, for host-side loops.
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    query_lens: list[int]
    seq_lens_cpu: list[int]
    query_start_cpu: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu)


@dataclass
class Batch:
    """One step's model input. sample_indices picks the rows whose logits are sampled: the last
    token of each request that reaches the end of its known tokens this step."""

    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    attn: AttentionMetadata
    sample_indices: torch.Tensor  # (S,)
    sampled: list[ScheduledRequest]  # the requests behind sample_indices, in the same order


def build_batch(scheduled: list[ScheduledRequest], block_size: int, device: torch.device) -> Batch:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    sample_rows: list[int] = []
    sampled: list[ScheduledRequest] = []
    for s in scheduled:
        req, start = s.request, s.num_computed_tokens
        end = start + s.num_tokens
        input_ids += req.token_ids[start:end]
        positions += range(start, end)
        table = req.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_start.append(query_start[-1] + s.num_tokens)
        seq_lens.append(end)
        if end == req.num_tokens:  # all known tokens computed: the last one's logits pick the next
            sample_rows.append(query_start[-1] - 1)
            sampled.append(s)
    max_blocks = max(len(s.request.block_table) for s in scheduled)
    tables = [s.request.block_table + [0] * (max_blocks - len(s.request.block_table))
              for s in scheduled]
    # The step's metadata reaches the device here, once, in one copy per dtype from pinned
    # memory: the layers and the sampler read device tensors only, so nothing in the step
    # waits on a host-to-device copy (the attention backends must not build their own).
    input_ids_d, positions_d, slots_d, sample_d = to_device(
        [input_ids, positions, slots, sample_rows], torch.int64, device)
    query_start_d, seq_lens_d, tables_d = to_device(
        [query_start, seq_lens, [b for table in tables for b in table]], torch.int32, device)
    attn = AttentionMetadata(
        slot_mapping=slots_d,
        query_start_loc=query_start_d,
        seq_lens=seq_lens_d,
        block_tables=tables_d.view(len(scheduled), max_blocks),
        query_lens=[s.num_tokens for s in scheduled],
        seq_lens_cpu=seq_lens,
        query_start_cpu=query_start,
        block_size=block_size,
    )
    return Batch(input_ids_d, positions_d, attn, sample_d, sampled)


def to_device(parts: list[list[int]], dtype: torch.dtype, device: torch.device
              ) -> list[torch.Tensor]:
    """Each list as a 1-D tensor on device, all through one (pinned, non-blocking) copy: views
    of one flat tensor, so the copy is launched once whatever the number of parts."""
    flat = host_to_device([v for part in parts for v in part], dtype, device)
    return list(flat.split([len(part) for part in parts]))
