"""Graded exercises of chapter 02 (the roofline).

02.2's bound becomes the simulator's clock: for one run, the simulator's roofline.step_time is
swapped for one that prices each step with the reader's function, so the real Scheduler and
BlockManager serve a workload on the reader's timing. 02.3's byte count is checked against every
step of a real engine run with chunked prefill (prefill chunks, decodes and mixed steps).
"""

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
    mine, ref, steps = _simulated_with(roofline_time)
    for (rid, ttft, tpot), (_, want_ttft, want_tpot) in zip(mine, ref):
        assert close(ttft, want_ttft, 1e-9) and close(tpot, want_tpot, 1e-9), (
            f"in the simulator with your roofline_time as its clock, request {rid} got TTFT "
            f"{ttft * 1e3:.4g} ms and TPOT {tpot * 1e3:.4g} ms; minillm's roofline gives "
            f"{want_ttft * 1e3:.4g} ms and {want_tpot * 1e3:.4g} ms")
    ttfts, tpots = sorted(t for _, t, _ in mine), sorted(t for _, _, t in mine)
    return (f"time >= max(FLOPs / peak, bytes / bandwidth); as the simulator's clock it priced "
            f"{steps} steps of Llama-3-8B on an H100 (prefill chunks and decodes) and the "
            f"{len(mine)} requests' TTFT and TPOT match minillm's: TTFT p50 "
            f"{ttfts[len(ttfts) // 2] * 1e3:.1f} ms, "
            f"TPOT p50 {tpots[len(tpots) // 2] * 1e3:.2f} ms")


def _simulated_with(roofline_time: Any) -> tuple[list[tuple[str, float, float]],
                                                 list[tuple[str, float, float]], int]:
    """(request id, TTFT, TPOT) of a small Llama-3-8B workload simulated on an H100 with each
    step priced by roofline_time, the same with minillm's step_time, and the number of steps."""
    from minillm.calc import roofline
    from minillm.sim import simulator
    from minillm.workloads import streams as wl

    def priced(model: Any, hw: Any, entries: Any, dtype_bytes: float = 2, *overheads: float,
               **named: float) -> roofline.StepCost:
        ref = roofline.step_time(model, hw, entries, dtype_bytes, *overheads, **named)
        seconds = roofline_time(ref.flops, ref.bytes, hw.flops, hw.bandwidth)
        assert isinstance(seconds, (int, float)), f"return seconds as a number, got {seconds!r}"
        return roofline.StepCost(ref.flops, ref.bytes, ref.compute_time, ref.memory_time,
                                 ref.overhead, seconds + ref.overhead)

    work = wl.poisson(16, 40.0, prompt_len=(50, 900), output_len=(4, 40), seed=2)

    def run(step_time: Any) -> tuple[list[tuple[str, float, float]], int]:
        result = simulator.simulate("llama-3-8b", "H100-SXM", work, max_num_batched_tokens=512,
                                    max_num_seqs=8, record_block_tables=False,
                                    step_time=step_time)
        return ([(o.request_id, o.metrics.ttft, o.metrics.tpot) for o in result.outputs],
                len(result.trace))

    mine, _ = run(priced)
    ref, steps = run(roofline.step_time)
    return mine, ref, steps


def _byte_cases() -> list[tuple[Any, list[tuple[int, int]], int]]:
    """(config, entries, dtype_bytes): a decode, a decode batch, a prefill, a chunk over a cached
    prefix, and a mixed step, on the shipped model's shape and SmolLM2-135M's (both tied)."""
    from minillm.calc import models
    from minillm.llm import default_model_path
    from minillm.model_config import ModelConfig

    tiny, small = ModelConfig.from_pretrained(default_model_path()), models.get("smollm2-135m")
    return [(small, [(1, 9)], 4), (small, [(1, 100)] * 8, 2), (small, [(64, 64)], 4),
            (tiny, [(32, 96)], 4), (tiny, [(1, 40), (1, 7), (20, 20), (16, 48)], 2)]


def _kv_per_token(config: Any) -> int:
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim


def _step_bytes_hint(got: Any, config: Any, entries: list[tuple[int, int]], b: float) -> str:
    """Name the slip that turns the right count into got, if it is a common one."""
    W, kv, B = config.num_params, _kv_per_token(config), len(entries)
    ctx, new = sum(c for _, c in entries), sum(n for n, _ in entries)
    H, K = config.num_attention_heads, config.num_key_value_heads
    slips = [
        ((W * B + kv * (ctx + new)) * b,
         "the weights are read once per step and shared by the whole batch, not once per request"),
        ((W * (new) + kv * (ctx + new)) * b,
         "the weights are read once per step, not once per new token"),
        ((W + kv * ctx) * b, "also count the K and V the step writes for its new tokens"),
        ((W + kv * new) * b, "each request also reads its K and V over its whole context"),
        (W * b, "count the KV cache too: each request reads its context's K and V and writes its "
                "new tokens'"),
        ((W + kv * (ctx + new) / 2) * b,
         "K and V are two tensors: 2 * L * H_kv * D numbers a token"),
        ((W + kv * H / K * (ctx + new)) * b,
         "K and V are stored per KV head (num_key_value_heads), not per query head"),
        (W * b + kv * (ctx + new), "KV numbers take dtype_bytes bytes each too"),
        (W + kv * (ctx + new) * b, "weights take dtype_bytes bytes each too"),
    ]
    return next((f" ({hint})" for wrong, hint in slips
                 if isinstance(got, (int, float)) and close(got, wrong)), "")


def _engine_step_entries() -> tuple[Any, int, list[list[tuple[int, int]]]]:
    """The shipped model's config, its bytes per number, and the (new tokens, context after)
    entries of every step of a real run with chunked prefill and a small token budget."""
    import torch

    from minillm.calc import machine
    from minillm.llm import LLM
    from minillm.sampling import SamplingParams

    threads = torch.get_num_threads()
    machine.settle_threads()  # 2 threads on 2 busy cores stall: see its docstring
    try:
        llm = LLM(num_kv_blocks=64, max_num_batched_tokens=48, max_num_seqs=4)
        prompts = [[1 + (5 * i + j) % 97 for j in range(n)]
                   for i, n in enumerate([70, 20, 5, 40])]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                  for n in (6, 9, 4, 7)]
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        torch.set_num_threads(threads)
    steps = [[(e.num_tokens, e.num_computed_tokens + e.num_tokens) for e in rec.scheduled]
             for rec in llm.trace]
    return llm.model.config, next(llm.model.parameters()).element_size(), steps


def grade_step_bytes(step_bytes: Any) -> str:
    from minillm.calc.roofline import step_flops_bytes

    expect_callable(step_bytes, "step_bytes(config, entries, dtype_bytes) -> bytes")
    for config, entries, b in _byte_cases():
        got = step_bytes(config, list(entries), b)
        assert got is not None, "step_bytes returned None"
        assert isinstance(got, (int, float)), f"return the bytes as a number, got {got!r}"
        want = step_flops_bytes(config, entries, b)[1]
        assert close(got, want), (
            f"a step of entries {entries} (new tokens, context) on a model of "
            f"{config.num_params:,} parameters, L={config.num_hidden_layers}, "
            f"H_kv={config.num_key_value_heads}, D={config.head_dim}, {b} bytes a number moves "
            f"{want:,.0f} bytes, you returned {got!r}{_step_bytes_hint(got, config, entries, b)}")
    config, b, steps = _engine_step_entries()
    for i, entries in enumerate(steps):
        got, want = step_bytes(config, list(entries), b), step_flops_bytes(config, entries, b)[1]
        assert close(got, want), (
            f"step {i} of a real engine run scheduled {entries} (new tokens, context after the "
            f"step); it moves {want:,.0f} bytes, you returned {got!r}"
            f"{_step_bytes_hint(got, config, entries, b)}")
    return (f"your bytes match all {len(steps)} steps of a real engine run (prefill chunks, "
            "decodes and steps mixing both): the weights once per step, plus each request's K/V "
            "read and written; only the KV term grows with the batch")


EXERCISES = [
    Exercise("02.1", "The ridge point from a datasheet",
             "Write datasheet_ridge(peak_tflops, bandwidth_gbs) -> FLOPs per byte at which the "
             "roofline bends, from datasheet units (TFLOP/s and GB/s).",
             grade_datasheet_ridge),
    Exercise("02.2", "The roofline's lower bound on a step's time",
             "Write roofline_time(flops, bytes_moved, peak_flops, bandwidth) -> the least "
             "seconds a step can take on that device; then it is the simulator's clock.",
             grade_roofline_time),
    Exercise("02.3", "The bytes a real step moves",
             "Write step_bytes(config, entries, dtype_bytes) -> bytes one step moves: the "
             "weights once, plus each request's K and V read over its context and written for "
             "its new tokens.", grade_step_bytes),
]
