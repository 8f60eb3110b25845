"""Chapter 01's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


@pytest.mark.ch01
@pytest.mark.parametrize("wrong, hint", [
    (lambda n, b, d: b / d, "2 FLOPs"),
    (lambda n, b, d: 2 * b, "bytes moved"),
    (lambda n, b, d: 2 / d, "shared by the whole batch"),
])
def test_decode_intensity_wrong_answers_are_named(wrong, hint: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert check("01.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch01
def test_estimate_ttft_without_overhead_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("01.2", lambda p, r, o: p / r) is False
    assert "overhead" in capsys.readouterr().out
