"""Speculative decoding's cost model (minillm.spec.cost): the formula E = (1 - a^(k+1)) / (1 - a)
and its price on the roofline.

Hand arithmetic for the H100 claims (Llama-3-8B in bf16, 16 GB of weights, 3.35 TB/s,
989 TFLOP/s): a decode step at batch 1 reads the weights in ~4.5 ms and computes for ~0.02 ms,
so checking 5 tokens instead of 1 costs ~nothing and the speedup is E(0.8, 4) = 3.36. Each
request adds 5 * 16 GFLOP to the verify step, ~0.08 ms: past ~60 requests it is compute-bound,
and at short contexts (256 tokens, little K/V to read) it costs more than E decode steps from
~350 requests on, where speculation loses.
"""

from __future__ import annotations

import pytest

from minillm.calc import roofline
from minillm.spec.cost import (
    best_num_speculative_tokens,
    check_fits,
    expected_tokens_per_step,
    speculative_speedup,
    speculative_step_time,
)

pytestmark = pytest.mark.ch10

TARGET, DRAFT, GPU = "llama-3-8b", "llama-3.2-1b", "H100-SXM"


def test_formula_values() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0  # every proposal rejected: plain decode
    assert expected_tokens_per_step(1.0, 4) == 5.0  # every proposal accepted, plus the bonus
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)  # 1 + .8 + .64 + ...
    assert expected_tokens_per_step(0.5, 0) == 1.0


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8, 0.95])
def test_formula_grows_with_k_and_alpha_within_its_bounds(alpha: float) -> None:
    values = [expected_tokens_per_step(alpha, k) for k in range(0, 12)]
    assert values == sorted(values) and len(set(values)) == len(values)
    for k, e in enumerate(values):
        assert 1 <= e < min(k + 1, 1 / (1 - alpha)) or k == 0
        assert expected_tokens_per_step(alpha + 0.04, k) >= e
    assert values[-1] == pytest.approx(1 / (1 - alpha), rel=0.55)  # approaches the limit


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"alpha must be a probability in \[0, 1\], got 1.5"):
        expected_tokens_per_step(1.5, 4)
    with pytest.raises(ValueError, match="k .* must be an integer >= 1, got 0"):
        speculative_step_time(TARGET, GPU, 1, 256, 0)
    with pytest.raises(ValueError, match="batch and context_len must be positive"):
        speculative_speedup(TARGET, GPU, 0, 256, 4, 0.8)


def test_verify_step_counts_k_plus_one_tokens_and_reads_weights_once() -> None:
    spec = speculative_step_time(TARGET, GPU, 8, 256, 4)
    plain = roofline.decode_step_time(TARGET, GPU, 8, 256)
    assert spec.draft_time == 0.0  # prompt lookup: no draft model
    assert spec.verify.flops == pytest.approx(5 * plain.flops, rel=0.01)  # logits rows too
    assert spec.verify.bytes == pytest.approx(plain.bytes, rel=0.01)
    # By hand: the logits of the 4 proposals of each of 8 requests, 2 * vocab * hidden FLOPs a
    # row (128,256 x 4,096 for Llama-3-8B), on top of the k + 1-token forward's own FLOPs.
    forward = roofline.step_time(TARGET, GPU, [(5, 260)] * 8)
    assert spec.verify.flops - forward.flops == 2 * 128_256 * 4_096 * 4 * 8
    # 8 x 5 tokens x ~16 GFLOP is ~0.6 ms at 989 TFLOP/s, under the ~4.5 ms the weights' read
    # takes at 3.35 TB/s: still memory-bound, so the step costs its bytes over the bandwidth.
    assert spec.verify.bound == "memory"
    assert spec.time == pytest.approx(spec.verify.bytes / 3.35e12)
    assert 4.5e-3 < spec.time < 4.6e-3  # 15.0 GB of weights, 0.2 GB of K/V for 8 x 260 tokens


def test_prompt_lookup_at_batch_1_on_h100_more_than_doubles_tokens_per_second() -> None:
    speedup = speculative_speedup(TARGET, GPU, 1, 256, 4, 0.8)
    assert speedup > 2
    assert speedup == pytest.approx(expected_tokens_per_step(0.8, 4), rel=0.01)


def test_the_win_shrinks_with_batch_and_turns_into_a_loss() -> None:
    batches = [1, 16, 64, 128, 256, 352, 353, 512, 1024]
    speedups = [speculative_speedup(TARGET, GPU, b, 256, 4, 0.8) for b in batches]
    assert speedups == sorted(speedups, reverse=True)
    assert speedups[batches.index(352)] > 1 > speedups[batches.index(353)]  # the crossing
    # The verify step went compute-bound; plain decode at that batch is still memory-bound.
    assert speculative_step_time(TARGET, GPU, 353, 256, 4).verify.bound == "compute"
    assert roofline.decode_step_time(TARGET, GPU, 353, 256).bound == "memory"


def test_a_draft_model_costs_time() -> None:
    lookup = speculative_step_time(TARGET, GPU, 1, 256, 4)
    drafted = speculative_step_time(TARGET, GPU, 1, 256, 4, draft=DRAFT)
    one_draft_step = roofline.decode_step_time(DRAFT, GPU, 1, 256).time
    assert drafted.verify == lookup.verify
    assert drafted.draft_time == pytest.approx(4 * one_draft_step, rel=0.01)
    assert 1 < speculative_speedup(TARGET, GPU, 1, 256, 4, 0.8, DRAFT) < \
        speculative_speedup(TARGET, GPU, 1, 256, 4, 0.8)


def test_best_k_is_the_argmax_and_grows_with_the_acceptance_rate() -> None:
    k, speedup = best_num_speculative_tokens(TARGET, GPU, 1, 256, 0.8, draft=DRAFT)
    every = {j: speculative_speedup(TARGET, GPU, 1, 256, j, 0.8, DRAFT) for j in range(1, 17)}
    assert speedup == max(every.values()) == every[k]
    # Each more proposal adds alpha^k tokens at the price of one more draft forward: the more
    # of them are accepted, the longer the best proposal.
    ks = [best_num_speculative_tokens(TARGET, GPU, 1, 256, a, draft=DRAFT)[0]
          for a in (0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks) and ks[0] < ks[-1]
    # Prompt lookup proposes for free, and at batch 1 verifying more costs ~nothing: it wants
    # a longer proposal than a draft model that charges a forward per token.
    assert best_num_speculative_tokens(TARGET, GPU, 1, 256, 0.8)[0] > k
    k_big_batch, _ = best_num_speculative_tokens(TARGET, GPU, 256, 256, 0.8, draft=DRAFT)
    assert k_big_batch < k
    assert best_num_speculative_tokens(TARGET, GPU, 1024, 256, 0.3, draft=DRAFT) == (0, 1.0)


def test_each_draft_forward_is_a_step_of_its_own_with_its_fixed_cost() -> None:
    # The draft's k forwards: each reads the draft's weights and its own K/V (which grows by a
    # token a forward) and pays draft_overhead, a fixed cost the roofline does not see.
    free = speculative_step_time(TARGET, GPU, 4, 512, 4, draft=DRAFT)
    dear = speculative_step_time(TARGET, GPU, 4, 512, 4, draft=DRAFT, draft_overhead=0.5e-3)
    assert len(dear.draft_steps) == 4
    for i, step in enumerate(dear.draft_steps):
        alone = roofline.decode_step_time(DRAFT, GPU, 4, 512 + i, overhead=0.5e-3)
        assert step == alone
        assert step.bytes > roofline.decode_step_time(DRAFT, GPU, 4, 1).bytes  # its K/V too
    assert dear.draft_time == pytest.approx(free.draft_time + 4 * 0.5e-3)
    assert dear.verify == free.verify  # the target's forward is not the draft's cost
    assert speculative_step_time(TARGET, GPU, 4, 512, 4, draft_overhead=1.0).draft_time == 0.0
    # At batch 1 a 1B draft's roofline forward is ~0.75 ms; half a millisecond more a forward
    # (4 of them) takes the modelled speedup from ~2.0x to ~1.6x.
    assert speculative_speedup(TARGET, GPU, 1, 512, 4, 0.8, DRAFT) > 1.9
    assert speculative_speedup(TARGET, GPU, 1, 512, 4, 0.8, DRAFT, draft_overhead=0.5e-3) < 1.7
    with pytest.raises(ValueError, match="draft_overhead must be >= 0 seconds a forward"):
        speculative_step_time(TARGET, GPU, 1, 512, 4, draft=DRAFT, draft_overhead=-1.0)


def test_a_batch_that_does_not_fit_is_refused_with_the_numbers() -> None:
    # Exercise 10.3's old ask: batch 512 at 1k context on an 80 GB H100. The target alone needs
    # 16.1 GB of weights + 69 GB of K/V; with a 1B draft, 18.5 + 86 GB.
    with pytest.raises(ValueError, match=r"batch 512 at 1,028 tokens .* H100-SXM: target and "
                       r"draft weights 18.5 GB \+ K/V 86.2 GB = 104.8 GB > 80 GB"):
        speculative_speedup(TARGET, GPU, 512, 1024, 4, 0.8, DRAFT)
    with pytest.raises(ValueError, match=r"target weights 16.1 GB \+ K/V 69"):
        speculative_speedup(TARGET, GPU, 512, 1024, 4, 0.8)
    with pytest.raises(ValueError, match="does not fit"):
        best_num_speculative_tokens(TARGET, GPU, 512, 1024, 0.8)
    check_fits(TARGET, GPU, 256, 1028, DRAFT)  # half that batch fits, draft and all
    # The draft's K/V counts: a batch the target alone fits can fail with the draft.
    check_fits(TARGET, GPU, 440, 1028)
    with pytest.raises(ValueError, match="target and draft"):
        check_fits(TARGET, GPU, 440, 1028, DRAFT)
    # fp8 K/V halve the cache: the old ask fits then.
    assert speculative_speedup(TARGET, GPU, 512, 1024, 4, 0.8, kv_dtype_bytes=1) > 0
    # best_num_speculative_tokens skips a k whose lookahead no longer fits, and keeps the rest:
    # batch 471 at 1,024 tokens fits a lookahead of up to 11 tokens a sequence.
    check_fits(TARGET, GPU, 471, 1024 + 11)
    with pytest.raises(ValueError):
        check_fits(TARGET, GPU, 471, 1024 + 12)
    every = {j: speculative_speedup(TARGET, GPU, 471, 1024, j, 0.99) for j in range(1, 12)}
    best = max(every, key=every.get)
    assert best_num_speculative_tokens(TARGET, GPU, 471, 1024, 0.99) == (best, every[best])
