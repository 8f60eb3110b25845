"""Graded exercises of chapter 06 (chunked prefill).

06.1 is checked against the engine's own Scheduler: the expected chunks are what it schedules
for a long prompt that arrives while num_decodes requests are decoding (run on the simulator's
virtual clock, so no model is needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable
from minillm.simulator import simulate
from minillm.workload import RequestSpec

CHUNK_CASES = [(1024, 128, 8), (1000, 256, 0), (100, 512, 8), (2048, 2048, 4), (640, 128, 0),
               (300, 40, 32), (7, 9, 8)]


def scheduler_chunks(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """The prefill chunks the real Scheduler gives a prompt of prompt_len tokens that arrives
    while num_decodes one-token-prompt requests are decoding, at a token budget of budget."""
    decoders = [RequestSpec(0.0, 1, prompt_len + 2, seed=i) for i in range(num_decodes)]
    long = RequestSpec(1e-9, prompt_len, 1, seed=num_decodes)  # joins after the first step
    run = simulate("llama-3-8b", "H100-SXM", decoders + [long], max_num_batched_tokens=budget,
                   enable_chunked_prefill=True, record_block_tables=False)
    long_id = str(num_decodes)
    return [e.num_tokens for rec in run.trace for e in rec.scheduled
            if e.request_id == long_id and e.phase == "prefill"]


def budget_chunks(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """Budget-sized chunks with num_decodes tokens set aside in every step (for the hints)."""
    per_step, chunks, left = budget - num_decodes, [], prompt_len
    while left > 0:
        chunks.append(min(left, per_step))
        left -= chunks[-1]
    return chunks


def chunk_hint(got: list[int], prompt_len: int, budget: int, num_decodes: int) -> str:
    """Name the usual mistake behind a wrong list of chunks, or ''."""
    full = [budget - num_decodes] * math.ceil(prompt_len / (budget - num_decodes))
    if num_decodes and got == budget_chunks(prompt_len, budget, 0):
        return (" (each running decode takes one token of the budget first, in every step: the "
                "prompt gets budget - num_decodes)")
    if num_decodes and got and got[0] == budget - num_decodes and \
            got[1:] == budget_chunks(prompt_len - got[0], budget, 0):
        return (" (the decodes take their token in every step while the prompt is chunked, not "
                "only in the first)")
    if got == full or (got and sum(got) > prompt_len):
        return (" (the chunks must add up to the prompt: the last chunk is only what is left, "
                "not a full one)")
    if sum(got) < prompt_len:
        return " (the chunks must add up to the whole prompt)"
    return ""


def grade_chunk_schedule(chunk_schedule: Any) -> str:
    expect_callable(chunk_schedule,
                    "chunk_schedule(prompt_len, budget, num_decodes) -> list of chunk sizes")
    for prompt_len, budget, num_decodes in CHUNK_CASES:
        got = chunk_schedule(prompt_len, budget, num_decodes)
        assert got is not None, "chunk_schedule returned None"
        assert isinstance(got, (list, tuple)) and all(
            isinstance(c, int) and not isinstance(c, bool) for c in got), (
            f"return the list of chunk sizes (ints), one per step, got {got!r:.80}"
            + (" (that is a number of steps: list each step's chunk instead)"
               if isinstance(got, (int, float)) else ""))
        got = list(got)
        want = scheduler_chunks(prompt_len, budget, num_decodes)
        assert got == want, (
            f"a {prompt_len}-token prompt among {num_decodes} decodes at a budget of {budget}: "
            f"the engine's scheduler runs the chunks {short(want)}, you returned {short(got)}"
            f"{chunk_hint(got, prompt_len, budget, num_decodes)}")
    return ("each step the decodes take one token each and the prompt takes the rest: "
            "ceil(P / (budget - decodes)) steps to the first token, matching the real scheduler")


def short(chunks: list[int]) -> str:
    """A chunk list written compactly: [120, 120, ..., 64] (9 chunks)."""
    if len(chunks) <= 6:
        return str(chunks)
    return f"[{chunks[0]}, {chunks[1]}, ..., {chunks[-1]}] ({len(chunks)} chunks)"


STEP_TIMES: list[tuple[str, Callable[[int], float]]] = [
    ("5 ms + 10 us per token", lambda n: 0.005 + 1e-5 * n),
    ("max(4.8 ms, 16 us per token), a roofline", lambda n: max(0.0048, 1.6e-5 * n)),
    ("20 us per token", lambda n: 2e-5 * n),
]
TTFT_CASES = [(1024, 128, 8), (8000, 512, 32), (100, 2048, 16), (4096, 1024, 0)]


def grade_prefill_ttft(prefill_ttft: Any) -> str:
    expect_callable(prefill_ttft,
                    "prefill_ttft(prompt_len, budget, num_decodes, step_time) -> seconds")
    for name, step_time in STEP_TIMES:
        for prompt_len, budget, d in TTFT_CASES:
            got = prefill_ttft(prompt_len, budget, d, step_time)
            assert got is not None, "prefill_ttft returned None"
            assert isinstance(got, (int, float)), f"return seconds as a number, got {got!r:.80}"
            chunks = budget_chunks(prompt_len, budget, d)
            want = sum(step_time(c + d) for c in chunks)
            hint = ""
            if close(got, sum(step_time(c) for c in chunks)) and d:
                hint = (" (each step also carries the num_decodes decode tokens: price the step "
                        "at chunk + num_decodes tokens)")
            elif close(got, step_time(prompt_len + d)) or close(got, step_time(prompt_len)):
                hint = " (the prompt is split into chunks: one step per chunk, each one priced)"
            elif close(got, len(chunks) * step_time(budget)):
                hint = " (the last chunk is smaller than the budget: price each step's own tokens)"
            assert close(got, want, rel_tol=1e-6), (
                f"step_time = {name}: a {prompt_len}-token prompt among {d} decodes at a budget "
                f"of {budget} reaches its first token after {want * 1e3:.3f} ms, you returned "
                f"{got * 1e3:.3f} ms{hint}")
    return ("TTFT = sum over the chunks of step_time(chunk + decodes): small budgets pay the "
            "step's fixed cost many times, which is the TTFT side of the trade-off")


EXERCISES = [
    Exercise("06.1", "Chunk a prompt under the token budget",
             "Write chunk_schedule(prompt_len, budget, num_decodes) -> the prefill chunk sizes, "
             "one per step, of a prompt arriving while num_decodes requests decode (budget > "
             "num_decodes).", grade_chunk_schedule),
    Exercise("06.2", "TTFT of a chunked prompt",
             "Write prefill_ttft(prompt_len, budget, num_decodes, step_time) -> seconds to the "
             "first token when a step of n tokens costs step_time(n) seconds.",
             grade_prefill_ttft),
]
