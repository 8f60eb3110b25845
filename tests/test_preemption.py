"""The preemption cost model: hand arithmetic for one case, and how model and link move the
crossover between recompute and swap."""

import dataclasses

import pytest

from minillm.calc import models, roofline
from minillm.calc.preemption import PreemptionCost, crossover_context_len, preemption_costs

pytestmark = pytest.mark.ch09

# Llama-3-8B's shape with full multi-head attention (32 KV heads, as Llama-2-7B has): 4x the
# K/V a token holds, for the same weights.
LLAMA_MHA = dataclasses.replace(models.get("llama-3-8b"), num_key_value_heads=32)


def test_llama_3_8b_on_h100_matches_hand_arithmetic():
    c = models.get("llama-3-8b")
    E, H, K, D, F, L = 4096, 32, 8, 128, 14336, 32
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.num_hidden_layers) == (E, H, K, D, F, L)
    S = 1000
    # Recompute: the prefill of S tokens, projections 2 * W * S and attention 4 * H * D * L per
    # (query, key) pair over S * (S + 1) / 2 pairs; no lm_head row (that token was due anyway).
    projections = L * (2 * E * H * D + 2 * E * K * D + 3 * E * F)
    flops = 2 * projections * S + 4 * H * D * L * S * (S + 1) // 2
    # Swap: 2 (K and V) * L * K * D * 2 bytes = 128 KiB a token, out and back in.
    moved = 2 * S * (2 * L * K * D * 2)
    (cost,) = preemption_costs("llama-3-8b", "H100-SXM", [S])
    assert cost.context_len == S
    assert cost.recompute_flops == pytest.approx(flops, rel=1e-12)
    assert cost.recompute_s == pytest.approx(flops / 989e12)  # ~14.4 ms
    assert cost.swap_bytes == moved == 262_144_000
    assert cost.swap_s == pytest.approx(moved / 63e9)  # PCIe 5.0 x16: ~4.2 ms
    assert cost.cheaper == "swap"


def test_cheaper_names_the_faster_and_a_tie_goes_to_recompute():
    assert PreemptionCost(8, 2.0, 1.0, 0.0, 0.0).cheaper == "swap"
    assert PreemptionCost(8, 1.0, 2.0, 0.0, 0.0).cheaper == "recompute"
    assert PreemptionCost(8, 1.0, 1.0, 0.0, 0.0).cheaper == "recompute"


def test_recompute_grows_faster_than_the_context_and_swap_linearly():
    short, long = preemption_costs("qwen2.5-0.5b", "A100-80GB", [1024, 8192])
    assert long.swap_bytes == 8 * short.swap_bytes
    assert long.swap_s == pytest.approx(8 * short.swap_s)
    assert long.recompute_flops > 9 * short.recompute_flops  # the quadratic attention term


def test_mha_has_a_crossover_where_gqa_swaps_everywhere():
    # GQA keeps a token's K/V small: swapping it beats recomputing it from the first token.
    assert preemption_costs("llama-3-8b", "H100-SXM", [1])[0].cheaper == "swap"
    assert crossover_context_len("llama-3-8b", "H100-SXM") is None
    # MHA's 4x K/V costs more to copy than the projections cost to recompute, until the
    # attention term catches up.
    cross = crossover_context_len(LLAMA_MHA, "H100-SXM", max_len=131072)
    assert cross is not None and 1000 < cross < 10000
    before, at = preemption_costs(LLAMA_MHA, "H100-SXM", [cross - 1, cross])
    assert (before.cheaper, at.cheaper) == ("recompute", "swap")


def test_a_faster_host_link_moves_the_crossover_to_shorter_contexts():
    # Qwen3-0.6B: a small model with 8 KV heads of 128 dims, so its K/V are heavy.
    h100 = crossover_context_len("qwen3-0.6b", "H100-SXM")  # PCIe 5.0
    assert h100 is not None
    faster = dataclasses.replace(roofline.get_hardware("H100-SXM"), name="H100 with 2x link",
                                 host_link=2 * 63e9)
    quicker = crossover_context_len("qwen3-0.6b", faster)
    assert quicker is not None and quicker < h100 / 2
    # NVLink-C2C (GH200, 450 GB/s): swap wins at every length.
    assert crossover_context_len("qwen3-0.6b", "GH200") is None
    assert preemption_costs("qwen3-0.6b", "GH200", [1])[0].cheaper == "swap"


def test_none_when_recompute_wins_up_to_max_len():
    assert crossover_context_len(LLAMA_MHA, "H100-SXM", max_len=1000) is None
    assert preemption_costs(LLAMA_MHA, "H100-SXM", [1000])[0].cheaper == "recompute"


def test_a_memory_bound_step_hides_a_short_recompute():
    busy, = preemption_costs("llama-3-8b", "H100-SXM", [128])
    alone, = preemption_costs("llama-3-8b", "H100-SXM", [128], running=[])
    # The resume's step reads the weights either way: 128 tokens of compute fit under them.
    assert alone.recompute_s < busy.recompute_s / 100
    assert alone.recompute_flops == busy.recompute_flops


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="context_len must be a positive int.*got 0"):
        preemption_costs("llama-3-8b", "H100-SXM", [0])
    with pytest.raises(ValueError, match="max_len must be a positive int.*got -5"):
        crossover_context_len("llama-3-8b", "H100-SXM", max_len=-5)
    with pytest.raises(ValueError, match="unknown hardware"):
        preemption_costs("llama-3-8b", "H1000", [16])


@pytest.mark.parametrize("model, hw, fit", [
    ("llama-3-8b", "T4", False),  # 16.1 GB of 16-bit weights on a 16 GB card
    ("llama-3-8b", "A100-80GB", True),
    ("llama-3-70b", "H100-SXM", False),  # 141 GB
    ("llama-3-70b", "GH200", False),  # 141 GB of 144 GB: no room at 0.9 utilisation
    ("qwen3-0.6b", "T4", True),
])
def test_fits_is_weights_plus_one_request_within_the_usable_memory(model, hw, fit) -> None:
    from minillm.calc.preemption import crossover_summary, fits

    assert fits(model, hw) is fit
    cell = crossover_summary(model, hw)
    assert cell.startswith("does not fit") is not fit, cell
    if fit:
        assert "every length" in cell or cell.startswith("swap from ")


def test_a_crossover_table_row_says_plainly_what_does_not_fit() -> None:
    from minillm.calc.preemption import crossover_summary

    assert crossover_summary("llama-3-8b", "T4") == "does not fit (16 GB > 14 GB)"
    assert crossover_summary("llama-3-8b", "H100-SXM") == "swap at every length"
    cross = crossover_context_len("qwen3-0.6b", "H100-SXM")
    assert crossover_summary("qwen3-0.6b", "H100-SXM") == f"swap from {cross:,}"
