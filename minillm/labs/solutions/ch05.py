"""Reference solutions of chapter 05's graded exercises."""

from __future__ import annotations


def static_batch_steps(output_lens: list[int], batch_size: int) -> int:
    """05.1: each batch, taken in arrival order, holds its seats until its longest member ends."""
    batches = [output_lens[i:i + batch_size] for i in range(0, len(output_lens), batch_size)]
    return sum(max(batch) for batch in batches)


def seats_to_fill(num_running: int, max_num_seqs: int, min_free: int) -> int:
    """05.2: fill every free seat, but only once at least min_free of them are free."""
    free = max_num_seqs - num_running
    return free if free >= min_free else 0


SOLUTIONS = {"05.1": static_batch_steps, "05.2": seats_to_fill}
