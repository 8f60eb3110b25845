"""minillm.spec.lossless: the chapter's sampling check passes for the engine's rule, has the power
to see a 5% shift, and fails a rule that accepts every proposal."""

from __future__ import annotations

import pytest
import torch

from minillm.spec import lossless
from minillm.spec.lossless import (
    VOCAB,
    chi_square,
    exact_pairs,
    exact_position_pairs,
    exact_sequences,
    position_pairs,
    proposes_nothing,
    sample_pairs,
    sample_sequences,
    shift_mass,
    shift_power,
    tiny_engine,
)

pytestmark = pytest.mark.ch10
NUM_SAMPLES = 2000


def test_exact_pairs_is_a_distribution_far_from_uniform() -> None:
    exact = exact_pairs()
    assert exact.shape == (VOCAB, VOCAB)
    assert abs(float(exact.sum()) - 1) < 1e-5
    assert float(exact.max()) > 5 / VOCAB**2, "a near-uniform target would hide a biased rule"


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_samples_pass_and_a_shift_is_seen(method: str) -> None:
    engine = tiny_engine(method)
    counts = sample_pairs(engine, NUM_SAMPLES)
    stats = engine.stats()
    assert counts.sum() == NUM_SAMPLES
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    exact = exact_pairs()
    assert not chi_square(counts, exact).rejects
    assert chi_square(counts, shift_mass(exact)).rejects


def test_a_rule_that_accepts_every_proposal_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from minillm.spec import rejection

    real = rejection.verify

    def accept_all(logits, proposals, draft_probs, params, generators):
        emitted = real(logits, proposals, draft_probs, params, generators)
        return [d + e[len(d):][:1] if d else e for d, e in zip(proposals, emitted)]

    monkeypatch.setattr("minillm.spec.decoder.verify", accept_all)
    counts = sample_pairs(tiny_engine("draft_model"), NUM_SAMPLES)
    assert chi_square(counts, exact_pairs()).rejects


def test_chi_square_on_known_counts() -> None:
    probs = torch.full((10,), 0.1)
    fair = chi_square(torch.full((10,), 100.0), probs)
    assert fair.statistic < 1e-9 and fair.df == 9 and not fair.rejects
    assert 27 < fair.critical < 28.5  # the table's 0.1% value for 9 degrees of freedom: 27.88
    loaded = torch.tensor([200.0] + [88.9] * 9)
    assert chi_square(loaded, probs).rejects


def test_chi_square_pools_rare_cells_and_names_bad_input() -> None:
    probs = torch.tensor([0.5, 0.497, 0.001, 0.001, 0.001])
    assert chi_square(torch.tensor([500.0, 497, 1, 1, 1]), probs).df == 2  # 3 rare cells -> 1
    with pytest.raises(ValueError, match="one shape"):
        chi_square(torch.ones(3), torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="sum to 1"):
        chi_square(torch.ones(2), torch.tensor([0.5, 0.6]))
    with pytest.raises(ValueError, match="method"):
        lossless.tiny_engine("medusa")


# ---- every emitted position (k = 2: tokens 0..3, the first verification's bonus included) ------

LENGTH = 4  # the prefill's token, then the first verification's k = 2 proposals and its bonus


def test_exact_sequences_is_the_joint_and_its_pairs_agree_with_exact_pairs() -> None:
    joint = exact_sequences(LENGTH)
    assert joint.shape == (VOCAB,) * LENGTH
    assert abs(float(joint.sum()) - 1) < 1e-5
    first = exact_position_pairs(joint)[0]
    assert torch.allclose(first, exact_pairs(), atol=1e-4)  # position 1: the old check's pairs


def test_a_wrong_bonus_token_is_seen_at_the_last_position_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A rule right at every proposal whose bonus token (drawn when both proposals passed) is
    # off by one: the pair test at position 1, all the check had before, cannot see it.
    from minillm.spec import rejection

    real = rejection.verify

    def wrong_bonus(logits, proposals, draft_probs, params, generators):
        emitted = real(logits, proposals, draft_probs, params, generators)
        return [e[:-1] + [(e[-1] + 1) % VOCAB] if d and len(e) == len(d) + 1 else e
                for d, e in zip(proposals, emitted)]

    monkeypatch.setattr("minillm.spec.decoder.verify", wrong_bonus)
    pairs = position_pairs(sample_sequences(tiny_engine("draft_model", k=2), NUM_SAMPLES, LENGTH))
    exact = exact_position_pairs(exact_sequences(LENGTH))
    rejects = [chi_square(c, e).rejects for c, e in zip(pairs, exact)]
    assert rejects[0] is False and rejects[-1] is True, rejects


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_every_position_follows_the_target(method: str) -> None:
    sequences = sample_sequences(tiny_engine(method, k=2), NUM_SAMPLES, LENGTH)
    assert sequences.shape == (NUM_SAMPLES, LENGTH)
    exact = exact_position_pairs(exact_sequences(LENGTH))
    assert not any(chi_square(c, e).rejects for c, e in zip(position_pairs(sequences), exact))


def test_the_shift_checks_power_grows_with_the_samples() -> None:
    exact = exact_position_pairs(exact_sequences(LENGTH))
    power = {n: [shift_power(e, n, trials=400) for e in exact] for n in (1000, 3000)}
    assert all(p < 0.9 for p in power[1000])  # 1,000 samples would miss a 5% shift often
    assert all(p >= 0.99 for p in power[3000])  # the chapter's 3,000 see it


def test_prompt_lookup_proposes_nothing_after_most_first_tokens() -> None:
    # PROMPT = 1 2 3 1 2 3 1 2: a match exists only after a first token of 1, 2 or 3.
    assert proposes_nothing(torch.tensor([1, 2, 3])) == 0.0
    assert proposes_nothing(torch.tensor([0, 4, 5, 6, 7, 1])) == pytest.approx(5 / 6)
    first = sample_sequences(tiny_engine(None), 500, 2)[:, 0]
    assert proposes_nothing(first) > 0.5  # the tiny target mostly starts outside {1, 2, 3}
    with pytest.raises(ValueError, match="length must be an int >= 2"):
        sample_sequences(tiny_engine(None), 1, 1)
