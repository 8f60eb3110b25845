"""Flatten one step's scheduled requests into the tensors the model and attention read.

All tokens of the step sit in one flat row of T tokens, request after request (no padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minillm.request import ScheduledRequest
from minillm.sampling import host_to_device


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
    token of each request that reaches the end of its known tokens this step and, under
    speculative decoding, each of its proposed tokens after it (1 + k rows, in order)."""

    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    attn: AttentionMetadata
    sample_indices: torch.Tensor  # (S,)
    sampled: list[ScheduledRequest]  # the requests behind sample_indices, in the same order
    # Asynchronous scheduling: (row, request id) of each input the previous step is still
    # sampling; input_ids holds 0 there until the engine copies the token in on the device.
    placeholder_rows: list[tuple[int, str]] = field(default_factory=list)


def build_batch(scheduled: list[ScheduledRequest], block_size: int, device: torch.device) -> Batch:
    """A request's rows are its tokens from num_computed_tokens on: known ones, then its
    proposed ones (request.spec_token_ids) when it has them. Under asynchronous scheduling a
    decode's one input may be the token the previous step is still sampling (a placeholder)."""
    rows, sample_rows, sampled, placeholders = [], [], [], []
    first_row = 0
    for s in scheduled:
        req, start = s.request, s.num_computed_tokens
        spec = req.spec_token_ids
        known_end = start + s.num_tokens - len(spec)
        tokens = req.token_ids[start:known_end]
        if known_end > req.num_tokens:  # the step's last input is a placeholder
            placeholders.append((first_row + len(tokens), req.request_id))
            tokens.append(0)
        rows.append((tokens + spec, start, req.block_table))
        first_row += s.num_tokens
        # All its known tokens are in (a placeholder counts): the last one's logits pick the next.
        if known_end == req.num_tokens + req.num_placeholders:
            sample_rows += range(first_row - 1 - len(spec), first_row)
            sampled.append(s)
    input_ids, positions, attn, sample_d = flat_rows(rows, block_size, device, sample_rows)
    return Batch(input_ids, positions, attn, sample_d, sampled, placeholders)


def flat_rows(rows: list[tuple[list[int], int, list[int]]], block_size: int, device: torch.device,
              sample_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                               torch.Tensor]:
    """input_ids, positions, attention metadata and sample_rows on the device, for sequences
    given as (token ids, position of the first, block table): each token goes to the slot its
    position has in the table."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    for tokens, start, table in rows:
        end = start + len(tokens)
        input_ids += tokens
        positions += range(start, end)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_start.append(query_start[-1] + len(tokens))
        seq_lens.append(end)
    max_blocks = max(len(table) for _, _, table in rows)
    tables = [table + [0] * (max_blocks - len(table)) for _, _, table in rows]
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
        block_tables=tables_d.view(len(rows), max_blocks),
        query_lens=[len(tokens) for tokens, _, _ in rows],
        seq_lens_cpu=seq_lens,
        query_start_cpu=query_start,
        block_size=block_size,
    )
    return input_ids_d, positions_d, attn, sample_d


def to_device(parts: list[list[int]], dtype: torch.dtype, device: torch.device
              ) -> list[torch.Tensor]:
    """Each list as a 1-D tensor on device, all through one (pinned, non-blocking) copy: views
    of one flat tensor, so the copy is launched once whatever the number of parts."""
    flat = host_to_device([v for part in parts for v in part], dtype, device)
    return list(flat.split([len(part) for part in parts]))
