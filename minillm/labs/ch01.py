"""Graded exercises of chapter 01 (prefill vs decode).

01.3 runs the reader's search against the simulator: every call of tpot_at serves a batch of
Llama-3-8B requests through the engine's real Scheduler and BlockManager on a virtual H100 clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
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




# ---- 01.3: the largest batch that meets a TPOT target, searched through the simulator ----------

SIM_MODEL, SIM_HARDWARE, SIM_PROMPT_LEN, SIM_OUTPUT_LEN = "llama-3-8b", "H100-SXM", 2048, 8


class CountedTpot:
    """tpot_at(B) for a reader's search: counts the calls and refuses batches out of range."""

    def __init__(self, fn: Callable[[int], float], max_batch: int, where: str):
        self.fn, self.max_batch, self.where = fn, max_batch, where
        self.calls: list[int] = []
        self.cache: dict[int, float] = {}

    def __call__(self, batch: int) -> float:
        assert isinstance(batch, int) and not isinstance(batch, bool), (
            f"call tpot_at with a whole batch size, got {batch!r}")
        assert 1 <= batch <= self.max_batch, (
            f"you called tpot_at({batch}) {self.where}, outside 1..max_batch={self.max_batch}")
        self.calls.append(batch)
        return self.value(batch)

    def value(self, batch: int) -> float:
        """The grader's own look-up: not counted."""
        if batch not in self.cache:
            self.cache[batch] = self.fn(batch)
        return self.cache[batch]


@cache
def simulated_tpot(batch: int) -> float:
    """Median decode step (seconds) of `batch` Llama-3-8B requests (2,048-token prompts) served
    together on a simulated H100-SXM by the engine's scheduler with max_num_seqs=batch."""
    from minillm import simulate
    from minillm.workloads import streams as wl

    work = wl.poisson(batch, float("inf"), prompt_len=SIM_PROMPT_LEN,
                      output_len=SIM_OUTPUT_LEN, seed=0)
    result = simulate(SIM_MODEL, SIM_HARDWARE, work, max_num_seqs=batch,
                      max_num_batched_tokens=SIM_PROMPT_LEN * batch, record_block_tables=False)
    steps = sorted(rec.end - rec.start for rec in result.trace
                   if len(rec.scheduled) == batch
                   and all(e.phase == "decode" for e in rec.scheduled))
    return steps[len(steps) // 2]


def _max_calls(max_batch: int) -> int:
    return 2 * math.ceil(math.log2(max_batch + 1)) + 4


def _best_batch(tpot: CountedTpot, target: float) -> int:
    """The largest B in 1..max_batch with tpot(B) <= target (tpot non-decreasing), or 0."""
    lo, hi = 0, tpot.max_batch  # tpot(lo) meets the target (or lo = 0); the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if tpot.value(mid) <= target else (lo, mid - 1)
    return lo


def _run_search(max_batch_for_tpot: Any, fn: Callable[[int], float], target: float,
                max_batch: int, where: str) -> None:
    tpot = CountedTpot(fn, max_batch, where)
    got = max_batch_for_tpot(tpot, target, max_batch)
    want = _best_batch(tpot, target)
    case = f"{where}, target {target * 1e3:g} ms, max_batch {max_batch}"
    assert got is not None, "max_batch_for_tpot returned None"
    assert isinstance(got, int) and not isinstance(got, bool), (
        f"return a whole batch size (an int), got {got!r}")
    assert 0 <= got <= max_batch, f"{case}: return a batch in 0..{max_batch}, got {got}"
    if got != want:
        if want == 0:
            hint = (f" (even B=1 takes {tpot.value(1) * 1e3:.2f} ms: no batch meets the target, "
                    "so return 0)")
        elif got > want:
            hint = (f" (B={got} takes {tpot.value(got) * 1e3:.2f} ms, above the target"
                    + ("; it is the first batch that breaks it: back off one step)"
                       if got == want + 1 else ")"))
        else:
            hint = (f" (B={want} still meets it at {tpot.value(want) * 1e3:.2f} ms: keep raising "
                    "the batch; after doubling past the target, bisect between the last batch "
                    "that met it and the first that broke it)")
        raise AssertionError(f"{case}: the largest batch that meets it is {want}, you returned "
                             f"{got}{hint}")
    limit = _max_calls(max_batch)
    assert len(tpot.calls) <= limit, (
        f"{case}: right answer, but you called tpot_at {len(tpot.calls)} times (each call is a "
        f"whole serving run); doubling and then bisection needs at most {limit}")


def grade_max_batch_for_tpot(max_batch_for_tpot: Any) -> str:
    expect_callable(max_batch_for_tpot,
                    "max_batch_for_tpot(tpot_at, tpot_target, max_batch) -> int")
    synthetic = [  # (tpot_at in seconds, target, max_batch)
        (lambda b: 0.010 + 0.001 * b, 0.050, 100),
        (lambda b: 0.010 + 0.001 * b, 0.0505, 1000),
        (lambda b: 0.020 if b <= 16 else 0.020 + 0.002 * (b - 16), 0.020, 256),
        (lambda b: 0.030 + 0.0001 * b, 0.020, 64),
        (lambda b: 0.005 + 0.00001 * b, 0.050, 300),
        (lambda b: 0.010 * b, 0.010, 1),
        (lambda b: 0.004 * (1 + (b > 7)), 0.005, 40),
    ]
    for fn, target, max_batch in synthetic:
        _run_search(max_batch_for_tpot, fn, target, max_batch, "on a made-up TPOT curve")
    found = []
    for target in (0.006, 0.010, 0.0125):
        _run_search(max_batch_for_tpot, simulated_tpot, target, 128,
                    f"in the simulator ({SIM_MODEL} on {SIM_HARDWARE}, {SIM_PROMPT_LEN}-token "
                    "prompts)")
        found.append(_best_batch(CountedTpot(simulated_tpot, 128, ""), target))
    return (f"on a simulated {SIM_HARDWARE}, Llama-3-8B at a 2k context meets a 6 / 10 / 12.5 ms "
            f"TPOT target with up to {found[0]} / {found[1]} / {found[2]} sequences: past a few, "
            "every sequence's own KV reads raise every request's TPOT")

EXERCISES = [
    Exercise("01.1", "Arithmetic intensity of a decode step",
             "Write decode_intensity(num_params, batch, dtype_bytes) -> FLOPs per byte of one "
             "decode step, counting the weight matmuls only.", grade_decode_intensity),
    Exercise("01.2", "TTFT from a prompt length and a prefill rate",
             "Write estimate_ttft(prompt_len, tokens_per_second, overhead_s) -> seconds to "
             "the first token.", grade_estimate_ttft),
    Exercise("01.3", "The largest batch that meets a TPOT target",
             "Write max_batch_for_tpot(tpot_at, tpot_target, max_batch) -> the largest batch B "
             "with tpot_at(B) <= tpot_target (0 if none), calling tpot_at as few times as you "
             "can.", grade_max_batch_for_tpot),
]
