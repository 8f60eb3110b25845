"""Chapter 03's graded exercises name the common wrong answers."""

from __future__ import annotations

import math

import pytest

from minillm.labs import check


def kv(c, s, b, d, heads=None, head_dim=None, two=2, layers=None):  # noqa: ANN001, ANN202
    """The KV formula with one ingredient swapped, to build the common wrong answers."""
    heads = c.num_key_value_heads if heads is None else heads
    head_dim = c.head_dim if head_dim is None else head_dim
    layers = c.num_hidden_layers if layers is None else layers
    return two * layers * heads * head_dim * s * b * d


@pytest.mark.ch03
@pytest.mark.parametrize("wrong, hint", [
    (lambda c, s, b, d: kv(c, s, b, d, two=1), "K and V are both cached"),
    (lambda c, s, b, d: kv(c, s, b, d, heads=c.num_attention_heads), "not the query heads"),
    (lambda c, s, b, d: kv(c, s, b, d) * 8, "counts bits"),
    (lambda c, s, b, d: kv(c, s, b, d) / 8, "do not divide it by 8"),
    (lambda c, s, b, d: kv(c, s, 1, d), "multiply by batch"),
    (lambda c, s, b, d: kv(c, s, b, d, layers=1), "number of layers"),
    (lambda c, s, b, d: kv(c, 1, 1, d), "bytes of one token"),
    (lambda c, s, b, d: kv(c, s, b, d, head_dim=c.hidden_size // c.num_attention_heads),
     "config.head_dim"),
])
def test_kv_bytes_wrong_answers_are_named(wrong, hint: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert check("03.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch03
@pytest.mark.parametrize("wrong, hint", [
    (lambda m, w, k: round((m - w) / k), "round down"),
    (lambda m, w, k: (m - w) / k, "floor the quotient"),
    (lambda m, w, k: max(m // k, 0), "memory - weights"),
    (lambda m, w, k: math.floor((m - w) / k), "return 0"),
])
def test_max_sequences_wrong_answers_are_named(wrong, hint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check("03.2", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch03
def test_max_sequences_is_checked_against_the_engine(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """An answer that passes every formula case but predicts one sequence too many for the
    engine's own pool (it ignores that the pool has no weights in it) fails on the engine."""
    def off_by_one_on_empty_pools(m: float, w: float, k: float) -> int:
        return max(math.floor((m - w) / k), 0) + (w == 0 and m < 1e9)

    assert check("03.2", off_by_one_on_empty_pools) is False
    assert "minillm ran 5 sequences at once" in capsys.readouterr().out
