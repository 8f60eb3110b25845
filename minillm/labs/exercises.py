"""The registry of graded exercises: id ("CC.N", CC the chapter) -> an Exercise.

A grader takes the reader's answer (a function or a value), checks it with asserts whose
messages speak to the reader ("you divided by n; ..."), and returns a short message on success.
Anything the reader's own code raises is reported by check(), not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minillm.metrics import RequestMetrics


@dataclass(frozen=True)
class Exercise:
    """One graded exercise. grade(answer) raises AssertionError(reader message) when wrong."""

    id: str
    title: str
    prompt: str
    grade: Callable[[Any], str]

    @property
    def chapter(self) -> str:
        """The pytest marker of this exercise's lab, e.g. "ch00"."""
        return "ch" + self.id.split(".")[0]


def expect_callable(answer: Any, signature: str) -> None:
    assert callable(answer), (
        f"pass a function {signature}, not a {type(answer).__name__}")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


# ---- chapter 00: the tour --------------------------------------------------------------------

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


# ---- chapter 01: prefill vs decode -----------------------------------------------------------

def grade_decode_intensity(decode_intensity: Any) -> str:
    expect_callable(decode_intensity,
                    "decode_intensity(num_params, batch, dtype_bytes) -> FLOPs per byte")
    cases = [(8_000_000_000, 1, 2), (8_000_000_000, 16, 2), (5_000_000, 64, 2),
             (70_000_000_000, 8, 1), (1_000_000_000, 3, 4)]
    for num_params, batch, dtype_bytes in cases:
        got = decode_intensity(num_params, batch, dtype_bytes)
        assert got is not None, "decode_intensity returned None"
        assert isinstance(got, (int, float)), (
            f"return FLOPs per byte as a number, got {got!r}")
        want = 2 * batch / dtype_bytes
        hint = ""
        if close(got, batch / dtype_bytes):
            hint = " (a multiply-add is 2 FLOPs: each weight costs 2 FLOPs per token)"
        elif close(got, 2 * batch):
            hint = " (divide by the bytes moved: each weight is dtype_bytes bytes)"
        elif close(got, 2 / dtype_bytes):
            hint = (" (the weights are read once per step and shared by the whole batch: "
                    "FLOPs grow with batch, bytes do not)")
        assert close(got, want), (
            f"{num_params:,} params, batch {batch}, {dtype_bytes}-byte weights: a decode step "
            f"does {want:g} FLOPs per byte, you returned {got!r}{hint}")
    return ("decode intensity = 2·N·B FLOPs / (N·bytes) = 2B / bytes: about B at 16-bit, "
            "whatever the model's size")


def grade_estimate_ttft(estimate_ttft: Any) -> str:
    expect_callable(estimate_ttft,
                    "estimate_ttft(prompt_len, tokens_per_second, overhead_s) -> seconds")
    cases = [(1024, 2048.0, 0.0), (16, 1000.0, 0.05), (4096, 8192.0, 0.002), (1, 10.0, 1.0)]
    for prompt_len, rate, overhead in cases:
        got = estimate_ttft(prompt_len, rate, overhead)
        assert got is not None, "estimate_ttft returned None"
        assert isinstance(got, (int, float)), f"return seconds as a number, got {got!r}"
        want = overhead + prompt_len / rate
        hint = ""
        if close(got, prompt_len / rate) and overhead:
            hint = " (add the fixed per-step overhead: even a 1-token prompt costs a step)"
        elif close(got, overhead + rate / prompt_len):
            hint = " (tokens / (tokens per second) is seconds: divide the prompt by the rate)"
        assert close(got, want), (
            f"a {prompt_len}-token prompt at {rate:g} prefill tokens/s with {overhead:g} s "
            f"overhead takes {want:g} s, you returned {got!r}{hint}")
    return "TTFT ≈ overhead + P / prefill rate: linear in the prompt once P is large"


EXERCISES: dict[str, Exercise] = {e.id: e for e in [
    Exercise("00.1", "TPOT from a request's timestamps",
             "Write tpot(metrics) -> seconds per output token after the first, from "
             "metrics.token_times; None with fewer than two tokens.", grade_tpot),
    Exercise("00.2", "KV blocks a sequence needs",
             "Write blocks_needed(num_tokens, block_size) -> the number of KV blocks a "
             "sequence of num_tokens tokens occupies.", grade_blocks_needed),
    Exercise("01.1", "Arithmetic intensity of a decode step",
             "Write decode_intensity(num_params, batch, dtype_bytes) -> FLOPs per byte of one "
             "decode step, counting the weight matmuls only.", grade_decode_intensity),
    Exercise("01.2", "TTFT from a prompt length and a prefill rate",
             "Write estimate_ttft(prompt_len, tokens_per_second, overhead_s) -> seconds to "
             "the first token.", grade_estimate_ttft),
]}
