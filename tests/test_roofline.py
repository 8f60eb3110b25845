"""The roofline and the step cost model (minillm.roofline), against the practitioner's guide.

Tolerances: ridge points to 3% (the guide rounds the A100's 2.039 TB/s to 2.0, giving 156 where
the datasheet gives 153); the 70B-on-H100 example to 5% (the guide rounds the weights to 140 GB
and counts prefill as 2 * N * P; we read the weights actually streamed, leave out an untied
embedding table that is only gathered, and add the causal attention FLOPs).
"""

from __future__ import annotations

import math

import pytest

from minillm.calc import models, roofline
from minillm.calc.roofline import (
    HARDWARE,
    Hardware,
    StepCost,
    arithmetic_intensity,
    decode_step_time,
    get_hardware,
    measure_machine,
    prefill_time,
    ridge_point,
    step_flops_bytes,
    step_time,
)

pytestmark = pytest.mark.ch02  # the roofline


@pytest.mark.parametrize("name,ridge", [("A100-80GB", 156), ("H100-SXM", 295), ("H200", 206)])
def test_ridge_points(name, ridge):
    assert ridge_point(name) == pytest.approx(ridge, rel=0.03)


def test_hardware_table_is_dense_bf16():
    """Dense, not the 2:1-sparse marketing figure: H100 SXM ~989 TFLOP/s, not 1,979."""
    h100 = get_hardware("h100-sxm")
    assert h100 is HARDWARE["H100-SXM"]
    assert (h100.flops, h100.bandwidth, h100.memory) == (989e12, 3.35e12, 80e9)
    for name in ("A100-80GB", "H100-SXM", "H200", "L4", "A100-40GB", "H100-PCIe", "T4",
                 "RTX-4090"):
        assert get_hardware(name.lower()).name == name
    assert get_hardware(h100) is h100
    with pytest.raises(ValueError, match="unknown hardware 'B300'.*H200"):
        get_hardware("B300")
    with pytest.raises(ValueError, match="bandwidth must be a positive number"):
        Hardware("broken", flops=1e12, bandwidth=0, memory=1e9)


def test_70b_on_one_h100_decode():
    """'2N / HBM_BW = 140 GB / 3.35 TB/s ~ 42 ms/token', memory-bound."""
    cost = decode_step_time("llama-3-70b", "H100-SXM", batch=1, context_len=1)
    assert cost.time == pytest.approx(0.042, rel=0.05)
    assert cost.bound == "memory" and cost.time == cost.memory_time
    assert 1 / cost.time == pytest.approx(24, rel=0.05)  # '~24 tok/s'


def test_70b_on_one_h100_prefill_4k():
    """'2 * 70e9 * 4096 / 989e12 ~ 0.58 s' (5.7e14 FLOPs), compute-bound."""
    cost = prefill_time("llama-3-70b", "H100-SXM", prompt_len=4096)
    assert cost.time == pytest.approx(0.58, rel=0.05)
    assert cost.flops == pytest.approx(5.7e14, rel=0.05)
    assert cost.bound == "compute"
    assert float(cost) == cost.time


def test_decode_intensity_is_about_the_batch():
    """FLOPs 2NB over bytes 2N: intensity ~ B while the KV reads are small (short contexts)."""
    for batch in (1, 2, 8, 32, 64):
        ai = arithmetic_intensity("llama-3-8b", batch, "decode", context_len=128)
        assert 0.9 * batch <= ai <= 1.05 * batch
    # Long contexts add K/V reads per sequence that no batch shares: intensity flattens.
    assert arithmetic_intensity("llama-3-8b", 256, "decode", 8192) < 64


def test_prefill_intensity_grows_with_prompt_length():
    ais = [arithmetic_intensity("llama-3-8b", 1, "prefill", p) for p in (16, 128, 1024, 8192)]
    assert ais == sorted(ais)
    for p, ai in zip((16, 128, 1024, 8192), ais):
        assert 0.85 * p <= ai <= 1.05 * p
    # A 4k prefill sits far right of the H100 ridge; batch-1 decode far left.
    assert ais[-1] > ridge_point("H100-SXM") > arithmetic_intensity("llama-3-8b", 1, "decode", 1)


def test_mixed_batch_is_the_sum_of_its_parts_with_weights_once():
    decodes, chunk = [(1, 300), (1, 1200), (1, 77)], [(256, 1024)]
    f_d, b_d = step_flops_bytes("llama-3-8b", decodes)
    f_c, b_c = step_flops_bytes("llama-3-8b", chunk)
    f_m, b_m = step_flops_bytes("llama-3-8b", decodes + chunk)
    weights = roofline._shape(models.get("llama-3-8b")).read_params * 2
    assert f_m == f_d + f_c
    assert b_m == b_d + b_c - weights
    mixed = step_time("llama-3-8b", "H100-SXM", decodes + chunk)
    assert mixed.time == max(mixed.compute_time, mixed.memory_time)
    assert mixed.time < (step_time("llama-3-8b", "H100-SXM", decodes).time
                         + step_time("llama-3-8b", "H100-SXM", chunk).time)


def test_attention_is_causal_so_chunking_keeps_the_flops():
    """Two chunks of a prompt see the same (query, key) pairs as one prefill; each chunk pays
    one lm_head row (the step's logits)."""
    whole, _ = step_flops_bytes("llama-3.2-1b", [(1000, 1000)])
    first, _ = step_flops_bytes("llama-3.2-1b", [(600, 600)])
    second, _ = step_flops_bytes("llama-3.2-1b", [(400, 1000)])
    lm_head = roofline._shape(models.get("llama-3.2-1b")).lm_head_params
    assert first + second == whole + 2 * lm_head


def test_decode_cost_grows_with_context_and_batch():
    t = [decode_step_time("llama-3-8b", "H100-SXM", b, 4096).time for b in (1, 16, 64)]
    assert t == sorted(t) and t[-1] < 64 * t[0] / 10  # batching amortizes the weight read
    assert (decode_step_time("llama-3-8b", "H100-SXM", 8, 8192).time
            > decode_step_time("llama-3-8b", "H100-SXM", 8, 512).time)


def test_overheads_add_to_the_roofline_time():
    entries = [(1, 100)] * 4 + [(64, 64)]
    bare = step_time("qwen2.5-0.5b", "L4", entries)
    cost = step_time("qwen2.5-0.5b", "L4", entries, overhead=1e-3, overhead_per_token=1e-6)
    assert isinstance(cost, StepCost)
    assert cost.overhead == pytest.approx(1e-3 + 68e-6)
    assert cost.time == pytest.approx(bare.time + 1e-3 + 68e-6)


@pytest.mark.parametrize("entries,match", [
    ([], "entries is empty"),
    ([(0, 10)], r"num_new_tokens=0"),
    ([(20, 10)], r"num_new_tokens=20, context_len=10"),
])
def test_bad_entries(entries, match):
    with pytest.raises(ValueError, match=match):
        step_time("llama-3-8b", "H200", entries)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="phase must be 'prefill' or 'decode', got 'train'"):
        arithmetic_intensity("llama-3-8b", 1, "train", 128)
    with pytest.raises(ValueError, match="batch must be a positive int, got 0"):
        decode_step_time("llama-3-8b", "H200", 0, 128)
    with pytest.raises(ValueError, match="prompt_len=8 is for phase='prefill'"):
        arithmetic_intensity("llama-3-8b", 1, "decode", 128, prompt_len=8)
    with pytest.raises(ValueError, match="overheads must be >= 0"):
        step_time("llama-3-8b", "H200", [(1, 1)], overhead=-1.0)


def test_measure_machine_returns_a_usable_hardware():
    """Positive, finite peaks; no assertion on how fast this machine is."""
    hw = measure_machine(device="cpu", seconds=0.2)
    assert hw.name == "this machine (cpu)"
    for value in (hw.flops, hw.bandwidth, hw.memory):
        assert value > 0 and math.isfinite(value)
    assert ridge_point(hw) > 0
    assert step_time(models.get("qwen2.5-0.5b"), hw, [(1, 16)]).time > 0


def _crossover_by_hand(name: str, hw_name: str, b: int = 2) -> int:
    # Prefill of P tokens from scratch is compute-bound when FLOPs >= ridge * bytes:
    #   FLOPs = 2*W*P + 2*V*E + 4*H*D*L * P(P+1)/2      (projections, one LM-head row, attention)
    #   bytes = (R + 2*L*K*D * 2P) * b                   (weights once; K/V read and written)
    # with W the layers' projection weights and R the weights read. A quadratic in P.
    c = models.get(name)
    E, H, K, D, F, L, V = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                           c.head_dim, c.intermediate_size, c.num_hidden_layers, c.vocab_size)
    W = L * (2 * E * H * D + 2 * E * K * D + 3 * E * F)
    R = c.num_params - (0 if c.tie_word_embeddings else V * E)
    A, kv, ridge = 4 * H * D * L, 2 * L * K * D, roofline.ridge_point(hw_name)
    qa, qb, qc = A / 2, 2 * W + A / 2 - ridge * kv * 2 * b, 2 * V * E - ridge * R * b
    return math.ceil((-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa))


@pytest.mark.parametrize("name, hw_name, expected", [
    ("llama-3-8b", "A100-80GB", 165), ("llama-3-8b", "H100-SXM", 318), ("llama-3-8b", "H200", 222),
    ("llama-3-70b", "A100-80GB", 156), ("llama-3-70b", "H100-SXM", 300),
    ("llama-3-70b", "H200", 209),
])
def test_prefill_crossover_matches_the_hand_computed_prompt_length(name, hw_name, expected):
    assert _crossover_by_hand(name, hw_name) == expected
    assert roofline.prefill_crossover(name, hw_name) == expected
    # the step just below the crossover is memory-bound, the crossover itself compute-bound
    assert roofline.prefill_time(name, hw_name, expected - 1).bound == "memory"
    assert roofline.prefill_time(name, hw_name, expected).bound == "compute"


def test_prefill_crossover_is_not_a_few_dozen_tokens_on_a_datacenter_gpu():
    # The rule of thumb "compute-bound past a few dozen tokens" holds only where the ridge is
    # low: Llama-3-8B prefill of 128 tokens is memory-bound on an H100 (intensity ~119 < 295).
    assert roofline.prefill_time("llama-3-8b", "H100-SXM", 128).bound == "memory"
    assert roofline.prefill_crossover("llama-3-8b", "H100-SXM") > 2 * 128
    cpu = roofline.Hardware("a laptop core", flops=1e11, bandwidth=2.5e10, memory=16e9)
    assert roofline.prefill_crossover("llama-3-8b", cpu, dtype_bytes=4) < 16
    # fewer bytes per weight double the intensity: FP8 halves the crossover, about
    fp8 = roofline.prefill_crossover("llama-3-8b", "H100-SXM", dtype_bytes=1)
    assert 0.4 < fp8 / 318 < 0.6
