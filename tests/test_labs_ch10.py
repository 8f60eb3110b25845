"""Chapter 10's graded exercises accept the reference solutions and name the common wrong ones.

Each wrong answer is a mistake a reader could plausibly make: the grader must fail it and say
what to look at."""

from __future__ import annotations

import pytest
import torch

from minillm.labs import check
from minillm.labs.solutions.ch10 import MODEL_ANSWERS, SOLUTIONS, quantize

pytestmark = pytest.mark.ch10


def test_reference_acceptance_rule_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("10.1", SOLUTIONS["10.1"]) is True
    assert "never the distribution" in capsys.readouterr().out


def test_reference_quantizer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("10.2", SOLUTIONS["10.2"]) is True
    assert "half a step" in capsys.readouterr().out


def accept_all(p, q, proposals, generator):
    """Trusts the proposer: the draft's distribution leaks into the output."""
    return list(proposals) + [int(torch.multinomial(p[len(proposals)], 1, generator=generator))]


def resample_from_p(p, q, proposals, generator):
    """The right acceptance test, but the replacement drawn from p, not the residual."""
    out = []
    for i, d in enumerate(proposals):
        if float(torch.rand((), generator=generator)) * q[i, d] < p[i, d]:
            out.append(d)
            continue
        return out + [int(torch.multinomial(p[i], 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(proposals)], 1, generator=generator))]


def never_accept(p, q, proposals, generator):
    """Lossless but useless: always rejects, always draws from p."""
    return [int(torch.multinomial(p[0], 1, generator=generator))]


def argmax_match(p, q, proposals, generator):
    """Greedy's rule used for sampling: accept while the proposal is p's argmax."""
    out = []
    for i, d in enumerate(proposals):
        if d != int(p[i].argmax()):
            return out + [int(torch.multinomial(p[i], 1, generator=generator))]
        out.append(d)
    return out + [int(torch.multinomial(p[len(proposals)], 1, generator=generator))]


def keeps_going(p, q, proposals, generator):
    """Replaces a rejected proposal and checks the next one (the accepted run must stop)."""
    out = []
    for i, d in enumerate(proposals):
        if float(torch.rand((), generator=generator)) * q[i, d] < p[i, d]:
            out.append(d)
        else:
            residual = (p[i] - q[i]).clamp(min=0)
            out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
    return out + [int(torch.multinomial(p[len(proposals)], 1, generator=generator))]


@pytest.mark.parametrize("wrong, words", [
    (accept_all, "leaks into the output"),
    (resample_from_p, "residual max(0, p - q)"),
    (never_accept, "accepting less throws speed away"),
    (argmax_match, "the first emitted token follows"),
    (keeps_going, "all but the last emitted token"),
    (lambda p, q, d, g: 3, "return a list of token ids"),
], ids=["accept-all", "resample-from-p", "never-accept", "argmax-match", "keeps-going",
        "not-a-list"])
def test_wrong_acceptance_rules_fail_with_their_hint(wrong, words: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert check("10.1", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  10.1") and words in out and "Traceback" not in out


def per_tensor(weight):
    w = weight.float()
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale.expand(w.shape[0])


def truncating(weight):
    q, scale = quantize(weight)
    return torch.trunc(weight.float() / scale[:, None]).to(torch.int8), scale


def zero_row_nan(weight):
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).nan_to_num().to(torch.int8), scale


def float_q(weight):
    q, scale = quantize(weight)
    return q.float(), scale


@pytest.mark.parametrize("wrong, words", [
    (per_tensor, "give each row its own scale"),
    (truncating, "do not truncate"),
    (zero_row_nan, "every scale must be positive"),
    (float_q, "must be an int8 tensor"),
    (lambda w: quantize(w)[0], "return a pair"),
], ids=["per-tensor", "truncating", "zero-row", "float-q", "no-scale"])
def test_wrong_quantizers_fail_with_their_hint(wrong, words: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check("10.2", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  10.2") and words in out and "Traceback" not in out


def test_a_scale_of_shape_n_by_1_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("10.2", lambda w: (quantize(w)[0], quantize(w)[1][:, None])) is True


def test_the_open_ended_exercises_have_model_answers_with_figures() -> None:
    assert sorted(MODEL_ANSWERS) == ["10.3", "10.4"]
    for answer in MODEL_ANSWERS.values():
        assert answer.startswith("**Model answer.**") and any(c.isdigit() for c in answer)


def bonus_sharpened(p, q, proposals, generator):
    """Right at every proposal, but the bonus drawn from p[k] squared (a temperature applied
    twice): the same as the rule whenever p is one-hot (greedy), wrong only for the bonus."""
    out = SOLUTIONS["10.1"](p, q, proposals, generator)
    if len(out) == len(proposals) + 1:
        sharp = p[len(proposals)] ** 2
        out[-1] = int(torch.multinomial(sharp / sharp.sum(), 1, generator=generator))
    return out


def forgets_q_after_the_first(p, q, proposals, generator):
    """The rule at the first proposal; later ones accepted with probability p(d), q forgotten:
    the same as the rule when q is one-hot (greedy, prompt lookup), wrong for a draft's q."""
    out = []
    for i, d in enumerate(proposals):
        u = float(torch.rand((), generator=generator))
        if (u * q[i, d] < p[i, d]) if i == 0 else (u < p[i, d]):
            out.append(d)
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(proposals)], 1, generator=generator))]


@pytest.mark.parametrize("wrong, words", [
    (bonus_sharpened, "position 2 (the bonus"),
    (forgets_q_after_the_first, "position 1"),
], ids=["bonus-sharpened", "forgets-q-after-the-first"])
def test_rules_wrong_after_the_first_token_are_caught(wrong, words: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Both pass the greedy cases and a grader that proposes one token and counts only the first
    # emitted one (the grader before issue 28).
    assert check("10.1", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  10.1") and words in out and "Traceback" not in out


def test_the_10_3_model_answer_is_what_the_cost_model_says() -> None:
    from minillm.spec.cost import best_num_speculative_tokens, check_fits, speculative_speedup

    target, gpu, draft = "llama-3-8b", "H100-SXM", "llama-3.2-1b"
    with pytest.raises(ValueError, match="does not fit"):
        speculative_speedup(target, gpu, 512, 1024, 4, 0.8, draft)
    best = {(b, d): best_num_speculative_tokens(target, gpu, b, 1024, 0.8, draft=d)
            for b in (1, 32, 128, 256) for d in (draft, None)}
    assert [best[b, draft][0] for b in (1, 32, 128, 256)] == [4, 4, 3, 2]
    assert [best[b, None][0] for b in (1, 32, 128, 256)] == [16, 10, 4, 3]
    assert round(best[1, None][1], 1) == 4.9 and round(best[256, draft][1], 1) == 1.7

    def largest_fitting(d: str | None) -> int:
        b = 1
        while True:
            try:
                check_fits(target, gpu, b + 1, 1024 + 4, d)
            except ValueError:
                return b
            b += 1

    assert (largest_fitting(None), largest_fitting(draft)) == (474, 364)
    below = next(b for b in range(1, 365) if speculative_speedup(target, gpu, b, 1024, 4, 0.6,
                                                                 draft) < 1)
    assert below == 281
    assert speculative_speedup(target, gpu, 474, 1024, 4, 0.8) == pytest.approx(2.12, abs=0.01)
    text = MODEL_ANSWERS["10.3"]
    assert all(s in text for s in ("batch 281", "474 sequences", "364 with the draft"))
