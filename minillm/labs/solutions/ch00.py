"""Reference solutions of chapter 00's graded exercises."""

from __future__ import annotations

from minillm.metrics import RequestMetrics


def tpot(metrics: RequestMetrics) -> float | None:
    """00.1: seconds per output token after the first: n tokens have n - 1 gaps."""
    times = metrics.token_times
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """00.2: ceil(num_tokens / block_size) without floats."""
    return -(-num_tokens // block_size)


SOLUTIONS = {"00.1": tpot, "00.2": blocks_needed}
