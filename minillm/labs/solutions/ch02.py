"""Reference solutions of chapter 02's graded exercises."""

from __future__ import annotations


def datasheet_ridge(peak_tflops: float, bandwidth_gbs: float) -> float:
    """02.1: peak FLOP/s over bytes/s, both converted to base units first."""
    return peak_tflops * 1e12 / (bandwidth_gbs * 1e9)


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """02.2: the step waits for the slower of its arithmetic and its memory traffic."""
    return max(flops / peak_flops, bytes_moved / bandwidth)


SOLUTIONS = {"02.1": datasheet_ridge, "02.2": roofline_time}
