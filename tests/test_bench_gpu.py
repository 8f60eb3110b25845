"""`bench gpu`, the one prepared GPU run, checked on the CPU with its CUDA parts stubbed.

What can be checked without a GPU is the run's shape: it imports without the server's packages,
writes its report after every part (so a cut run keeps what it measured), goes on past a failed
part, and its checks (the GPU tests, a chapter under nbval) count what pytest reports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.bench import gpu, gpu_checks, kernels
from minillm.bench.kernels import Figure

SERVER_PACKAGES = ("fastapi", "uvicorn", "aiohttp", "openai")

BLOCK_SERVER_PACKAGES = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {SERVER_PACKAGES!r}:
            raise ImportError("not on the GPU machine: " + name)
sys.meta_path.insert(0, Block())
"""


def test_the_gpu_run_starts_without_the_server_packages(tmp_path: Path) -> None:
    code = BLOCK_SERVER_PACKAGES + f"""
import minillm.bench.gpu
from minillm.bench.__main__ import main
rc = main(["gpu", "--out", {str(tmp_path)!r}])
assert not [m for m in sys.modules if m.split(".")[0] in {SERVER_PACKAGES!r}]
print("rc", rc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=gpu_checks.ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"rc {0 if torch.cuda.is_available() else 2}" in done.stdout


def figure(name: str) -> Figure:
    return Figure(name, 1.0, "ms", "a baseline", 2.0, 2.0)


def test_the_report_is_written_after_every_part_and_a_failed_part_is_noted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "gpu-bench.json"

    def figures_so_far() -> list[str]:
        return [f["name"] for f in json.loads(report.read_text())["figures"]]

    def fake_engine_parts(run: gpu.Run, args: argparse.Namespace, copy_bw: float) -> None:
        assert figures_so_far() == ["kernel"]  # the kernels' part is on disk already
        run.part("TPOT", lambda: [figure("tpot")])

        def fails() -> list[Figure]:
            raise RuntimeError("no graphs today")
        run.part("CUDA graphs", fails)
        run.part("engine vs transformers", lambda: [figure("throughput")])

    def fake_tests(out: Path, timeout: float) -> gpu_checks.CheckResult:
        assert figures_so_far() == ["kernel", "tpot", "throughput"]
        assert 60 <= timeout <= 470 - 100  # what the budget leaves, less the chapter's reserve
        return gpu_checks.CheckResult("gpu-tests", 30, 0, 2, 1.0)

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a stub GPU")
    monkeypatch.setattr(kernels, "measure_baselines", lambda device: kernels.Baselines(1e12, 1e15))
    monkeypatch.setattr(kernels, "kernel_figures", lambda args, base, dev: [figure("kernel")])
    monkeypatch.setattr(gpu, "engine_parts", fake_engine_parts)
    monkeypatch.setattr(gpu, "free", lambda: None)
    monkeypatch.setattr(gpu_checks, "gpu_tests", fake_tests)
    monkeypatch.setattr(gpu_checks, "chapter_under_nbval", lambda chapter, out, timeout:
                        gpu_checks.CheckResult(chapter, 9, 1, 0, 1.0))
    args = argparse.Namespace(out=tmp_path, chapter="04_paged_attention", batch=64,
                              context=4096, prefill_tokens=4096, num_seqs=128, hf_batch=64,
                              budget=470.0)
    assert gpu.main(args) == 1  # a part failed, and so did one chapter cell
    notes = json.loads(report.read_text())["notes"]
    assert figures_so_far() == ["kernel", "tpot", "throughput"]
    assert notes["CUDA graphs failed"] == "RuntimeError: no graphs today"
    assert notes["GPU tests"].startswith("30 passed, 0 failed or errored, 2 skipped")
    assert notes["chapter 04_paged_attention under nbval"].startswith("9 passed, 1 failed")
    assert {"seconds: kernels", "seconds: TPOT", "seconds: whole run"} <= set(notes)
    assert "| tpot | 1 ms | a baseline: 2 ms | 2.00 |" in (tmp_path / "gpu-bench.md").read_text()


def test_nano_vllm_workload_is_seeded_with_lengths_from_100_to_1024() -> None:
    reqs = gpu.nano_vllm_workload(64, vocab_size=1000, seed=0)
    assert reqs == gpu.nano_vllm_workload(64, vocab_size=1000, seed=0)
    assert all(100 <= len(r.prompt_token_ids) <= 1024 and 100 <= r.max_tokens <= 1024
               for r in reqs)
    assert max(r.max_tokens for r in reqs) - min(r.max_tokens for r in reqs) > 500


def test_a_pytest_check_counts_what_junit_reports(tmp_path: Path) -> None:
    tests = tmp_path / "test_demo.py"
    tests.write_text("import pytest\n"
                     "def test_a(): pass\n"
                     "def test_b(): pass\n"
                     "def test_c(): assert False\n"
                     "@pytest.mark.skip\n"
                     "def test_d(): pass\n")
    result = gpu_checks.run_pytest("demo", [str(tests)], tmp_path / "out", timeout=120)
    assert (result.passed, result.failed, result.skipped) == (2, 1, 1)
    assert not result.ok
    assert "test_c" in (tmp_path / "out" / "demo.log").read_text()


def demo_chapter(root: Path) -> None:
    (root / "chapters").mkdir()
    (root / "chapters" / "99_demo.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [],
                   "execution_count": None} for src in ("x = 1", "assert x == 1")],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


@pytest.mark.skipif(not gpu_checks.has_nbval(), reason="needs nbval and ipykernel")
def test_a_chapter_runs_under_nbval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo_chapter(tmp_path)
    monkeypatch.setattr(gpu_checks, "ROOT", tmp_path)
    result = gpu_checks.chapter_under_nbval("99_demo", tmp_path / "out", timeout=120)
    assert (result.passed, result.failed, result.ok) == (2, 0, True), result.detail
    assert "--nbval-lax" in (tmp_path / "out" / "chapter-99_demo.log").read_text()


def test_a_chapter_runs_through_bench_chapters_where_nbval_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo_chapter(tmp_path)
    monkeypatch.setattr(gpu_checks, "ROOT", tmp_path)
    monkeypatch.setattr(gpu_checks, "has_nbval", lambda: False)
    result = gpu_checks.chapter_under_nbval("99_demo", tmp_path / "out", timeout=60)
    assert (result.passed, result.failed, result.ok) == (2, 0, True)
    assert "nbval or ipykernel missing" in result.detail


def test_the_gpu_tests_are_the_modules_that_mark_gpu_or_kernels() -> None:
    names = [path.name for path in gpu_checks.gpu_test_files(gpu_checks.ROOT)]
    assert {"test_kernels.py", "test_cuda_graph.py"} <= set(names)
    assert "test_serve.py" not in names  # FastAPI's tests: not collected on a GPU machine


def test_without_hypothesis_property_tests_skip_and_the_rest_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_SERVER_PACKAGES.replace(
        repr(SERVER_PACKAGES), "('hypothesis',)"))
    tests = tmp_path / "test_demo.py"
    tests.write_text(
        "from hypothesis import given, settings, strategies as st\n"
        "from hypothesis.stateful import RuleBasedStateMachine, rule\n"
        "@st.composite\n"
        "def pairs(draw):\n"
        "    return draw(st.integers()), 1\n"
        "@settings(max_examples=3, deadline=None)\n"
        "@given(x=st.integers(0, 5), pair=pairs())\n"
        "def test_property(x, pair):\n"
        "    assert False\n"
        "class Machine(RuleBasedStateMachine):\n"
        "    @rule()\n"
        "    def step(self):\n"
        "        pass\n"
        "def test_plain():\n"
        "    import hypothesis\n"
        "    assert not hasattr(hypothesis, '__version__')  # the stand-in, not the real one\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    # Hypothesis's own pytest plugin would import it past the blocker (pytest rewrites a
    # plugin's package through its own import hook): on the GPU machine there is no plugin.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = gpu_checks.run_pytest("demo", ["-p", "minillm.bench.hypothesis_stand_in",
                                            str(tests)], tmp_path / "out", timeout=120)
    log = (tmp_path / "out" / "demo.log").read_text()
    assert (result.passed, result.failed, result.skipped) == (1, 0, 1), log


TINY = gpu.ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       tie_word_embeddings=True)


def test_the_engine_parts_run_end_to_end_on_a_tiny_model_on_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same code as on the GPU, less what needs CUDA: the engine's bf16 triton path (torch
    # attention in float32 here) and the CUDA graph step.
    def cpu_llm(max_num_seqs: int, max_model_len: int, cuda_graphs: bool = True,
                **engine_args: object) -> gpu.LLM:
        return gpu.LLM(TINY, device="cpu", max_num_seqs=max_num_seqs,
                       max_model_len=max_model_len, enable_cuda_graphs=cuda_graphs,
                       trace_block_tables=False, max_trace_steps=256, **engine_args)

    workload = gpu.nano_vllm_workload
    monkeypatch.setattr(gpu, "LLAMA_3_2_1B", TINY)
    monkeypatch.setattr(gpu, "DEVICE", "cpu")
    monkeypatch.setattr(gpu, "make_llm", cpu_llm)
    monkeypatch.setattr(gpu, "nano_vllm_workload", lambda num, vocab, seed=0, lengths=None:
                        workload(num, vocab, seed, (4, 24)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(gpu, "free", lambda: None)
    [throughput] = gpu.engine_vs_transformers(num_seqs=6, hf_batch=4)
    assert throughput.unit == "tokens/s" and throughput.value > 0 and throughput.ratio > 0
    assert throughput.target == 3.0 and "padded batches of 4" in throughput.baseline_name
    llm = cpu_llm(2, 256, cuda_graphs=True)  # asked for, and not captured on a CPU
    tpot = gpu.tpot_figure(llm, roofline=1e-3, new_tokens=8)
    assert "without CUDA graphs" in tpot.name and tpot.target is None and tpot.value > 0
    ahead = gpu.tpot_figure(cpu_llm(2, 256, async_scheduling=True), roofline=1e-3, new_tokens=8)
    assert ahead.name.endswith(", async scheduling") and ahead.value > 0


def test_the_prepared_run_times_the_loop_one_step_ahead_against_the_synchronous_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made, parts = [], {}
    monkeypatch.setattr(gpu, "make_llm", lambda max_num_seqs, max_model_len, cuda_graphs=True,
                        **engine_args: made.append((cuda_graphs, engine_args)) or gpu.LLM(
                            TINY, device="cpu", max_model_len=max_model_len, **engine_args))
    monkeypatch.setattr(gpu, "tpot_figure", lambda llm, roofline: gpu.Figure(
        "tpot", 2.0 if llm.config.async_scheduling else 3.0, "ms", "roofline", 1.0, 0.5))
    monkeypatch.setattr(gpu, "graph_figures", lambda llm, roofline: [])
    monkeypatch.setattr(gpu, "engine_vs_transformers", lambda num_seqs, hf_batch: [])
    monkeypatch.setattr(gpu, "free", lambda: None)

    class Run:
        notes: dict = {}

        def part(self, name, fn):
            parts[name] = fn()

    gpu.engine_parts(Run(), argparse.Namespace(num_seqs=1, hf_batch=1), copy_bandwidth=1e12)
    assert made == [(False, {"async_scheduling": False}), (True, {"async_scheduling": False}),
                    (True, {"async_scheduling": True})]
    _, versus_sync = parts["TPOT with CUDA graphs, one step ahead"]
    assert versus_sync.baseline_name == "the synchronous loop"
    assert (versus_sync.value, versus_sync.baseline, versus_sync.ratio) == (2.0, 3.0, 1.5)


def test_bench_tiles_times_every_candidate_with_its_own_tiles(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # `bench tiles` on the CPU with the timing stubbed: a fake kernel "measures" the tiles the
    # launchers would use, so the sweep must really swap them in (and back) for each candidate.
    from minillm.attention import tiles as tile_table
    from minillm.attention import triton_decode, triton_extend
    from minillm.bench import tiles as bench_tiles

    table = tile_table.TILES[(9, 0)]
    monkeypatch.setattr(tile_table, "tiles_for", lambda *_: table)
    originals = triton_extend.tiles_for, triton_decode.tiles_for

    def fake_prefill(shape, tokens, matmul, device):
        t = triton_extend.tiles_for(device, 128, torch.bfloat16).extend
        return [Figure("prefill", t.block_m * t.block_n / t.num_warps, "TFLOP/s", "x", 1.0, 1.0)]

    def fake_decode(shape, batch, context, copy_bw, device):
        t = triton_decode.tiles_for(device, 128, torch.bfloat16).decode
        if t.block_n == 128:
            raise RuntimeError("out of resources")  # a candidate that does not fit is skipped
        return [Figure("decode", t.block_n * t.num_stages, "GB/s", "x", 1.0, 1.0)]

    monkeypatch.setattr(kernels, "prefill_figures", fake_prefill)
    monkeypatch.setattr(kernels, "decode_figures", fake_decode)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(kernel="both", prefill_tokens=64, batch=2, context=64)
    rows = bench_tiles.sweep(args)
    assert (triton_extend.tiles_for, triton_decode.tiles_for) == originals
    prefill = {r[1]: r[2] for r in rows if r[0] == "prefill"}
    decode = {r[1]: r[2] for r in rows if r[0] == "decode"}
    assert len(prefill) == len(bench_tiles.PREFILL)
    assert len(decode) == sum(c.block_n != 128 for c in bench_tiles.DECODE)
    for cand in bench_tiles.PREFILL:
        assert prefill[str(cand)] == cand.block_m * cand.block_n / cand.num_warps
    assert [r[1] for r in rows if r[3]] == [str(table.extend), str(table.decode)]
    out = capsys.readouterr().out
    assert "failed (RuntimeError: out of resources)" in out and "<- the table" in out


def test_bench_tiles_says_it_needs_a_gpu(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture) -> None:
    from minillm.bench import tiles as bench_tiles

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_tiles.main(argparse.Namespace(kernel="both")) == 1
    assert "no CUDA device" in capsys.readouterr().out


def test_the_int8_gemv_figure_measures_the_kernel_against_copy_and_bf16(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure's arithmetic on the CPU (interpreted kernel, a wall clock for CUDA events):
    bytes are the int8 weight, its scales and the bf16 row in and out."""
    import time

    def wall(fn, repeats=1, calls=1):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    monkeypatch.setattr(kernels, "cuda_time", wall)
    bandwidth, versus_bf16 = kernels.int8_gemv_figures(64, 32, 1e10, torch.device("cpu"))
    assert bandwidth.unit == "GB/s" and bandwidth.target == 0.60
    assert bandwidth.ratio == pytest.approx(bandwidth.value * 1e9 / 1e10)
    seconds = (64 * 32 + 4 * 64 + 2 * (32 + 64)) / (bandwidth.value * 1e9)
    assert versus_bf16.value == pytest.approx(seconds * 1e6)
    assert versus_bf16.ratio == pytest.approx(versus_bf16.baseline / versus_bf16.value)


def test_the_prepared_run_times_the_int8_gemv_on_a_llama_3_8b_projection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Chapter 10's "2x from int8 weights" is modelled; the figure that would back it is the
    # int8 GEMV against a bf16 matmul at batch 1 on the 8B's MLP weight, in every `bench gpu`.
    calls = []
    monkeypatch.setattr(kernels, "decode_figures", lambda *a: [figure("decode")])
    monkeypatch.setattr(kernels, "prefill_figures", lambda *a: [figure("prefill")])
    monkeypatch.setattr(kernels, "int8_gemv_figures",
                        lambda n, k, bw, dev: calls.append((n, k, bw)) or [figure("int8")])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(batch=64, context=4096, prefill_tokens=4096)
    names = [f.name for f in kernels.kernel_figures(args, kernels.Baselines(3e12, 1e15),
                                                    torch.device("cpu"))]
    assert names == ["decode", "prefill", "int8"] and calls == [(14336, 4096, 3e12)]
