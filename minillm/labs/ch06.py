"""Graded exercises of chapter 06 (chunked prefill).

06.1 is checked against the engine's own Scheduler: the expected chunks are what it schedules
for a long prompt that arrives while num_decodes requests are decoding (run on the simulator's
virtual clock, so no model is needed). 06.3 plugs the reader's per-step token budget into that
Scheduler (BudgetScheduler) and serves a workload with it on the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from minillm.calc import models
from minillm.calc.roofline import get_hardware, prefill_crossover
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.labs.exercise import Exercise, close, expect_callable
from minillm.request import SchedulerOutput
from minillm.scheduler import Scheduler
from minillm.sim.simulator import Simulator, resolve_config, simulate
from minillm.workloads.streams import Mixture, RequestSpec, poisson

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



# 06.3: a per-step token budget, plugged into the real scheduler on the simulator's clock.

StepBudget = Callable[[int, int, int], int]  # (num_decodes, step_cap, max_budget) -> tokens


class BudgetScheduler(Scheduler):
    """The engine's chunked-prefill scheduler, except that a policy sets each step's token
    budget: policy(num_decodes, step_cap, max_budget), num_decodes the running requests past
    their prompt. Everything else (decodes first, chunks, admission, KV blocks) is Scheduler's.
    """

    def __init__(self, config: EngineConfig, block_manager: BlockManager, policy: StepBudget,
                 step_cap: int):
        assert config.scheduling == "continuous" and config.enable_chunked_prefill
        super().__init__(config, block_manager)
        self.policy, self.step_cap = policy, step_cap

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        num_decodes = sum(not req.is_prefill for req in self.running)
        max_budget = self.config.max_num_batched_tokens
        budget = self.policy(num_decodes, self.step_cap, max_budget)
        assert isinstance(budget, int) and not isinstance(budget, bool), (
            f"return the step's budget as an int, got {budget!r:.80}")
        assert 1 <= budget <= max_budget, (
            f"{num_decodes} decodes, step_cap={self.step_cap}, max_budget={max_budget}: a budget "
            f"must be between 1 and max_budget, you returned {budget}")
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._admit(out, budget)
        return out


def reference_step_budget(num_decodes: int, step_cap: int, max_budget: int) -> int:
    if num_decodes == 0:
        return max_budget
    return min(max_budget, max(step_cap, num_decodes + 1))


BUDGET_CASES = [(0, 318, 8192), (32, 318, 8192), (1, 318, 8192), (8, 128, 2048), (0, 128, 2048),
                (317, 318, 8192), (318, 318, 8192), (400, 318, 8192), (16, 512, 256),
                (0, 512, 256), (300, 512, 256)]


def budget_hint(got: Any, num_decodes: int, step_cap: int, max_budget: int) -> str:
    """Name the usual mistake behind a wrong budget, or ''."""
    if num_decodes == 0 and got == min(step_cap, max_budget):
        return (" (no request is decoding, so nobody waits on this step: give the prompts the "
                "whole max_budget and their first token comes sooner)")
    if num_decodes and got == max_budget and max_budget > max(step_cap, num_decodes + 1):
        return (" (while requests decode, every token past step_cap makes their next token "
                "later: cap the step)")
    if num_decodes and got == step_cap - num_decodes:
        return (" (the budget is the whole step, the decodes' tokens included: the step may "
                "hold step_cap tokens)")
    if num_decodes >= step_cap and got == min(step_cap, max_budget):
        return (" (with num_decodes >= step_cap a budget of step_cap cannot even hold the "
                "decodes: leave a token for each decode and one for the prompts)")
    if got == max(step_cap, num_decodes + 1) and got > max_budget:
        return " (never more than max_budget, the engine's max_num_batched_tokens)"
    return ""


def grade_step_budget(step_budget: Any) -> str:
    expect_callable(step_budget, "step_budget(num_decodes, step_cap, max_budget) -> tokens")
    for num_decodes, step_cap, max_budget in BUDGET_CASES:
        got = step_budget(num_decodes, step_cap, max_budget)
        assert got is not None, "step_budget returned None"
        want = reference_step_budget(num_decodes, step_cap, max_budget)
        assert got == want, (
            f"{num_decodes} requests decoding, step_cap={step_cap}, max_budget={max_budget}: the "
            f"budget is {want}, you returned {got!r:.80}"
            f"{budget_hint(got, num_decodes, step_cap, max_budget)}")
    return _grade_in_simulator(step_budget)


def _serve(policy: StepBudget | None, budget: int) -> tuple[float, float, list[int]]:
    """Serve BUDGET_WORKLOAD on Llama-3-8B / H100-SXM with the real scheduler, a fixed budget
    or policy's per step (step_cap: the prefill crossover). Returns (worst ITL s, mean TTFT s
    of the long prompts, tokens of each step)."""
    model, hw = models.get("llama-3-8b"), get_hardware("H100-SXM")
    config = resolve_config(model, hw, 2, 0.9, dict(max_num_batched_tokens=budget,
                                                    enable_chunked_prefill=True))
    sim = Simulator(model, hw, config, record_block_tables=False)
    if policy is not None:
        sim.scheduler = BudgetScheduler(config, sim.block_manager, policy,
                                        prefill_crossover(model, hw))
    requests = sim.run(BUDGET_WORKLOAD)
    worst_itl = max(gap for r in requests for gap in r.metrics.itl)
    long_ttft = [r.metrics.ttft for r in requests if len(r.prompt_token_ids) > 2048]
    return worst_itl, sum(long_ttft) / len(long_ttft), [rec.num_tokens for rec in sim.trace]


BUDGET_WORKLOAD = poisson(60, 10.0, Mixture([(0.85, (128, 512)), (0.15, (4000, 7000))]),
                          (64, 256), seed=1)


def _grade_in_simulator(step_budget: StepBudget) -> str:
    mine = _serve(step_budget, 8192)
    reference = _serve(reference_step_budget, 8192)
    assert mine[2] == reference[2], (
        "in the simulator your policy scheduled different steps from the reference: "
        f"{len(mine[2])} steps, against {len(reference[2])}")
    fixed = {budget: _serve(None, budget) for budget in (512, 8192)}
    ms = 1e3
    return (f"in the real scheduler (Llama-3-8B on H100-SXM, modelled), your per-step budget "
            f"gave a worst ITL of {mine[0] * ms:.1f} ms and a long-prompt TTFT of "
            f"{mine[1] * ms:.0f} ms; a fixed budget of 512: {fixed[512][0] * ms:.1f} ms and "
            f"{fixed[512][1] * ms:.0f} ms; of 8192: {fixed[8192][0] * ms:.1f} ms and "
            f"{fixed[8192][1] * ms:.0f} ms")


EXERCISES = [
    Exercise("06.1", "Chunk a prompt under the token budget",
             "Write chunk_schedule(prompt_len, budget, num_decodes) -> the prefill chunk sizes, "
             "one per step, of a prompt arriving while num_decodes requests decode (budget > "
             "num_decodes).", grade_chunk_schedule),
    Exercise("06.2", "TTFT of a chunked prompt",
             "Write prefill_ttft(prompt_len, budget, num_decodes, step_time) -> seconds to the "
             "first token when a step of n tokens costs step_time(n) seconds.",
             grade_prefill_ttft),
    Exercise("06.3", "A per-step budget that rides free",
             "Write step_budget(num_decodes, step_cap, max_budget) -> this step's token budget: "
             "max_budget when nobody is decoding, else step_cap (never less than the decodes "
             "plus one token, never more than max_budget).", grade_step_budget),
]
