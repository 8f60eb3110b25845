"""Reference solutions of chapter 01's graded exercises."""

from __future__ import annotations


def decode_intensity(num_params: int, batch: int, dtype_bytes: float) -> float:
    """01.1: 2 FLOPs per weight per sequence; every weight read once per step for the batch."""
    return 2 * num_params * batch / (num_params * dtype_bytes)


def estimate_ttft(prompt_len: int, tokens_per_second: float, overhead_s: float) -> float:
    """01.2: a fixed per-step cost plus the prompt at the prefill rate."""
    return overhead_s + prompt_len / tokens_per_second


SOLUTIONS = {"01.1": decode_intensity, "01.2": estimate_ttft}
