"""Chapter 12's graded exercises accept the reference solutions and name the common wrong ones.

12.1's wrong answers are the slips of an online-softmax update (no rescale of the running sum or
of acc, exp without the max subtracted, the max taken after the exponent, a normalised acc, NaN
for a row that a tile masks whole); 12.2's are those of a split-KV merge (a plain average, exp of
the lses without their max, no merged lse, summed lses)."""

from __future__ import annotations

import pytest
import torch

from minillm.attention import online_softmax
from minillm.labs import check
from minillm.labs.solutions.ch12 import MODEL_ANSWERS, SOLUTIONS, merge_splits

pytestmark = pytest.mark.ch12


@pytest.mark.parametrize("exercise_id, solution", [
    ("12.1", SOLUTIONS["12.1"]), ("12.1", online_softmax.online_softmax_update),
    ("12.2", SOLUTIONS["12.2"]), ("12.2", online_softmax.merge_splits),
], ids=["12.1-solution", "12.1-engine", "12.2-solution", "12.2-engine"])
def test_reference_solutions_pass(exercise_id: str, solution,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert check(exercise_id, solution) is True
    assert capsys.readouterr().out.startswith(f"PASS  {exercise_id}")


# ---- 12.1: wrong updates, each the slip its name says -----------------------------------------

def no_rescale(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    return m_new, l + p.sum(-1), acc + p @ v


def no_rescale_of_acc(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    return m_new, torch.exp(m - m_new) * l + p.sum(-1), acc + p @ v


def exp_without_max(m, l, acc, scores, v):
    """Keeps m as the max but never subtracts it: right outputs on small scores, wrong lse."""
    p = torch.exp(scores)
    return torch.maximum(m, scores.amax(-1)), l + p.sum(-1), acc + p @ v


def max_after_exp(m, l, acc, scores, v):
    """The max of the exponentials, not of the scores."""
    p = torch.exp(scores)
    return torch.maximum(m, p.amax(-1)), l + p.sum(-1), acc + p @ v


def m_unused(m, l, acc, scores, v):
    """Right on small scores (m = 0 makes m + log(l) the true lse), overflows on large ones."""
    p = torch.exp(scores)
    return torch.zeros_like(m), l + p.sum(-1), acc + p @ v


def normalised_acc(m, l, acc, scores, v):
    """acc kept as the running output (acc / l) rather than the running sum."""
    m, l_new, total = online_softmax.online_softmax_update(m, l, acc * l[..., None], scores, v)
    return m, l_new, total / l_new[..., None]


def nan_when_masked(m, l, acc, scores, v):
    """The textbook update without the guard: exp(-inf - (-inf)) for a row that saw nothing."""
    m_new = torch.maximum(m, scores.amax(-1))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new[..., None])
    return m_new, rescale * l + p.sum(-1), rescale[..., None] * acc + p @ v


def old_max_subtracted(m, l, acc, scores, v):
    """Subtracts the max it came in with: -inf on the first tile."""
    m_new = torch.maximum(m, scores.amax(-1))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m[..., None])
    return m_new, rescale * l + p.sum(-1), rescale[..., None] * acc + p @ v


def scaled_again(m, l, acc, scores, v):
    return online_softmax.online_softmax_update(m, l, acc, scores / v.shape[-1] ** 0.5, v)


def l_keeps_its_keys(m, l, acc, scores, v):
    m_new, l_new, acc_new = online_softmax.online_softmax_update(m, l, acc, scores, v)
    return m_new, l_new[..., None], acc_new


def in_float32(m, l, acc, scores, v):
    return tuple(x.float() for x in online_softmax.online_softmax_update(m, l, acc, scores, v))


@pytest.mark.parametrize("wrong, words", [
    (no_rescale, "what l and acc summed so far was under the old max"),
    (no_rescale_of_acc, "what acc summed so far was under the old max"),
    (exp_without_max, "your l sums exp(scores), not exp(scores - m_new)"),
    (max_after_exp, "taken before any exponent"),
    (m_unused, "scores near 100, the output holds NaN or inf"),
    (normalised_acc, "return acc unnormalised"),
    (old_max_subtracted, "never the old m = -inf"),
    (scaled_again, "already scaled by 1/sqrt(D)"),
    (nan_when_masked, "subtract 0 instead of m_new while it is -inf"),
    (l_keeps_its_keys, "reduce a tile over its keys"),
    (in_float32, "return the state in the dtype it came in"),
    (lambda m, l, acc, scores, v: acc, "return the tuple (m, l, acc)"),
], ids=["no-rescale", "no-rescale-of-acc", "exp-without-max", "max-after-exp", "m-unused",
        "normalised-acc", "old-max", "scaled-again",
        "nan-when-masked", "wrong-shape", "wrong-dtype", "one-tensor"])
def test_wrong_updates_fail_with_their_hint(wrong, words: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert check("12.1", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  12.1") and words in out and "Traceback" not in out, out


def test_a_missing_rescale_passes_while_the_max_never_changes() -> None:
    """The point of the cases: one key tile hides the slip that several show."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 8, dtype=torch.float64, generator=g) for n in (1, 20, 20))
    k[:, -1] = 3 * q[:, 0]  # the top score in the last key tile: the max rises there, whatever
    want = online_softmax.naive_attention(q, k, v)  # the draw (unseeded, it sometimes did not)
    one_tile = online_softmax.tiled_attention(q, k, v, block_n=32, update=no_rescale)
    many = online_softmax.tiled_attention(q, k, v, block_n=4, update=no_rescale)
    assert torch.allclose(one_tile, want) and not torch.allclose(many, want)


def test_exp_without_max_overflows_only_on_large_scores() -> None:
    scores = torch.randn(2, 3, 4)
    state = (torch.full((2, 3), float("-inf")), torch.zeros(2, 3), torch.zeros(2, 3, 5))
    v = torch.randn(2, 4, 5)
    _, l, acc = exp_without_max(*state, scores, v)
    assert torch.isfinite(acc / l[..., None]).all()
    _, l, acc = exp_without_max(*state, scores + 100, v)
    assert not torch.isfinite(acc / l[..., None]).all()


# ---- 12.2: wrong merges -----------------------------------------------------------------------

def plain_average(outs, lses):
    return outs.mean(dim=0), torch.logsumexp(lses, dim=0)


def exp_of_lse(outs, lses):
    """exp(lse) as the weights, no max subtracted: right in float64 at small scores."""
    mass = torch.exp(lses)
    total = mass.sum(dim=0)
    return (mass[..., None] * outs).sum(dim=0) / total[..., None], torch.log(total)


def summed_lse(outs, lses):
    return merge_splits(outs, lses)[0], lses.sum(dim=0)


def largest_lse(outs, lses):
    return merge_splits(outs, lses)[0], lses.amax(dim=0)


@pytest.mark.parametrize("wrong, words", [
    (plain_average, "a plain average"),
    (exp_of_lse, "fp32 scores near 100 in 5 splits: the merged output holds NaN or inf"),
    (lambda outs, lses: merge_splits(outs, lses)[0], "return the tuple (out, lse)"),
    (summed_lse, "not the sum of their lses"),
    (largest_lse, "the merged lse is torch.logsumexp(lses, dim=0)"),
    (lambda outs, lses: (outs.sum(dim=0), lses), "merge over dim 0"),
], ids=["plain-average", "exp-of-lse", "no-lse", "summed-lse", "largest-lse", "wrong-shape"])
def test_wrong_merges_fail_with_their_hint(wrong, words: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert check("12.2", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  12.2") and words in out and "Traceback" not in out, out


def test_exp_of_lse_is_right_where_nothing_overflows() -> None:
    """So only the fp32 case near 100 can catch it, as the grader's message says."""
    outs, lses = torch.randn(3, 2, 1, 8, dtype=torch.float64), torch.randn(3, 2, 1,
                                                                           dtype=torch.float64)
    for got, want in zip(exp_of_lse(outs, lses), merge_splits(outs, lses)):
        assert torch.allclose(got, want)


def test_open_ended_exercise_has_a_model_answer() -> None:
    assert sorted(MODEL_ANSWERS) == ["12.3"]
    text = MODEL_ANSWERS["12.3"]
    assert text.startswith("**Model answer.**") and "Rubric" in text
    for figure in ("64 x 64 with 4 warps", "64 x 16 with 8 warps", "339", "161", "656 bytes",
                   "744 bytes", "measured", "modelled"):
        assert figure in text, figure


def test_the_model_answer_quotes_io_cost_and_tiles_as_they_are() -> None:
    """Its table and SRAM figures are io_cost's at S = 32,768, 32 heads; its tiles are TILES'."""
    from minillm.attention import io_cost
    from minillm.attention.tiles import TILES
    from minillm.calc.hardware import get_hardware

    text = MODEL_ANSWERS["12.3"]
    for gpu in ("A100-40GB", "A100-80GB", "H100-SXM"):
        hw = get_hardware(gpu)
        cells = []
        for D in (64, 128):
            rows = io_cost.tile_rows(D, 2, io_cost.sram_bytes_of(gpu))
            tiled = io_cost.attention_cost(32768, D, 32, gpu)[1]
            cells.append(f"{rows}, {tiled.arithmetic_intensity:.0f}: {tiled.bound}")
        sram = io_cost.sram_bytes_of(gpu) // 1024
        assert (f"| {gpu} ({sram} KB) | {hw.flops / hw.bandwidth:.0f} | {cells[0]} | "
                f"{cells[1]} |") in text, gpu

    def smallest_sram_kb(gpu: str, D: int) -> int:
        kb = 1
        while io_cost.attention_cost(32768, D, 32, gpu, sram_bytes=kb * 1024)[1].bound != \
                "compute":
            kb += 1
        return kb

    assert f"{smallest_sram_kb('H100-SXM', 128)} KB on an H100" in text
    assert f"{smallest_sram_kb('A100-40GB', 128)} KB on an A100-40GB" in text
    assert f"({smallest_sram_kb('H100-SXM', 64)} KB on an H100)" in text
    sm90, sm75 = TILES[(9, 0)].extend, TILES[(7, 5)].extend
    assert (sm90.block_m, sm90.block_n, sm90.num_warps) == (64, 64, 4)
    assert (sm75.block_m, sm75.block_n, sm75.num_warps) == (64, 16, 8)
