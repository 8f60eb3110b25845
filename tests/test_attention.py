"""The reference paged attention (minillm.attention.torch_ref) against plain dense attention.

Every check builds a paged cache whose unused slots hold garbage, scatters each request's K/V
through a shuffled block table, and compares with softmax(Q K^T / sqrt(D)) V computed in float64
on the same K/V laid out contiguously. Shapes: T tokens in the step, B requests, H query heads,
K KV heads (H = G * K), D head dim, N blocks of P slots, S context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention.torch_ref import (
    TorchAttention,
    decode_attention,
    extend_attention,
    gather_context,
    write_kv,
)
from minillm.batch import AttentionMetadata, build_batch
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ScheduledRequest

NUM_KV_HEADS = 2
# Tolerances of the paged result against the float64 dense result on the same (rounded) inputs.
# fp32 is as tight as the arithmetic allows; bf16 keeps 8 mantissa bits (relative step 2**-8),
# fp16 keeps 11 (2**-11), and the output is rounded to that dtype once more.
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
}


@dataclass
class Row:
    """One request of the step: n new tokens after `prefix` already cached ones."""

    prefix: int
    n: int

    @property
    def seq_len(self) -> int:
        return self.prefix + self.n


@dataclass
class Case:
    q: torch.Tensor  # (T, H, D) new queries of the step
    k: torch.Tensor  # (T, K, D) new keys of the step
    v: torch.Tensor  # (T, K, D)
    kv_cache: torch.Tensor  # (2, N, P, K, D), prefixes already written, garbage elsewhere
    meta: AttentionMetadata
    full_k: list[torch.Tensor]  # per request (S, K, D): prefix then new keys, contiguous
    full_v: list[torch.Tensor]
    tables: list[list[int]]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int
                    ) -> torch.Tensor:
    """Causal attention of n queries at positions prefix.. over S contiguous keys, in float64.

    q (n, H, D), k and v (S, K, D) -> (n, H, D). Query head h reads KV head h // G.
    """
    n, H, D = q.shape
    G = H // k.shape[1]
    q64 = q.double().transpose(0, 1)  # (H, n, D)
    k64 = k.double().repeat_interleave(G, dim=1).transpose(0, 1)  # (S, K, D) -> (H, S, D)
    v64 = v.double().repeat_interleave(G, dim=1).transpose(0, 1)
    scores = q64 @ k64.transpose(1, 2) / math.sqrt(D)  # (H, n, S)
    query_pos = torch.arange(prefix, prefix + n)[:, None]  # (n, 1)
    key_pos = torch.arange(k.shape[0])[None, :]  # (1, S)
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    return (scores.softmax(dim=-1) @ v64).transpose(0, 1)  # (H, n, D) -> (n, H, D)


def slots_of(table: list[int], positions: range, P: int) -> list[int]:
    return [table[p // P] * P + p % P for p in positions]


def make_case(rows: list[Row], P: int, G: int, D: int, dtype: torch.dtype, seed: int = 0,
              spare_blocks: int = 3) -> Case:
    """A step over `rows` with random Q/K/V, a shuffled block table and a garbage-filled pool."""
    gen = torch.Generator().manual_seed(seed)
    K, H = NUM_KV_HEADS, NUM_KV_HEADS * G
    blocks_needed = [-(-r.seq_len // P) for r in rows]
    N = sum(blocks_needed) + spare_blocks
    # Garbage everywhere: a slot that attention must not read would show up in the result.
    kv_cache = (torch.randn(2, N, P, K, D, generator=gen) * 10).to(dtype)
    perm = torch.randperm(N, generator=gen).tolist()
    tables, at = [], 0
    for nb in blocks_needed:
        tables.append(perm[at:at + nb])
        at += nb
    qs, ks, vs, full_k, full_v, slots = [], [], [], [], [], []
    for r, table in zip(rows, tables, strict=True):
        fk = torch.randn(r.seq_len, K, D, generator=gen).to(dtype)
        fv = torch.randn(r.seq_len, K, D, generator=gen).to(dtype)
        full_k.append(fk)
        full_v.append(fv)
        cached = torch.tensor(slots_of(table, range(r.prefix), P), dtype=torch.long)
        kv_cache[0].view(N * P, K, D)[cached] = fk[:r.prefix]
        kv_cache[1].view(N * P, K, D)[cached] = fv[:r.prefix]
        qs.append(torch.randn(r.n, H, D, generator=gen).to(dtype))
        ks.append(fk[r.prefix:])
        vs.append(fv[r.prefix:])
        slots += slots_of(table, range(r.prefix, r.seq_len), P)
    # The metadata the engine would build for this step (batch.build_batch).
    scheduled = []
    for b, (r, table) in enumerate(zip(rows, tables, strict=True)):
        req = Request(str(b), [0] * r.seq_len, SamplingParams(), arrival_time=0.0)
        req.block_table = table
        scheduled.append(ScheduledRequest(req, r.n, r.prefix, "decode" if r.n == 1 else "prefill"))
    meta = build_batch(scheduled, P, torch.device("cpu")).attn
    assert meta.slot_mapping.tolist() == slots  # block_table[pos // P] * P + pos % P
    assert meta.query_lens == [r.n for r in rows]
    assert meta.seq_lens_cpu == [r.seq_len for r in rows]
    return Case(torch.cat(qs), torch.cat(ks), torch.cat(vs), kv_cache, meta, full_k, full_v,
                tables)


def expected_output(case: Case, rows: list[Row]) -> torch.Tensor:
    starts = case.meta.query_start_loc.tolist()
    parts = [dense_attention(case.q[starts[b]:starts[b + 1]], case.full_k[b], case.full_v[b],
                             r.prefix) for b, r in enumerate(rows)]
    return torch.cat(parts)  # (T, H, D) float64


def boundary_rows(P: int) -> list[Row]:
    """Decode rows, whole prompts and extends over a cached prefix, at block boundaries +-1,
    interleaved in a fixed shuffled order."""
    decode = [Row(s - 1, 1) for s in (1, P - 1, P, P + 1, 2 * P, 2 * P + 1) if s >= 1]
    prompts = [Row(0, n) for n in (2, P - 1, P, P + 1, 2 * P - 1) if n >= 2]
    extends = [Row(prefix, n) for prefix in (P - 1, P, P + 1) for n in (2, P + 1) if prefix >= 1]
    rows = list({(r.prefix, r.n): r for r in decode + prompts + extends}.values())
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(P)).tolist()
    return [rows[i] for i in order]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 80])
@pytest.mark.parametrize("G", [1, 4, 5])
@pytest.mark.parametrize("P", [1, 4, 16])
def test_forward_matches_dense_attention_on_a_mixed_batch(P: int, G: int, D: int,
                                                          dtype: torch.dtype) -> None:
    rows = boundary_rows(P)
    assert any(r.n == 1 for r in rows) and any(r.n > 1 and r.prefix == 0 for r in rows)
    assert any(r.n > 1 and r.prefix > 0 for r in rows)
    case = make_case(rows, P, G, D, dtype, seed=P * 100 + G * 10 + D)
    out = TorchAttention().forward(case.q, case.k, case.v, case.kv_cache, case.meta)
    assert out.shape == case.q.shape
    assert_close(out, expected_output(case, rows), dtype)


@pytest.mark.parametrize("P", [1, 4, 16])
def test_forward_leaves_every_token_kv_in_its_slot(P: int) -> None:
    rows = boundary_rows(P)
    case = make_case(rows, P, G=4, D=64, dtype=torch.float32, seed=P)
    TorchAttention().forward(case.q, case.k, case.v, case.kv_cache, case.meta)
    for b, r in enumerate(rows):
        table = case.tables[b]
        for pos in range(r.seq_len):  # the cached prefix is untouched, the new tokens added
            block, offset = table[pos // P], pos % P
            assert torch.equal(case.kv_cache[0, block, offset], case.full_k[b][pos])
            assert torch.equal(case.kv_cache[1, block, offset], case.full_v[b][pos])


@pytest.mark.parametrize("P", [1, 4, 16])
def test_write_kv_puts_each_token_at_its_block_and_offset(P: int) -> None:
    gen = torch.Generator().manual_seed(P)
    N, K, D = 7, 2, 8
    table = torch.randperm(N, generator=gen).tolist()
    positions = range(N * P)
    T = len(positions)
    k = torch.randn(T, K, D, generator=gen)
    v = torch.randn(T, K, D, generator=gen)
    kv_cache = torch.full((2, N, P, K, D), float("nan"))
    slots = torch.tensor([table[p // P] * P + p % P for p in positions])
    write_kv(k, v, kv_cache, slots)
    assert not kv_cache.isnan().any()  # every slot of the pool was filled exactly once
    for t, pos in enumerate(positions):
        assert torch.equal(kv_cache[0, table[pos // P], pos % P], k[t])
        assert torch.equal(kv_cache[1, table[pos // P], pos % P], v[t])


def test_write_kv_touches_only_the_given_slots() -> None:
    N, P, K, D = 4, 4, 2, 8
    kv_cache = torch.zeros(2, N, P, K, D)
    slots = torch.tensor([13, 2, 7])  # block 3 offset 1, block 0 offset 2, block 1 offset 3
    k, v = torch.ones(3, K, D), -torch.ones(3, K, D)
    write_kv(k, v, kv_cache, slots)
    written = torch.zeros(N * P, dtype=torch.bool)
    written[slots] = True
    assert (kv_cache[0].view(N * P, K, D)[written] == 1).all()
    assert (kv_cache[1].view(N * P, K, D)[written] == -1).all()
    assert (kv_cache.view(2, N * P, K, D)[:, ~written] == 0).all()
    assert kv_cache[0, 3, 1].eq(1).all() and kv_cache[0, 0, 2].eq(1).all()
    assert kv_cache[0, 1, 3].eq(1).all()


@pytest.mark.parametrize("P", [1, 4, 16])
@pytest.mark.parametrize("G", [1, 5])
def test_decode_attention_matches_dense_attention(P: int, G: int) -> None:
    rows = [Row(s - 1, 1) for s in (1, P, P + 1, 2 * P - 1, 3 * P) if s >= 1]
    case = make_case(rows, P, G, D=64, dtype=torch.float32, seed=G * P)
    write_kv(case.k, case.v, case.kv_cache, case.meta.slot_mapping)
    out = decode_attention(case.q, case.kv_cache, case.meta.block_tables, case.meta.seq_lens)
    assert out.shape == case.q.shape
    assert_close(out, expected_output(case, rows), torch.float32)


@pytest.mark.parametrize("P", [1, 4, 16])
@pytest.mark.parametrize("prefix", [0, 1, 3, 4, 5, 15, 16, 17])
def test_extend_attention_matches_dense_attention(P: int, prefix: int) -> None:
    rows = [Row(prefix, P + 1)]
    case = make_case(rows, P, G=4, D=80, dtype=torch.float32, seed=P + prefix)
    write_kv(case.k, case.v, case.kv_cache, case.meta.slot_mapping)
    out = extend_attention(case.q, case.kv_cache[0], case.kv_cache[1],
                           case.meta.block_tables[0].long(), rows[0].seq_len)
    assert_close(out, expected_output(case, rows), torch.float32)


def test_gather_context_follows_the_block_table_in_order() -> None:
    N, P, K, D = 6, 4, 1, 1
    cache = torch.arange(N * P, dtype=torch.float).view(N, P, K, D)  # slot s holds s
    table = torch.tensor([5, 0, 3])
    got = gather_context(cache, table, seq_len=10).flatten().tolist()
    assert got == [20, 21, 22, 23, 0, 1, 2, 3, 12, 13]


def test_a_prompt_of_one_token_attends_to_itself_only() -> None:
    rows = [Row(0, 1), Row(0, 3)]
    case = make_case(rows, P=4, G=2, D=64, dtype=torch.float32)
    out = TorchAttention().forward(case.q, case.k, case.v, case.kv_cache, case.meta)
    # With one visible key, every query head returns its KV head's value (head h reads h // G).
    torch.testing.assert_close(out[0], case.full_v[0][0].repeat_interleave(2, dim=0))


@settings(max_examples=25, deadline=None)
@given(
    P=st.sampled_from([1, 2, 4, 8, 16]),
    G=st.sampled_from([1, 2, 3, 4, 5]),
    rows=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20)), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_dense_attention_on_random_batches(
        P: int, G: int, rows: list[tuple[int, int]], seed: int) -> None:
    batch = [Row(prefix, n) for prefix, n in rows]
    case = make_case(batch, P, G, D=16, dtype=torch.float32, seed=seed)
    out = TorchAttention().forward(case.q, case.k, case.v, case.kv_cache, case.meta)
    assert_close(out, expected_output(case, batch), torch.float32)
