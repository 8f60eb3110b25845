"""The KV cache's dtype apart from the weights' (issue 16): the KV formula, the KV wall, the
roofline's step bytes, the simulator's pool and swaps, and the KV calculator widget.

Hand arithmetic: Llama-3-8B keeps 2 * 32 layers * 8 KV heads * 128 dims = 65,536 numbers a
token, 128 KiB in bf16 and 64 KiB in fp8/int8. With bf16 weights only the KV side halves, so
the wall (memory less weights, over KV per sequence) doubles up to the floor: 2n <= n' <= 2n + 1.
Every old call (dtype_bytes alone, positional arguments) must give what it gave before.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from minillm.calc import roofline, sizing
from minillm.calc.roofline import Hardware
from minillm.sim import simulator
from minillm.sim.pricing import Pricing
from minillm.workloads.streams import RequestSpec

pytestmark = [pytest.mark.ch03, pytest.mark.ch10]  # KV sizing, KV dtype

LLAMA = "llama-3-8b"
KV_NUMBERS_PER_TOKEN = 2 * 32 * 8 * 128  # K and V, layers, KV heads, head dim
BLOCK_SIZE = 16


def test_kv_bytes_per_token_by_hand() -> None:
    assert sizing.kv_bytes_per_token(LLAMA, 2) == KV_NUMBERS_PER_TOKEN * 2 == 128 * 2**10
    assert sizing.kv_bytes_per_token(LLAMA, 1) == KV_NUMBERS_PER_TOKEN == 64 * 2**10
    fp8 = sizing.kv_cache_dtype_bytes("fp8")
    assert sizing.kv_cache_bytes(LLAMA, 8192, 4, fp8) == 64 * 2**10 * 8192 * 4


def test_kv_cache_dtype_names() -> None:
    assert sizing.kv_cache_dtype_bytes("auto", 2) == 2  # "auto": the weights' dtype
    assert sizing.kv_cache_dtype_bytes("auto", 4) == 4
    assert sizing.kv_cache_dtype_bytes("fp8", 4) == sizing.kv_cache_dtype_bytes("int8") == 1
    assert sizing.kv_cache_dtype_bytes("bf16", 4) == 2
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp4'.*'auto'"):
        sizing.kv_cache_dtype_bytes("fp4")


def test_fp8_kv_doubles_the_wall_with_bf16_weights() -> None:
    hw = roofline.get_hardware("H100-SXM")
    both_bf16 = sizing.max_concurrency(LLAMA, hw, 8192)
    fp8_kv = sizing.max_concurrency(LLAMA, hw, 8192, dtype_bytes=2, kv_dtype_bytes=1)
    free = hw.memory - sizing.weight_bytes(LLAMA, 2)  # the weights stay at 2 bytes
    assert fp8_kv == int(free // (KV_NUMBERS_PER_TOKEN * 8192))
    assert 2 * both_bf16 <= fp8_kv <= 2 * both_bf16 + 1
    assert (both_bf16, fp8_kv) == (59, 119)
    # fp8 weights too (the old dtype_bytes=1) free another 8 GB for KV: more than fp8 KV alone
    assert sizing.max_concurrency(LLAMA, hw, 8192, dtype_bytes=1) > fp8_kv


def test_old_max_concurrency_calls_are_unchanged() -> None:
    hw = roofline.get_hardware("H200")
    for dtype_bytes in (0.5, 1, 2, 4):
        old = sizing.max_concurrency(LLAMA, hw, 4096, 0.9, dtype_bytes)  # positional, as before
        free = hw.memory * 0.9 - sizing.weight_bytes(LLAMA, dtype_bytes)
        assert old == int(free // sizing.kv_cache_bytes(LLAMA, 4096, 1, dtype_bytes))
        assert old == sizing.max_concurrency(LLAMA, hw, 4096, 0.9, dtype_bytes,
                                             kv_dtype_bytes=None)
        assert old == sizing.max_concurrency(LLAMA, hw, 4096, 0.9, dtype_bytes,
                                             kv_dtype_bytes=dtype_bytes)
    assert sizing.max_concurrency("llama-3-70b", "H100-SXM", 4096, kv_dtype_bytes=1) == 0
    with pytest.raises(ValueError, match="kv_dtype_bytes must be a positive number, got 0"):
        sizing.max_concurrency(LLAMA, hw, 4096, kv_dtype_bytes=0)


def test_step_bytes_price_kv_at_its_own_dtype() -> None:
    entries = [(1, 4096)] * 32 + [(512, 512)]  # a decode batch and a prefill
    kv_tokens = sum(c + n for n, c in entries)  # read over the context, written for the new
    flops, bf16 = roofline.step_flops_bytes(LLAMA, entries, 2)
    flops8, fp8_kv = roofline.step_flops_bytes(LLAMA, entries, 2, kv_dtype_bytes=1)
    assert flops8 == flops  # the math is the same; only the bytes move
    weights = bf16 - KV_NUMBERS_PER_TOKEN * kv_tokens * 2
    assert fp8_kv == weights + KV_NUMBERS_PER_TOKEN * kv_tokens * 1  # weights still at 2 bytes
    _, all_fp8 = roofline.step_flops_bytes(LLAMA, entries, 1)  # the old one-dtype call
    assert all_fp8 == weights / 2 + KV_NUMBERS_PER_TOKEN * kv_tokens
    with pytest.raises(ValueError, match="kv_dtype_bytes must be a positive number"):
        roofline.step_flops_bytes(LLAMA, entries, 2, kv_dtype_bytes=-1)


def test_old_step_time_calls_are_unchanged_and_fp8_kv_cuts_a_long_decode() -> None:
    hw = "H100-SXM"
    old = roofline.step_time(LLAMA, hw, [(1, 8192)] * 64, 2, 1e-4, 1e-6, 1e-6, 0.0)
    same = roofline.step_time(LLAMA, hw, [(1, 8192)] * 64, 2, 1e-4, 1e-6, 1e-6, 0.0,
                              kv_dtype_bytes=2)
    assert old == same
    assert roofline.decode_step_time(LLAMA, hw, 64, 8192) == \
        roofline.decode_step_time(LLAMA, hw, 64, 8192, kv_dtype_bytes=None)
    bf16 = roofline.decode_step_time(LLAMA, hw, 64, 8192)
    fp8_kv = roofline.decode_step_time(LLAMA, hw, 64, 8192, kv_dtype_bytes=1)
    # 64 x 8k of KV is 69 GB against 15 GB of weights read: halving the KV cuts the step ~40%
    kv_bf16 = KV_NUMBERS_PER_TOKEN * 2 * 64 * (8192 + 1)  # read over the context, + 1 written
    assert fp8_kv.bytes == bf16.bytes - kv_bf16 / 2
    assert fp8_kv.memory_time / bf16.memory_time == pytest.approx(1 - kv_bf16 / 2 / bf16.bytes)
    assert fp8_kv.time < 0.65 * bf16.time
    prefill = roofline.prefill_time(LLAMA, hw, 2048, kv_dtype_bytes=1)
    assert prefill.bytes < roofline.prefill_time(LLAMA, hw, 2048).bytes


def _squeezed_h100(blocks_at_bf16: int) -> Hardware:
    """An H100 whose memory holds Llama-3-8B's bf16 weights and that many bf16 KV blocks."""
    block = KV_NUMBERS_PER_TOKEN * BLOCK_SIZE * 2
    return Hardware("squeezed H100", flops=989e12, bandwidth=3.35e12,
                    memory=sizing.weight_bytes(LLAMA, 2) + blocks_at_bf16 * block)


def test_the_simulators_pool_holds_twice_the_blocks() -> None:
    hw = "H100-SXM"
    config = simulator.resolve_config(simulator.models.as_config(LLAMA),
                                      roofline.get_hardware(hw), 2, 0.9, {})
    fp8 = simulator.resolve_config(simulator.models.as_config(LLAMA), roofline.get_hardware(hw),
                                   2, 0.9, {}, kv_dtype_bytes=1)
    assert config.num_kv_blocks is not None and fp8.num_kv_blocks is not None
    assert 2 * config.num_kv_blocks <= fp8.num_kv_blocks <= 2 * config.num_kv_blocks + 1
    # 8 requests of 1,200 tokens need 600 blocks: 300 bf16 blocks preempt, the same bytes at fp8
    # hold them all.
    work = [RequestSpec(0.0, 1000, 200) for _ in range(8)]
    runs = {kv: simulator.simulate(LLAMA, _squeezed_h100(300), work, gpu_memory_utilization=1.0,
                                   kv_dtype_bytes=kv, record_block_tables=False)
            for kv in (None, 1)}
    assert (runs[None].config.num_kv_blocks, runs[1].config.num_kv_blocks) == (300, 600)
    assert runs[None].stats["num_preemptions"] > 0 == runs[1].stats["num_preemptions"]
    assert runs[1].summary().duration < runs[None].summary().duration


def test_swaps_move_blocks_at_the_kv_dtype() -> None:
    """A swap copies block_bytes a block: half at fp8, so the same host GiB holds twice the
    blocks and every copy costs half the host-link time."""
    mc, hw = simulator.models.as_config(LLAMA), _squeezed_h100(200)
    work = [RequestSpec(0.0, 1000, 200) for _ in range(8)]
    sims = {}
    for kv in (None, 1):
        config = simulator.resolve_config(mc, hw, 2, 1.0, {"preemption_mode": "swap",
                                                          "swap_space": 4}, kv)
        sims[kv] = sim = simulator.Simulator(mc, hw, config, Pricing(2, kv_dtype_bytes=kv))
        sim.run(work)
        swap = sim.scheduler.swap_space
        assert swap.swap_out_blocks > 0
        assert sim.stats()["swap_out_bytes"] == swap.swap_out_blocks * sim.block_bytes
    assert sims[None].block_bytes == KV_NUMBERS_PER_TOKEN * BLOCK_SIZE * 2 == \
        2 * sims[1].block_bytes
    assert sims[1].scheduler.swap_space.num_blocks == \
        2 * sims[None].scheduler.swap_space.num_blocks


def test_a_cost_model_without_the_keyword_still_runs() -> None:
    seen: list[dict] = []

    def old_style(model, hw, entries, dtype_bytes=2, *overheads, **named):
        seen.append(named)
        return roofline.step_time(model, hw, entries, dtype_bytes, *overheads, **named)

    work = [RequestSpec(0.0, 64, 4) for _ in range(2)]
    for kv in (None, 2):  # the same dtype as the weights: the keyword is not passed
        simulator.simulate(LLAMA, "H100-SXM", work, step_time=old_style, kv_dtype_bytes=kv)
    assert seen and all(named == {} for named in seen)
    seen.clear()
    simulator.simulate(LLAMA, "H100-SXM", work, step_time=old_style, kv_dtype_bytes=1)
    assert seen and all(named == {"kv_dtype_bytes": 1} for named in seen)


def _texts(svg: str) -> str:
    root = ET.fromstring(svg)
    return "\n".join(el.text or "" for el in root.iter())


def test_the_calculator_shows_the_kv_dtype() -> None:
    pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")
    from widgets.kv_calculator import KV_DTYPES, KVCalculator, kv_numbers

    same = _texts(KVCalculator(LLAMA, context_len=8192).to_svg())
    assert "KV dtype as the weights (2 B)" in same and "2 · 32 · 8 · 128 · 2 = 131,072" in same
    view = KVCalculator(LLAMA, context_len=8192, kv_dtype="fp8")
    shown = _texts(view.to_svg())
    assert "fp8 KV (1 B; weights 2 B): 2 · 32 · 8 · 128 · 1 = 65,536 bytes" in shown
    assert "KV, 1 seq, fp8" in shown  # the legend
    assert "16.1 GB" in shown  # the weights are still bf16
    assert "at most 119 sequences of 8,192 tokens" in shown
    k = view.numbers()
    assert k.max_sequences == sizing.max_concurrency(LLAMA, "H100-SXM", 8192, kv_dtype_bytes=1)
    assert k.weights == sizing.weight_bytes(LLAMA, 2) and k.kv_bytes == 1
    old = kv_numbers(LLAMA, 8192, 1, 2, "H100-SXM")  # the old positional call
    assert old.per_token == 131_072 and old.max_sequences == 59 and old.kv_dtype_bytes is None
    assert KV_DTYPES == ["same as weights", "bf16", "fp8", "int8"]
    assert kv_numbers(LLAMA, 8192, 1, 4, "H100-SXM", "bf16").per_token == 131_072


def test_the_calculators_kv_dtype_is_state() -> None:
    pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")
    from widgets.kv_calculator import KVCalculator

    view = KVCalculator()
    before = view.to_svg()
    view.set_state({"kv_dtype": "INT8"})  # matched case-insensitively, stored canonically
    assert view.get_state()["kv_dtype"] == "int8" and view.to_svg() != before
    assert "int8 KV (1 B; weights 2 B)" in _texts(view.to_svg())
    copy = KVCalculator()
    copy.set_state(view.get_state())
    assert copy.to_svg() == view.to_svg()
    assert {c["name"] for c in view.controls()} == set(view.get_state())
    with pytest.raises(ValueError, match="unknown kv_dtype 'fp4'"):
        view.set_state({"kv_dtype": "fp4"})
