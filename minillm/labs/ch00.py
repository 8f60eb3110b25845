"""Graded exercises of chapter 00 (a tour of minillm)."""

from __future__ import annotations

from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable
from minillm.metrics import RequestMetrics


def metrics_with(token_times: list[float], arrival: float = 0.0) -> RequestMetrics:
    """A finished request's timestamps (seconds) as the engine records them."""
    return RequestMetrics(arrival_time=arrival, first_scheduled_time=arrival,
                          first_token_time=token_times[0] if token_times else None,
                          finished_time=token_times[-1] if token_times else None,
                          token_times=list(token_times))


def grade_tpot(tpot: Any) -> str:
    expect_callable(tpot, "tpot(metrics) -> float | None")
    m = metrics_with([0.50, 0.60, 0.75, 0.85, 1.10], arrival=0.20)  # TTFT 0.3 s, E2E 0.9 s
    got = tpot(m)
    assert got is not None, "tpot returned None for a request with 5 output tokens"
    assert isinstance(got, (int, float)), f"tpot should return seconds (a float), got {got!r}"
    n, want = 5, (1.10 - 0.50) / 4
    assert not close(got, (1.10 - 0.20) / n), (
        "you divided E2E by n: TPOT leaves out the first token, which TTFT already counts")
    assert not close(got, (1.10 - 0.50) / n), (
        "you divided by n: n tokens have n - 1 gaps between them, so divide by n - 1")
    assert close(got, want), (
        f"for token_times {m.token_times} (arrival {m.arrival_time}) TPOT is "
        f"{want:.4f} s, you returned {got!r}")
    single = tpot(metrics_with([0.4], arrival=0.1))
    assert single is None, (
        f"with a single output token there is no 'time per output token': return None, "
        f"not {single!r}")
    return f"TPOT = (E2E - TTFT) / (n - 1) = {want * 1000:.1f} ms for that request"


def grade_blocks_needed(blocks_needed: Any) -> str:
    expect_callable(blocks_needed, "blocks_needed(num_tokens, block_size) -> int")
    cases = [(1, 16, 1), (16, 16, 1), (17, 16, 2), (100, 16, 7), (5, 1, 5), (0, 16, 0)]
    for num_tokens, block_size, want in cases:
        got = blocks_needed(num_tokens, block_size)
        assert got is not None, "blocks_needed returned None"
        assert got == want, (
            f"{num_tokens} tokens in blocks of {block_size} need {want} blocks, you returned "
            f"{got!r}" + (" (round up: a partly filled block is still a whole block)"
                          if got == num_tokens // block_size else ""))
    return "a sequence holds ceil(tokens / block_size) blocks; only its last one is partly empty"


EXERCISES = [
    Exercise("00.1", "TPOT from a request's timestamps",
             "Write tpot(metrics) -> seconds per output token after the first, from "
             "metrics.token_times; None with fewer than two tokens.", grade_tpot),
    Exercise("00.2", "KV blocks a sequence needs",
             "Write blocks_needed(num_tokens, block_size) -> the number of KV blocks a "
             "sequence of num_tokens tokens occupies.", grade_blocks_needed),
]
