"""Chapter 12's kernel-figures cell and its symbols, checked without running the chapter.

The cell that reports how close the kernels come to the GPU's peak measures them live on a GPU
and asserts there; on a CPU it shows the recorded H200 figures and asserts nothing about them.
Its GPU branch is run here on the CPU with the GPU calls stubbed, so that a slow kernel is seen
to fail it. The chapter's prose uses the book's symbols (notation.md): S tokens, R x J tiles, Z
splits, never N for tokens, B for tile rows or P for splits.
"""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minillm.attention import io_cost
from minillm.bench import kernels
from minillm.bench.kernels import Baselines, Figure
from minillm.calc.hardware import HARDWARE

pytestmark = pytest.mark.ch12

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "12_attention_io.ipynb"
COPY, MATMUL = 4.25e12, 7.2e14  # bytes/s and FLOP/s of a stubbed H200's copy and matmul


def cells() -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(CHAPTER.read_text())["cells"]}


def figures_cell() -> str:
    return "".join(cells()["c12-35"]["source"])


def run_figures_cell(monkeypatch: pytest.MonkeyPatch, gpu: bool, decode_ratio: float = 1.04,
                     prefill_ratio: float = 0.47, name: str = "NVIDIA H200",
                     capability: tuple[int, int] = (9, 0), memory: float = 141e9) -> dict:
    """Execute the cell with torch.cuda and the bench's timings stubbed: on a 'GPU' the kernels
    reach the given fractions of the run's copy and matmul."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *_: SimpleNamespace(total_memory=memory))
    dtypes = []

    def baselines(device, dtype=torch.bfloat16):
        dtypes.append(dtype)
        return Baselines(COPY, MATMUL)

    monkeypatch.setattr(kernels, "measure_baselines", baselines)
    calls = []

    def decode(shape, batch, context, copy_bw, device):
        dtypes.append(shape.dtype)
        calls.append(("decode", batch, context))
        gbs = decode_ratio * copy_bw / 1e9
        return [Figure("decode", gbs, "GB/s", "copy", copy_bw / 1e9, decode_ratio, 0.7)]

    def prefill(shape, tokens, matmul, device):
        dtypes.append(shape.dtype)
        calls.append(("prefill", tokens))
        tflops = prefill_ratio * matmul / 1e12
        return [Figure("prefill", tflops, "TFLOP/s", "matmul", matmul / 1e12, prefill_ratio)]

    monkeypatch.setattr(kernels, "decode_figures", decode)
    monkeypatch.setattr(kernels, "prefill_figures", prefill)
    namespace = {"torch": torch, "time": time, "io_cost": io_cost, "HARDWARE": HARDWARE}
    exec(compile(figures_cell(), "c12-35", "exec"), namespace)
    namespace["calls"], namespace["dtypes"] = calls, dtypes
    return namespace


def test_on_a_gpu_the_cell_measures_live_and_reports_it(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    done = run_figures_cell(monkeypatch, gpu=True)
    assert done["calls"] == [("decode", 64, 4096), ("prefill", 4096)], "Llama-3-8B, 64 x 4k, 4k"
    assert done["decode_bandwidth"] == pytest.approx(1.04 * COPY)
    assert done["prefill_flops"] == pytest.approx(0.47 * MATMUL)
    assert done["datasheet"] is HARDWARE["H200"]
    out = capsys.readouterr().out
    assert "measured live on this NVIDIA H200" in out and "recorded" not in out
    assert done["dtypes"] == [torch.bfloat16] * 3, "bf16 kernels against a bf16 matmul"


def test_on_a_t4_the_cell_measures_in_fp16(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A free T4 (sm_75) has no bf16 dot: the kernels and the matmul they are held to run in
    fp16, the dtype the engine itself takes there."""
    done = run_figures_cell(monkeypatch, gpu=True, name="Tesla T4", capability=(7, 5),
                            memory=16e9)
    assert done["dtypes"] == [torch.float16] * 3
    assert done["datasheet"] is HARDWARE["T4"]
    assert "in float16" in capsys.readouterr().out


@pytest.mark.parametrize("decode_ratio, prefill_ratio", [(0.5, 0.47), (1.04, 0.1), (1.04, 1.2)],
                         ids=["slow-decode", "slow-prefill", "prefill-above-the-matmul"])
def test_on_a_gpu_a_kernel_off_its_claim_fails_the_cell(monkeypatch: pytest.MonkeyPatch,
                                                        decode_ratio: float,
                                                        prefill_ratio: float) -> None:
    with pytest.raises(AssertionError):
        run_figures_cell(monkeypatch, gpu=True, decode_ratio=decode_ratio,
                         prefill_ratio=prefill_ratio)


def test_on_a_cpu_the_cell_shows_the_record_and_asserts_nothing_about_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    done = run_figures_cell(monkeypatch, gpu=False, decode_ratio=0.0, prefill_ratio=0.0)
    assert done["calls"] == [], "nothing is timed without a GPU"
    assert done["decode_bandwidth"] == io_cost.MEASURED_H200.decode_bandwidth
    out = capsys.readouterr().out
    assert io_cost.MEASURED_H200.commit[:7] in out and "not measured here" in out
    branch = next(node for node in ast.walk(ast.parse(figures_cell()))
                  if isinstance(node, ast.If) and "cuda.is_available" in ast.unparse(node.test))
    assert not [n for stmt in branch.orelse for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
    assert [n for stmt in branch.body for n in ast.walk(stmt) if isinstance(n, ast.Assert)]


def test_the_kernel_cells_run_on_the_device_the_chapter_finds() -> None:
    """On a GPU the extend and decode cells hand the kernels CUDA tensors, not CPU ones."""
    source = {i: "".join(cells()[i]["source"]) for i in ("c12-32", "c12-33")}
    assert "device = machine.device()" in source["c12-32"]
    assert ".to(device)" in source["c12-32"] and ".to(device)" in source["c12-33"]


# The book's symbols in chapter 12's prose: N counts KV blocks, B is the batch, P the block size.
CLASHES = {
    "N for tokens": r"N²|N × N|\bN tokens|\bN = \d|\blong N\b|⌈N/|Θ\(N",
    "B for a tile's rows": r"\bB query rows|\bB = (?:228|384|456)\b|B/\(2D\)|2B/D|rows B\b",
    "P for splits": r"\(P, \.\.\.|\bP disjoint|lseₚ|Oₚ",
    "M, n for a tile's shape": r"\(\.\.\., M, n\)|\(\.\.\., n, D\)",
    "m for the running max": r"\*m\*|e\^\(m − m'\)",
}


def test_chapter_12_uses_the_books_symbols() -> None:
    markdown = "\n".join("".join(c["source"]) for c in cells().values()
                         if c["cell_type"] == "markdown")
    # Quotations keep their own symbols: code spans, the seed's words, the paper's Θ(N²·d²/M).
    markdown = re.sub(r"`[^`]*`|\"[^\"]*\"|Θ\(N²·d²/M\)", "", markdown)
    for clash, pattern in CLASHES.items():
        found = re.findall(pattern, markdown)
        assert not found, f"chapter 12 uses {clash}: {found}"
    notation = (CHAPTER.parent / "notation.md").read_text()
    for symbol in ("R", "J", "Z", "G", "μ"):
        assert re.search(rf"^\| {symbol} \|", notation, re.M), f"notation.md lacks {symbol}"


# Section 1's roofline cell (c12-08b): naive attention is compute-bound on a CPU core and
# memory-bound on a GPU; the cell checks the bound of the device it measured, in its dtype.
def run_ridge_cell(monkeypatch: pytest.MonkeyPatch, hardware, gpu: bool,
                   capability: tuple[int, int] = (9, 0), name: str = "NVIDIA H200") -> dict:
    from minillm.calc import roofline

    monkeypatch.delenv("MINILLM_GPU_SHAPED", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *_: SimpleNamespace(total_memory=hardware.memory, name=name))
    monkeypatch.setattr(roofline, "measure_machine", lambda **_: hardware)
    namespace = {"io_cost": io_cost, "HARDWARE": HARDWARE, "LENGTHS": [256, 4096], "D": 64,
                 "H": 2}
    exec(compile("".join(cells()["c12-08b"]["source"]), "c12-08b", "exec"), namespace)
    return namespace


def _hardware(name: str, flops: float, bandwidth: float, memory: float):
    from minillm.calc.hardware import Hardware

    return Hardware(name, flops, bandwidth, memory)


@pytest.mark.parametrize("hardware, capability, dtype_bytes", [
    (_hardware("this machine (cuda: NVIDIA H200)", 7.0e14, 4.2e12, 141e9), (9, 0), 2),  # bf16
    (_hardware("this machine (cuda: Tesla T4)", 4.0e13, 2.4e11, 16e9), (7, 5), 2),  # fp16
], ids=["H200-bf16", "T4-fp16"])
def test_on_a_gpu_naive_attention_is_memory_bound(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], hardware,
                                                 capability, dtype_bytes) -> None:
    done = run_ridge_cell(monkeypatch, hardware, gpu=True, capability=capability,
                          name=hardware.name)
    assert done["bound"] == "memory"
    expected = io_cost.attention_flops(4096, 64, 2) / io_cost.hbm_bytes_naive(4096, 64, 2,
                                                                              dtype_bytes)
    assert done["naive_intensity"] == pytest.approx(expected), "counted in the GPU's 16 bits"
    out = capsys.readouterr().out
    assert "memory-bound here" in out and "compute-bound there" in out


def test_on_a_cpu_naive_attention_is_compute_bound(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cpu = _hardware("this machine (cpu)", 6e10, 1.2e10, 8e9)  # one core: ridge 5 FLOP/byte
    done = run_ridge_cell(monkeypatch, cpu, gpu=False)
    assert done["bound"] == "compute" and done["caps"].dtype_bytes == 4
    out = capsys.readouterr().out
    assert "compute-bound here" in out and "H100's ridge: 295 FLOP/byte" in out


def test_the_ridge_cell_fails_where_its_bound_does_not_hold(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A 'GPU' whose ridge sits below naive attention's intensity, or a 'CPU' above it, fails."""
    with pytest.raises(AssertionError, match="memory-bound on a GPU"):
        run_ridge_cell(monkeypatch, _hardware("slow gpu", 1e12, 1e12, 16e9), gpu=True)
    with pytest.raises(AssertionError, match="compute-bound on a CPU"):
        run_ridge_cell(monkeypatch, _hardware("fast cpu", 1e13, 1e10, 8e9), gpu=False)
