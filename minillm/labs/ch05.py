"""Graded exercises of chapter 05 (continuous batching), and the hook that plugs a reader's
admission policy into the real engine's scheduler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minillm.calc import machine
from minillm.config import EngineConfig
from minillm.kv_cache import BlockManager
from minillm.labs.exercise import Exercise, expect_callable
from minillm.llm import LLM
from minillm.request import SchedulerOutput
from minillm.sampling import SamplingParams
from minillm.scheduler import Scheduler
from minillm.trace import StepRecord

AdmissionPolicy = Callable[[int, int, int], int]  # (num_running, max_num_seqs, min_free) -> seats


class PolicyScheduler(Scheduler):
    """The engine's continuous scheduler, except that a policy decides how many waiting
    requests may join the batch in each step: policy(num_running, max_num_seqs, min_free).

    It only hides part of the queue from Scheduler._admit, so everything else (token budget,
    chunked prefill, KV blocks, preemption) is the real scheduler's.
    """

    def __init__(self, config: EngineConfig, block_manager: BlockManager,
                 policy: AdmissionPolicy, min_free: int):
        assert config.scheduling == "continuous" and config.enable_chunked_prefill, (
            "an admission policy replaces continuous batching's: use an LLM with the defaults "
            "scheduling='continuous', enable_chunked_prefill=True")
        super().__init__(config, block_manager)
        self.policy, self.min_free = policy, min_free

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        seats = self.policy(len(self.running), self.config.max_num_seqs, self.min_free)
        seats = max(0, min(int(seats), len(self.waiting)))
        hidden = [self.waiting.pop() for _ in range(len(self.waiting) - seats)]  # from the back
        try:
            super()._admit(out, budget)
        finally:
            self.waiting.extend(reversed(hidden))  # back in their queue order


def use_admission_policy(llm: LLM, policy: AdmissionPolicy, min_free: int) -> None:
    """Make llm's engine admit requests by policy from now on (the engine must be idle)."""
    engine = llm.engine
    assert not engine.has_unfinished_requests(), "swap the policy between generate calls"
    engine.scheduler = PolicyScheduler(llm.config, engine.block_manager, policy, min_free)


def _static_steps(output_lens: list[int], batch_size: int) -> int:
    return sum(max(output_lens[i:i + batch_size]) for i in range(0, len(output_lens), batch_size))


def grade_static_batch_steps(static_batch_steps: Any) -> str:
    expect_callable(static_batch_steps, "static_batch_steps(output_lens, batch_size) -> int")
    cases = [([5, 5, 5, 5], 2), ([1, 100, 1, 1], 2), ([3, 9, 2, 7, 4], 2), ([10, 10, 10], 8),
             ([4, 1, 1, 1, 1, 1, 1, 1], 4), ([2, 30, 6, 6, 6, 6, 6, 6, 6, 6, 6], 3), ([7], 1)]
    for lens, b in cases:
        got = static_batch_steps(list(lens), b)
        assert got is not None, "static_batch_steps returned None"
        assert isinstance(got, int) or (isinstance(got, float) and got.is_integer()), (
            f"return a whole number of steps, got {got!r}")
        want = _static_steps(lens, b)
        if got == want:
            continue
        batches = [lens[i:i + b] for i in range(0, len(lens), b)]
        hint = ""
        if got in (-(-sum(lens) // b), sum(lens) / b):
            hint = (" (that is continuous batching's lower bound, total tokens / seats; a static "
                    "batch keeps every seat until its longest member is done)")
        elif got == max(lens) * len(batches):
            hint = (" (each batch runs as long as its own longest member, not the longest of "
                    "the whole workload)")
        elif got == sum(lens):
            hint = " (the members of a batch decode together: one step serves all of them)"
        elif got == _static_steps(sorted(lens), b) or got == _static_steps(sorted(lens)[::-1], b):
            hint = (" (batches are formed in arrival order; sorting by length first is a "
                    "different policy, and it needs the lengths before they are generated)")
        elif len(lens) % b and got == sum(max(batch) for batch in batches[:-1]):
            hint = " (the last, partly filled batch runs too)"
        raise AssertionError(
            f"output_lens {lens}, batch_size {b}: batches {batches} take {want} steps, you "
            f"returned {got!r}{hint}")
    return ("static steps = the sum over batches of their longest output; the engine's static "
            "run in section 2 took exactly that many")


ADMIT_CASES = [(0, 8, 1, 8), (3, 8, 1, 5), (8, 8, 1, 0), (0, 8, 8, 8), (1, 8, 8, 0),
               (7, 8, 8, 0), (4, 8, 4, 4), (5, 8, 4, 0), (6, 16, 4, 10), (2, 16, 4, 14)]


def _check_admit_cases(seats_to_fill: Any) -> None:
    for running, max_seqs, min_free, want in ADMIT_CASES:
        got = seats_to_fill(running, max_seqs, min_free)
        assert got is not None, "seats_to_fill returned None"
        assert isinstance(got, int), f"return a whole number of seats, got {got!r}"
        if got == want:
            continue
        free = max_seqs - running
        hint = ""
        if want == 0 and got == free:
            hint = (" (you fill seats as soon as one frees: that is plain continuous batching; "
                    "wait until at least min_free are free)")
        elif got == max_seqs and running:
            hint = f" (only the free seats can be filled: {max_seqs} - {running} are free)"
        elif got == 0 and free == min_free:
            hint = " (exactly min_free seats are free: that is enough, use >= not >)"
        elif got == min_free and free > min_free:
            hint = " (once you admit, fill every free seat, not just min_free of them)"
        raise AssertionError(
            f"{running} of {max_seqs} seats running, min_free={min_free}: admit {want}, you "
            f"returned {got!r}{hint}")


def _run(llm: LLM, output_lens: list[int]) -> list[StepRecord]:
    """Serve one request per output length (8-token prompts); the new steps of the trace."""
    first = len(llm.trace)
    prompts = [[1 + (7 * i + j) % 50 for j in range(8)] for i in range(len(output_lens))]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in output_lens]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == output_lens, (
        "with your policy some requests did not get all their tokens")
    return llm.trace[first:]


def _batch_sizes(trace: list[StepRecord]) -> list[int]:
    return [len(rec.scheduled) for rec in trace]


def grade_seats_to_fill(seats_to_fill: Any) -> str:
    expect_callable(seats_to_fill,
                    "seats_to_fill(num_running, max_num_seqs, min_free) -> int")
    _check_admit_cases(seats_to_fill)
    threads = torch.get_num_threads()
    machine.settle_threads()  # 2 threads on 2 busy cores stall: see its docstring
    try:
        return _grade_in_engine(seats_to_fill)
    finally:
        torch.set_num_threads(threads)


def _grade_in_engine(seats_to_fill: AdmissionPolicy) -> str:
    lens, seats = [3, 12, 2, 2, 5, 2, 9, 3, 2, 4, 6, 2], 4
    # An explicit pool: on a GPU, an LLM sized from free memory would find none left.
    llm = LLM(max_num_seqs=seats, num_kv_blocks=64)  # continuous until its scheduler is swapped
    static = LLM(max_num_seqs=seats, num_kv_blocks=64, scheduling="static")
    builtin = {"continuous": _batch_sizes(_run(llm, lens)),
               "static": _batch_sizes(_run(static, lens))}
    for min_free, twin in ((1, "continuous"), (seats, "static")):
        use_admission_policy(llm, seats_to_fill, min_free)
        mine = _batch_sizes(_run(llm, lens))
        assert mine == builtin[twin], (
            f"in the engine, your policy with min_free={min_free} should batch exactly as "
            f"scheduling={twin!r} does ({len(builtin[twin])} steps of sizes {builtin[twin]}), "
            f"but it ran {len(mine)} steps of sizes {mine}")
    return (f"in the real engine, min_free=1 is continuous batching ({len(builtin['continuous'])}"
            f" steps) and min_free={seats} is static batching ({len(builtin['static'])} steps)")


EXERCISES = [
    Exercise("05.1", "Steps of static batching",
             "Write static_batch_steps(output_lens, batch_size) -> the number of engine steps "
             "static batching takes to serve requests with these output lengths, batched in "
             "arrival order.", grade_static_batch_steps),
    Exercise("05.2", "An admission policy from static to continuous",
             "Write seats_to_fill(num_running, max_num_seqs, min_free) -> how many waiting "
             "requests join the batch this step: every free seat once at least min_free are "
             "free, else none.", grade_seats_to_fill),
]
