"""Chapter 02's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


@pytest.mark.ch02
@pytest.mark.parametrize("wrong, hint", [
    (lambda t, g: t / g, "units"),
    (lambda t, g: g * 1e9 / (t * 1e12), "inverted"),
    (lambda t, g: g / t, "inverted"),
    (lambda t, g: t * 1e12 * g * 1e9, "don't multiply"),
    (lambda t, g: 2 * t * 1e12 / (g * 1e9), "double or halve"),
])
def test_datasheet_ridge_wrong_answers_are_named(wrong, hint: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert check("02.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch02
@pytest.mark.parametrize("wrong, hint", [
    (lambda f, b, p, w: f / p + b / w, "don't add"),
    (lambda f, b, p, w: min(f / p, b / w), "not the min"),
    (lambda f, b, p, w: max(p / f, w / b), "work / rate"),
    (lambda f, b, p, w: f / p, "only the FLOPs"),
    (lambda f, b, p, w: b / w, "only the bytes"),
])
def test_roofline_time_wrong_answers_are_named(wrong, hint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check("02.2", wrong) is False
    assert hint in capsys.readouterr().out
