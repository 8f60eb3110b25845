"""Perplexity through the engine (minillm.quality): the shipped model's card figure reproduced
on its held-out play, and what weight-only int8 costs in it."""

from __future__ import annotations

import re

import pytest

from minillm import LLM, SamplingParams, default_model_path
from minillm.quality import held_out_text, perplexity

pytestmark = pytest.mark.ch10


@pytest.fixture(scope="module")
def fp32() -> LLM:
    return LLM()


def card_val_loss() -> float:
    card = (default_model_path() / "README.md").read_text()
    return float(re.search(r"final loss.*?val (\d+\.\d+)", card, re.S).group(1))


def test_the_engine_reproduces_the_model_cards_validation_loss(fp32: LLM) -> None:
    result = perplexity(fp32)
    assert held_out_text().startswith("THE TEMPEST")
    assert result.num_tokens == 137 * 256  # the card's 35,222-token stream in 256-token windows
    assert abs(result.loss - card_val_loss()) < 0.005, (result.loss, card_val_loss())
    assert result.perplexity == pytest.approx(2.718281828 ** result.loss)


def test_int8_weights_cost_almost_nothing_in_perplexity(fp32: LLM) -> None:
    base = perplexity(fp32).loss
    int8 = perplexity(LLM(quantization="int8")).loss
    assert abs(int8 - base) < 0.02, (base, int8)  # measured: 4.1635 against 4.1637 nats


def test_measuring_leaves_requests_in_flight_alone(fp32: LLM) -> None:
    prompt, params = "ROMEO:", SamplingParams(max_tokens=12, temperature=0)
    alone = fp32.generate(prompt, params, use_tqdm=False)[0].token_ids
    engine = fp32.engine
    engine.add_request(prompt, params, request_id="in-flight")
    engine.step()
    perplexity(fp32, held_out_text()[:5000], window=64)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.request_id == "in-flight" and o.finished]
    assert [o.token_ids for o in finished] == [alone]


def test_bad_windows_and_short_texts_are_refused(fp32: LLM) -> None:
    with pytest.raises(ValueError, match="window must be an int in \\[2, max_model_len=2048\\)"):
        perplexity(fp32, window=4096)
    with pytest.raises(ValueError, match="fewer than one window of 256"):
        perplexity(fp32, "To be, or not to be.")
