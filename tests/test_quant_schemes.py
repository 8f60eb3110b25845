"""The weight quantization schemes as the cost model prices them (minillm.quant.schemes)."""

from __future__ import annotations

import pytest

from minillm.calc import parallel
from minillm.calc.parallel import ParallelConfig
from minillm.quant.schemes import SCHEMES, get_scheme

MODEL, GPU = "llama-3-8b", "H100-SXM"


def step(scheme: str, entries: list[tuple[int, int]]) -> float:
    return parallel.parallel_step_time(MODEL, GPU, entries, ParallelConfig(1),
                                       **SCHEMES[scheme].step_kwargs()).time


def test_weight_only_schemes_speed_decode_not_prefill() -> None:
    decode, prefill = [(1, 1024)], [(4096, 4096)]
    assert step("int8", decode) < 0.6 * step("bf16", decode)
    assert step("int4", decode) < 0.65 * step("int8", decode)
    # prefill is compute-bound: a weight-only scheme computes in bf16, so it buys nothing
    assert step("int8", prefill) == pytest.approx(step("bf16", prefill), rel=0.02)
    assert step("int4", prefill) == pytest.approx(step("bf16", prefill), rel=0.02)


def test_fp8_w8a8_doubles_the_matmul_peak_so_prefill_gains_too() -> None:
    prefill = [(4096, 4096)]
    gain = step("bf16", prefill) / step("fp8", prefill)
    assert 1.5 < gain < 2.0, "the weight matmuls run at 2x; attention stays at the bf16 peak"


def test_speedup_one_is_the_unchanged_step() -> None:
    entries = [(512, 512), (1, 2000)]
    plain = parallel.parallel_step_time(MODEL, GPU, entries, ParallelConfig(2))
    same = parallel.parallel_step_time(MODEL, GPU, entries, ParallelConfig(2), matmul_speedup=1.0)
    assert plain.time == same.time


def test_fp8_needs_fp8_tensor_cores() -> None:
    SCHEMES["fp8"].check("H100-SXM")
    with pytest.raises(ValueError, match="A100-80GB has none"):
        SCHEMES["fp8"].check("A100-80GB")
    SCHEMES["int4"].check("T4")


def test_bad_names_and_speedups_are_named() -> None:
    with pytest.raises(ValueError, match="'int3' is not one of"):
        get_scheme("int3")
    assert get_scheme(None).name == "bf16"
    with pytest.raises(ValueError, match="matmul_speedup must be a positive number, got 0"):
        parallel.parallel_step_time(MODEL, GPU, [(1, 10)], ParallelConfig(1), matmul_speedup=0)
