"""Reference solutions of chapter 06's graded exercises."""

from __future__ import annotations

from collections.abc import Callable


def chunk_schedule(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """06.1: each step the decodes take one token each, the prompt takes the rest of the budget."""
    per_step = budget - num_decodes
    chunks, left = [], prompt_len
    while left > 0:
        chunks.append(min(left, per_step))
        left -= chunks[-1]
    return chunks


def prefill_ttft(prompt_len: int, budget: int, num_decodes: int,
                 step_time: Callable[[int], float]) -> float:
    """06.2: one step per chunk, each step carrying its chunk plus the decodes' tokens."""
    return sum(step_time(chunk + num_decodes)
               for chunk in chunk_schedule(prompt_len, budget, num_decodes))


SOLUTIONS = {"06.1": chunk_schedule, "06.2": prefill_ttft}
