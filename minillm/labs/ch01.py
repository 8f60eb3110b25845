"""Graded exercises of chapter 01 (prefill vs decode)."""

from __future__ import annotations

from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable


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


EXERCISES = [
    Exercise("01.1", "Arithmetic intensity of a decode step",
             "Write decode_intensity(num_params, batch, dtype_bytes) -> FLOPs per byte of one "
             "decode step, counting the weight matmuls only.", grade_decode_intensity),
    Exercise("01.2", "TTFT from a prompt length and a prefill rate",
             "Write estimate_ttft(prompt_len, tokens_per_second, overhead_s) -> seconds to "
             "the first token.", grade_estimate_ttft),
]
