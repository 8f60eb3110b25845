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
    sample_pairs,
    shift_mass,
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
