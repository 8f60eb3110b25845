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


def _linear_scan(tpot_at, target, max_batch):
    for b in range(1, max_batch + 1):
        if tpot_at(b) > target:
            return b - 1
    return max_batch


def _doubling_only(tpot_at, target, max_batch):
    if tpot_at(1) > target:
        return 0
    b = 1
    while 2 * b <= max_batch and tpot_at(2 * b) <= target:
        b *= 2
    return b


def _first_that_breaks(tpot_at, target, max_batch):
    lo, hi = 1, max_batch
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if tpot_at(mid) <= target else (lo, mid)
    return lo


def _never_zero(tpot_at, target, max_batch):
    from minillm.labs.solutions.ch01 import max_batch_for_tpot
    return max(1, max_batch_for_tpot(tpot_at, target, max_batch))


@pytest.mark.ch01
@pytest.mark.parametrize("wrong, hint", [
    (_linear_scan, "whole serving run"),
    (_doubling_only, "bisect"),
    (_first_that_breaks, "back off one step"),
    (_never_zero, "return 0"),
])
def test_max_batch_for_tpot_wrong_answers_are_named(wrong, hint: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert check("01.3", wrong) is False
    assert hint in capsys.readouterr().out
