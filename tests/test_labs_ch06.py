"""Chapter 06's graded exercises name the common wrong answers."""

from __future__ import annotations

import math

import pytest

from minillm.labs import check
from minillm.labs.ch06 import CHUNK_CASES, scheduler_chunks
from minillm.labs.solutions.ch06 import chunk_schedule


def ignores_decodes(p: int, b: int, d: int) -> list[int]:
    return chunk_schedule(p, b, 0)


def decodes_only_in_first_step(p: int, b: int, d: int) -> list[int]:
    first = min(p, b - d)
    return [first] + chunk_schedule(p - first, b, 0)


def full_last_chunk(p: int, b: int, d: int) -> list[int]:
    return [b - d] * math.ceil(p / (b - d))


@pytest.mark.ch06
@pytest.mark.parametrize("prompt_len, budget, num_decodes", CHUNK_CASES)
def test_scheduler_chunks_match_the_formula(prompt_len: int, budget: int,
                                            num_decodes: int) -> None:
    """The grader's reference (the real scheduler, simulated) is budget - decodes per step."""
    assert scheduler_chunks(prompt_len, budget, num_decodes) == chunk_schedule(
        prompt_len, budget, num_decodes)


@pytest.mark.ch06
@pytest.mark.parametrize("wrong, hint", [
    (ignores_decodes, "each running decode takes one token"),
    (decodes_only_in_first_step, "in every step"),
    (full_last_chunk, "the last chunk is only what is left"),
    (lambda p, b, d: math.ceil(p / (b - d)), "number of steps"),
])
def test_chunk_schedule_wrong_answers_are_named(wrong, hint: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert check("06.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch06
@pytest.mark.parametrize("wrong, hint", [
    (lambda p, b, d, t: sum(t(c) for c in chunk_schedule(p, b, d)), "decode tokens"),
    (lambda p, b, d, t: t(p + d), "one step per chunk"),
    (lambda p, b, d, t: len(chunk_schedule(p, b, d)) * t(b), "the last chunk is smaller"),
])
def test_prefill_ttft_wrong_answers_are_named(wrong, hint: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert check("06.2", wrong) is False
    assert hint in capsys.readouterr().out
