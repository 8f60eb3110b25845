"""Chapter 00's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


@pytest.mark.ch00
@pytest.mark.parametrize("wrong, hint", [
    (lambda m: (m.token_times[-1] - m.token_times[0]) / len(m.token_times), "n - 1"),
    (lambda m: m.e2e / len(m.token_times), "E2E"),
    (lambda m: (m.token_times[-1] - m.token_times[0]) / max(len(m.token_times) - 1, 1),
     "return None"),
])
def test_tpot_wrong_answers_are_named(wrong, hint: str, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert check("00.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch00
def test_blocks_needed_rounding_down_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("00.2", lambda n, p: n // p) is False
    assert "round up" in capsys.readouterr().out
