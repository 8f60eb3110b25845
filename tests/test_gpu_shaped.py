"""The GPU-shaped run: the book on the CPU with a GPU's rules (minillm.device), and the two rules
it showed the chapters need: batching pays only where the roof says it can, and in 16 bits a
greedy answer may flip where runs batch or cache the same requests differently.

CI runs chapter 03 T4-shaped (fp16) here; the whole book in both shapes is
`python -m minillm.bench chapters --gpu-shaped bf16|fp16` (5 to 13 minutes each on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minillm.bench import chapters
from minillm.calc import models
from minillm.calc.roofline import Hardware, batching_gain
from minillm.quality import MOST_ANSWERS, same_answers

SMOL = models.get("smollm2-135m")
CPU_FP32 = Hardware("a 2-core CPU in fp32", 47e9, 19e9, 24e9)  # measured here, 1 thread
CPU_BF16 = Hardware("the same CPU in bf16", 7e9, 19e9, 24e9)  # no bf16 GEMM kernels: ~7 GFLOP/s


def test_batching_pays_up_to_the_ridge_and_not_on_a_cpu_computing_in_bf16() -> None:
    assert 30 < batching_gain(SMOL, "H100-SXM", 32, 16) <= 32, "an H100 shares one weight read"
    assert batching_gain(SMOL, CPU_FP32, 32, 16, dtype_bytes=4) > 4
    # 2 FLOPs a weight over 2 bytes: 1 FLOP/byte at B = 1, above a 0.37 FLOP/byte ridge
    assert batching_gain(SMOL, CPU_BF16, 32, 16) == pytest.approx(1.0, abs=0.05)
    assert batching_gain(SMOL, "H100-SXM", 1, 16) == pytest.approx(1.0)


def test_fp32_promises_every_answer_and_16_bits_most() -> None:
    ref = [[1, 2, 3], [4, 5], [6], [7, 8]]
    one_flip = [[1, 2, 3], [4, 9], [6], [7, 8]]
    broken = [[9], [9], [9], [7, 8]]
    assert same_answers(ref, [ref], torch.float32) == ([1.0], True)
    assert same_answers(ref, [one_flip], torch.float32) == ([0.75], False)
    assert same_answers(ref, [ref, one_flip], torch.bfloat16) == ([1.0, 0.75], True)
    assert same_answers(ref, [broken], torch.float16) == ([0.25], False)
    assert 0.25 < MOST_ANSWERS <= 0.75
    with pytest.raises(ValueError, match="3 answers"):
        same_answers(ref, [ref[:3]], torch.float32)


def test_chapter_03_holds_t4_shaped(tmp_path: Path) -> None:
    """fp16 engines, fp8 K/V refused: its pool bytes follow the dtype, and its batching check
    follows the roof of this CPU measured in fp16 (no memory-bound regime left)."""
    path = next(p for p in chapters.chapter_paths() if p.name.startswith("03_"))
    run = chapters.run_in_subprocess(path, timeout=600, log=tmp_path / "log", gpu_shaped="fp16")
    assert run.ok, run.summary()
    log = (tmp_path / "log").read_text()
    assert "KV stored as torch.float16" in log, "the chapter ran with a T4's dtype"
