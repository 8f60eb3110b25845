"""Reference solutions of the graded exercises, kept out of the chapters.

tests/test_labs.py checks that each one passes its grader (and that unfilled stubs fail).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def decode_intensity(num_params: int, batch: int, dtype_bytes: float) -> float:
    """01.1: 2 FLOPs per weight per sequence; every weight read once per step for the batch."""
    return 2 * num_params * batch / (num_params * dtype_bytes)


def estimate_ttft(prompt_len: int, tokens_per_second: float, overhead_s: float) -> float:
    """01.2: a fixed per-step cost plus the prompt at the prefill rate."""
    return overhead_s + prompt_len / tokens_per_second


SOLUTIONS: dict[str, Callable[..., Any]] = {"00.1": tpot, "00.2": blocks_needed,
                                         "01.1": decode_intensity, "01.2": estimate_ttft}
