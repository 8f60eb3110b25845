"""The IO cost of attention (minillm.attention.io_cost): the peak-memory probe is exact on known
allocations, the HBM byte counts match hand counts of tiny cases, and the modelled traffic of
naive attention outgrows the tiled one's as N grows."""

from __future__ import annotations

import os

import pytest
import torch

from minillm.attention.io_cost import (
    MEASURED_H200,
    SRAM_PER_SM,
    attention_cost,
    attention_flops,
    hbm_bytes_decode,
    hbm_bytes_naive,
    hbm_bytes_tiled,
    peak_memory,
    sram_bytes_of,
    tile_rows,
)
from minillm.attention.online_softmax import naive_attention, tiled_attention

pytestmark = pytest.mark.ch12  # attention as an IO problem

MB = 1_000_000


def test_peak_memory_is_exact_on_one_allocation() -> None:
    assert peak_memory(torch.empty, 1000, 1000) == 4 * MB  # fp32: 4 bytes an element


def test_peak_memory_sees_frees_in_order() -> None:
    def allocate_free_allocate() -> torch.Tensor:
        a = torch.empty(MB, dtype=torch.uint8)
        b = torch.empty(2 * MB, dtype=torch.uint8)
        del a  # freed before c exists: the peak is a + b, not a + b + c
        c = torch.empty(MB // 2, dtype=torch.uint8)
        return b, c

    assert peak_memory(allocate_free_allocate) == 3 * MB


def test_peak_memory_leaves_out_what_was_live_before() -> None:
    x = torch.empty(MB, dtype=torch.uint8)
    assert peak_memory(torch.Tensor.clone, x) == MB  # the copy, not the input
    assert peak_memory(lambda t: t.add_(1), x) < 64  # in place: only the scalar 1 as a tensor


def test_peak_memory_is_deterministic_and_quadratic_for_naive_attention() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 256, 16) for _ in range(3))
    first = peak_memory(naive_attention, q, k, v, False)
    assert peak_memory(naive_attention, q, k, v, False) == first
    scores = 2 * 256 * 256 * 4  # one (H, T, S) fp32 tensor
    assert scores <= first <= 3 * scores, "scores and probabilities, at most a third copy"
    assert peak_memory(tiled_attention, q, k, v, False) < scores


def test_naive_bytes_by_hand() -> None:
    # N = 2, D = 3: read Q, K (12), write S (4), read S, write P (8), read P, V (4 + 6),
    # write O (6): 40 elements of 2 bytes.
    assert hbm_bytes_naive(2, 3, 1, 2) == 80
    assert hbm_bytes_naive(2, 3, 5, 2) == 5 * 80


def test_tiled_bytes_by_hand() -> None:
    # 1,024 bytes of SRAM hold four 32 x 4 tiles of 2-byte elements: B = 32. N = 64: two query
    # tiles, each reading all of K and V (2 x 64 x 4), plus Q and O once (2 x 64 x 4).
    assert tile_rows(4, 2, 1024) == 32
    per_head = 2 * 64 * 4 + 2 * (2 * 64 * 4)
    assert hbm_bytes_tiled(64, 4, 2, 2, 1024) == 2 * 2 * per_head
    # N = 65 needs a third query tile and a third pass over K and V.
    assert hbm_bytes_tiled(65, 4, 1, 2, 1024) == 2 * (2 * 65 * 4 + 3 * (2 * 65 * 4))


def test_flops_by_hand() -> None:
    assert attention_flops(2, 3, 1) == 2 * (2 * 2 * 2 * 3)  # two matmuls of 2 x 3 x 2 MACs


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM"])
@pytest.mark.parametrize("D", [64, 128])
def test_naive_over_tiled_grows_with_n(gpu: str, D: int) -> None:
    sram = SRAM_PER_SM[gpu]
    ratios = [hbm_bytes_naive(N, D, 32, 2) / hbm_bytes_tiled(N, D, 32, 2, sram)
              for N in (2 ** e for e in range(8, 18))]
    assert all(a < b for a, b in zip(ratios, ratios[1:])), ratios
    # The limit 2B/D: both counts grow as N², tiling divides the constant by B / (2D).
    limit = 2 * tile_rows(D, 2, sram) / D
    assert ratios[-1] < limit and ratios[-1] > 0.9 * limit


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM"])
def test_naive_is_memory_bound_and_tiled_compute_bound_at_long_n(gpu: str) -> None:
    naive, tiled = attention_cost(16384, 64, 32, gpu)
    assert naive.bound == "memory" and tiled.bound == "compute"
    assert naive.flops == tiled.flops and naive.bytes > 5 * tiled.bytes
    assert naive.time > 3 * tiled.time


def test_invalid_inputs_name_the_value() -> None:
    with pytest.raises(ValueError, match="S must be a positive int, got 0"):
        hbm_bytes_naive(0, 64, 1, 2)
    with pytest.raises(ValueError, match="K .KV heads. must be a positive int dividing H = 32, "
                                         "got 5"):
        hbm_bytes_decode(1024, 128, 32, 5, 2)
    with pytest.raises(ValueError, match="dtype_bytes"):
        hbm_bytes_tiled(64, 64, 1, 0, 1024)
    with pytest.raises(ValueError, match="cannot hold four 1 x 64 tiles"):
        hbm_bytes_tiled(64, 64, 1, 2, 256)
    with pytest.raises(ValueError, match="no SRAM size for 'T4'"):
        sram_bytes_of("T4")


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM"])
def test_tiled_traffic_is_s2_d2_over_m(gpu: str) -> None:
    """The re-read part of the tiled count is Θ(S²·D²/M): at a fixed SRAM, doubling D
    quadruples it (R halves, each pass reads twice the bytes); halving M doubles it. A count
    O(S²/M), without the D², would leave D's doubling at 1x."""
    sram, S = SRAM_PER_SM[gpu], 65536

    def rereads(D: int, sram_bytes: int) -> float:  # less Q read and O written, once each
        return hbm_bytes_tiled(S, D, 1, 2, sram_bytes) - 2 * 2 * S * D

    assert rereads(128, sram) / rereads(64, sram) == pytest.approx(4, rel=0.02)
    assert rereads(128, sram // 2) / rereads(128, sram) == pytest.approx(2, rel=0.02)
    assert rereads(128, sram) == pytest.approx(8 * S**2 * 128**2 / (sram / 2) * 2, rel=0.02)


def test_decode_traffic_is_linear_in_s_and_tiling_saves_little() -> None:
    """One decode token over S positions: K/V read once, linear in S whether or not the scores
    are written out; the scores FlashAttention keeps on chip are 2·H/(K·D) of it."""
    H, K, D = 32, 8, 128  # Llama-3-8B
    for materialized in (False, True):
        one, two = (hbm_bytes_decode(S, D, H, K, 2, materialized) for S in (4096, 8192))
        assert two / one == pytest.approx(2, rel=0.01)
    flash, naive = (hbm_bytes_decode(4096, D, H, K, 2, m) for m in (False, True))
    assert flash == 2 * (2 * 4096 * K * D + 2 * H * D)
    assert (naive - flash) / flash == pytest.approx(2 * H / (K * D), rel=0.01)  # 6%


def test_measured_h200_fractions() -> None:
    bandwidth, flops = MEASURED_H200.fractions_of_peak()
    assert bandwidth == pytest.approx(4431 / 4800) and flops == pytest.approx(339 / 989)
    assert len(MEASURED_H200.commit) == 40


def test_peak_memory_passes_on_what_fn_writes_to_stderr(capfd: pytest.CaptureFixture) -> None:
    peak_memory(lambda: os.write(2, b"a warning of fn's own\n"))
    err = capfd.readouterr().err
    assert "a warning of fn's own" in err and "profiler_start" not in err
