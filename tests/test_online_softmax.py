"""Tiled attention and the online softmax (minillm.attention.online_softmax) against float64.

Tolerances: every function computes in fp32 and returns its input's dtype, so the reference is
naive_attention in float64 on the same (already rounded) inputs, and the error allowed is two
units in the last place of the output dtype at |O| < 4 (outputs are weighted means of V ~ N(0, 1)):
4e-3 in fp16 (ulp 2^-9 in [2, 4)), 3e-2 in bf16 (ulp 2^-6), and 2e-5 in fp32, where the sums of
a few hundred fp32 terms, not the output's rounding, set the error. Measured: 4e-7, 5e-4, 4e-3.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention.online_softmax import (
    causal_mask,
    merge_splits,
    naive_attention,
    online_softmax_update,
    split_kv_attention,
    tile_schedule,
    tiled_attention,
)

pytestmark = pytest.mark.ch12  # attention as an IO problem

ATOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}


def qkv(H: int, T: int, S: int, D: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, T, D, generator=g).to(dtype),
            *(torch.randn(H, S, D, generator=g).to(dtype) for _ in range(2)))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return naive_attention(q.double(), k.double(), v.double(), causal)


def assert_matches_float64(out: torch.Tensor, q, k, v, causal: bool) -> None:
    assert out.dtype == q.dtype
    error = (out.double() - reference(q, k, v, causal)).abs().max().item()
    assert error <= ATOL[q.dtype], f"{q.dtype}: max error {error:.2e} > {ATOL[q.dtype]:.0e}"


@pytest.mark.parametrize("dtype", list(ATOL), ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_tiled_equals_float64(dtype: torch.dtype, causal: bool) -> None:
    q, k, v = qkv(3, 150, 150, 32, dtype)
    assert_matches_float64(tiled_attention(q, k, v, causal, block_m=32, block_n=32),
                           q, k, v, causal)
    assert_matches_float64(naive_attention(q, k, v, causal), q, k, v, causal)


@pytest.mark.parametrize("dtype", list(ATOL), ids=str)
@pytest.mark.parametrize(("T", "S"), [(37, 150), (1, 150), (1, 1), (101, 101)],
                         ids=["extend", "decode", "one-token", "odd"])
def test_extend_decode_and_odd_sizes(dtype: torch.dtype, T: int, S: int) -> None:
    q, k, v = qkv(2, T, S, 24, dtype, seed=T)
    for block_m, block_n in ((16, 32), (64, 64), (7, 13)):  # none divides 101 or 150
        out = tiled_attention(q, k, v, True, block_m=block_m, block_n=block_n)
        assert_matches_float64(out, q, k, v, causal=True)


def test_large_scores_do_not_overflow() -> None:
    q, k, v = qkv(1, 64, 64, 16, torch.float32)
    q = q * 200  # scores of several thousand: exp would overflow without the max subtracted
    out = tiled_attention(q, k, v, True, block_m=16, block_n=16)
    assert torch.isfinite(out).all()
    assert (out.double() - reference(q, k, v, True)).abs().max() < 1e-4


def test_a_row_that_has_seen_nothing_stays_empty() -> None:
    m, l, acc = torch.full((1, 2), -math.inf), torch.zeros(1, 2), torch.zeros(1, 2, 3)
    scores = torch.full((1, 2, 4), -math.inf)  # every key masked
    m, l, acc = online_softmax_update(m, l, acc, scores, torch.randn(1, 4, 3))
    assert torch.isinf(m).all() and (l == 0).all() and (acc == 0).all()  # no NaN


def test_lse_is_the_log_sum_exp_of_the_scores() -> None:
    q, k, v = qkv(2, 40, 90, 16, torch.float64)
    _, lse = tiled_attention(q, k, v, True, block_m=16, block_n=32, return_lse=True)
    scores = (q @ k.transpose(1, 2) * 16 ** -0.5).masked_fill(~causal_mask(40, 90), -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))


@pytest.mark.parametrize("dtype", list(ATOL), ids=str)
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_split_kv_equals_unsplit(dtype: torch.dtype, num_splits: int) -> None:
    q, k, v = qkv(4, 1, 333, 32, dtype)
    out = split_kv_attention(q, k, v, num_splits, block_n=32)
    assert_matches_float64(out, q, k, v, causal=False)


def test_merge_of_two_halves_equals_the_whole_with_its_lse() -> None:
    q, k, v = qkv(2, 5, 100, 16, torch.float64)
    halves = [tiled_attention(q, k[:, a:b], v[:, a:b], False, return_lse=True)
              for a, b in ((0, 30), (30, 100))]
    out, lse = merge_splits(torch.stack([o for o, _ in halves]),
                            torch.stack([s for _, s in halves]))
    whole, whole_lse = tiled_attention(q, k, v, False, return_lse=True)
    torch.testing.assert_close(out, whole)
    torch.testing.assert_close(lse, whole_lse)


def test_a_split_that_sees_no_key_weighs_nothing() -> None:
    q, k, v = qkv(2, 1, 64, 16, torch.float64)
    seen, seen_lse = tiled_attention(q, k, v, False, return_lse=True)
    empty, empty_lse = torch.zeros_like(seen), torch.full_like(seen_lse, -math.inf)
    out, lse = merge_splits(torch.stack([empty, seen, empty]),
                            torch.stack([empty_lse, seen_lse, empty_lse]))
    torch.testing.assert_close(out, seen)
    torch.testing.assert_close(lse, seen_lse)
    # More splits than keys: the empty ranges are skipped, the rest still merge exactly.
    assert_matches_float64(split_kv_attention(q, k[:, :5], v[:, :5], 8), q, k[:, :5],
                           v[:, :5], causal=False)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 80), extra=st.integers(0, 80), block_m=st.integers(1, 40),
       block_n=st.integers(1, 40), causal=st.booleans())
def test_tile_schedule_covers_each_visible_pair_once(T: int, extra: int, block_m: int,
                                                     block_n: int, causal: bool) -> None:
    S = T + extra
    visible = causal_mask(T, S) if causal else torch.ones(T, S, dtype=torch.bool)
    covered = torch.zeros(T, S, dtype=torch.int32)
    for (i0, i1), key_tiles in tile_schedule(T, S, causal, block_m, block_n):
        for j0, j1, diagonal in key_tiles:
            tile = visible[i0:i1, j0:j1]
            assert tile.any(), "a tile above the diagonal (nothing visible) was scheduled"
            assert diagonal == (not tile.all()), "only tiles that cross the diagonal are masked"
            covered[i0:i1, j0:j1] += 1
    assert torch.equal(covered[visible], torch.ones_like(covered[visible]))


def test_causal_prefill_skips_the_tiles_above_the_diagonal() -> None:
    schedule = tile_schedule(256, 256, True, 64, 64)
    assert [len(keys) for _, keys in schedule] == [1, 2, 3, 4]  # 10 of 16 tiles
    assert all(keys[-1][2] and not any(d for *_, d in keys[:-1]) for _, keys in schedule)
    assert sum(len(k) for _, k in tile_schedule(256, 256, False, 64, 64)) == 16
