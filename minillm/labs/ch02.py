"""Graded exercises of chapter 02 (the roofline)."""

from __future__ import annotations

from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable

# (name, dense BF16 TFLOP/s, memory GB/s) as the datasheets print them.
DATASHEETS = [("A100-80GB", 312, 2039), ("H100-SXM", 989, 3350), ("H200", 989, 4800),
              ("L4", 121, 300), ("a 2-core CPU", 0.09, 23)]


def grade_datasheet_ridge(datasheet_ridge: Any) -> str:
    expect_callable(datasheet_ridge,
                    "datasheet_ridge(peak_tflops, bandwidth_gbs) -> FLOPs per byte")
    for name, tflops, gbs in DATASHEETS:
        got = datasheet_ridge(tflops, gbs)
        assert got is not None, "datasheet_ridge returned None"
        assert isinstance(got, (int, float)), f"return FLOPs per byte as a number, got {got!r}"
        want = tflops * 1e12 / (gbs * 1e9)
        hint = ""
        if close(got, tflops / gbs):
            hint = (" (units: TFLOP/s is 1e12 FLOP/s but GB/s is 1e9 bytes/s; convert both "
                    "before dividing)")
        elif close(got, 1 / want) or close(got, gbs / tflops):
            hint = (" (the ratio is inverted: FLOPs per byte is peak FLOP/s divided by "
                    "bytes/s, not bytes per FLOP)")
        elif close(got, tflops * 1e12 * gbs * 1e9) or close(got, tflops * gbs):
            hint = " (divide the peak FLOP/s by the bandwidth, don't multiply them)"
        elif close(got, 2 * want) or close(got, want / 2):
            hint = (" (a FLOP/s peak already counts a multiply-add as 2 FLOPs, and the "
                    "TFLOP/s given is the dense figure: don't double or halve it)")
        assert close(got, want), (
            f"{name} ({tflops:g} TFLOP/s, {gbs:g} GB/s): the ridge point is {want:.4g} FLOPs "
            f"per byte, you returned {got!r}{hint}")
    return ("ridge = peak FLOP/s / bytes/s: A100 ~153, H100 ~295, H200 ~206 FLOPs/byte; "
            "a step of lower intensity is memory-bound")


# (what, FLOPs, bytes moved, peak FLOP/s, bytes/s): memory-bound, compute-bound and balanced.
STEPS = [("70B decode, batch 1, on an H100", 2 * 70e9, 140e9, 989e12, 3.35e12),
         ("70B prefill of 4096 tokens on an H100", 2 * 70e9 * 4096, 140e9, 989e12, 3.35e12),
         ("8B decode, batch 64, on an A100", 2 * 8e9 * 64, 16e9 + 4e9, 312e12, 2.039e12),
         ("a step exactly at the ridge", 2.95e12, 1e10, 989e12, 3.35e12),
         ("a tiny model's prefill on a CPU", 2.6e9, 2e7, 9e10, 2.3e10)]


def _roofline_time_hint(answers: list[float]) -> str:
    """Name the mistake that explains every one of the reader's answers, if one does."""
    def every(rule: Any) -> bool:
        return all(close(got, rule(f, m, p, b)) for got, (_, f, m, p, b) in zip(answers, STEPS))

    if every(lambda f, m, p, b: f / p + m / b):
        return (" (don't add the two times: the bytes stream in while the math runs, so the "
                "slower of the two sets the pace: take the max)")
    if every(lambda f, m, p, b: f / p):
        return (" (you count only the FLOPs' time: a memory-bound step such as decode waits "
                "for its bytes; take the max of both times)")
    if every(lambda f, m, p, b: m / b):
        return (" (you count only the bytes' time: a compute-bound step such as a long "
                "prefill waits for its FLOPs; take the max of both times)")
    if every(lambda f, m, p, b: min(f / p, m / b)):
        return (" (a step needs all its FLOPs AND all its bytes: it can't beat the slower of "
                "the two, so the bound is the max, not the min)")
    if every(lambda f, m, p, b: max(p / f, b / m)) or every(lambda f, m, p, b: min(p / f, b / m)):
        return " (seconds = work / rate: FLOPs / (FLOP/s) and bytes / (bytes/s))"
    return ""


def grade_roofline_time(roofline_time: Any) -> str:
    expect_callable(roofline_time,
                    "roofline_time(flops, bytes_moved, peak_flops, bandwidth) -> seconds")
    answers = []
    for _, flops, moved, peak, bw in STEPS:
        got = roofline_time(flops, moved, peak, bw)
        assert got is not None, "roofline_time returned None"
        assert isinstance(got, (int, float)), f"return seconds as a number, got {got!r}"
        answers.append(got)
    for got, (what, flops, moved, peak, bw) in zip(answers, STEPS):
        want = max(flops / peak, moved / bw)
        assert close(got, want), (
            f"{what}: {flops:.3g} FLOPs and {moved:.3g} bytes at {peak:.3g} FLOP/s and "
            f"{bw:.3g} B/s take at least {want:.4g} s, you returned {got!r}"
            f"{_roofline_time_hint(answers)}")
    return ("time >= max(FLOPs / peak, bytes / bandwidth): 70B on an H100 needs ~42 ms per "
            "decode step and ~0.58 s for a 4k prefill")


EXERCISES = [
    Exercise("02.1", "The ridge point from a datasheet",
             "Write datasheet_ridge(peak_tflops, bandwidth_gbs) -> FLOPs per byte at which the "
             "roofline bends, from datasheet units (TFLOP/s and GB/s).",
             grade_datasheet_ridge),
    Exercise("02.2", "The roofline's lower bound on a step's time",
             "Write roofline_time(flops, bytes_moved, peak_flops, bandwidth) -> the least "
             "seconds a step can take on that device.", grade_roofline_time),
]
