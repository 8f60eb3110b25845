"""Chapter 06's graded exercises name the common wrong answers."""

from __future__ import annotations

import math

import pytest

from minillm.calc import models
from minillm.calc.roofline import get_hardware, prefill_crossover
from minillm.labs import check
from minillm.labs.ch06 import BUDGET_WORKLOAD, CHUNK_CASES, BudgetScheduler, scheduler_chunks
from minillm.labs.solutions.ch06 import MODEL_ANSWERS, chunk_schedule, step_budget
from minillm.sim.simulator import Simulator, resolve_config
from minillm.workloads.streams import RequestSpec


def ignores_decodes(p: int, b: int, d: int) -> list[int]:
    return chunk_schedule(p, b, 0)


def decodes_only_in_first_step(p: int, b: int, d: int) -> list[int]:
    first = min(p, b - d)
    return [first] + chunk_schedule(p - first, b, 0)


def full_last_chunk(p: int, b: int, d: int) -> list[int]:
    return [b - d] * math.ceil(p / (b - d))


@pytest.mark.ch06
@pytest.mark.parametrize("prompt_len, budget, num_decodes", CHUNK_CASES)
def test_scheduler_chunks_match_the_formula(prompt_len: int, budget: int,
                                            num_decodes: int) -> None:
    """The grader's reference (the real scheduler, simulated) is budget - decodes per step."""
    assert scheduler_chunks(prompt_len, budget, num_decodes) == chunk_schedule(
        prompt_len, budget, num_decodes)


@pytest.mark.ch06
@pytest.mark.parametrize("wrong, hint", [
    (ignores_decodes, "each running decode takes one token"),
    (decodes_only_in_first_step, "in every step"),
    (full_last_chunk, "the last chunk is only what is left"),
    (lambda p, b, d: math.ceil(p / (b - d)), "number of steps"),
])
def test_chunk_schedule_wrong_answers_are_named(wrong, hint: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert check("06.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch06
@pytest.mark.parametrize("wrong, hint", [
    (lambda p, b, d, t: sum(t(c) for c in chunk_schedule(p, b, d)), "decode tokens"),
    (lambda p, b, d, t: t(p + d), "one step per chunk"),
    (lambda p, b, d, t: len(chunk_schedule(p, b, d)) * t(b), "the last chunk is smaller"),
])
def test_prefill_ttft_wrong_answers_are_named(wrong, hint: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert check("06.2", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch06
@pytest.mark.parametrize("wrong, hint", [
    (lambda d, cap, most: min(cap, most), "nobody waits on this step"),
    (lambda d, cap, most: most, "cap the step"),
    (lambda d, cap, most: most if d == 0 else min(most, cap - d), "the decodes' tokens included"),
    (lambda d, cap, most: most if d == 0 else min(most, cap), "cannot even hold the decodes"),
    (lambda d, cap, most: most if d == 0 else max(cap, d + 1), "never more than max_budget"),
])
def test_step_budget_wrong_answers_are_named(wrong, hint: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert check("06.3", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch06
def test_a_step_budget_runs_in_the_real_scheduler() -> None:
    """The reference policy serves every request, and no step that carries a decode holds more
    than the crossover (unless the decodes alone do), while a prompt alone takes the budget."""
    model, hw = models.get("llama-3-8b"), get_hardware("H100-SXM")
    cap = prefill_crossover(model, hw)
    config = resolve_config(model, hw, 2, 0.9, dict(max_num_batched_tokens=8192))
    sim = Simulator(model, hw, config, record_block_tables=False)
    sim.scheduler = BudgetScheduler(config, sim.block_manager, step_budget, cap)
    requests = sim.run(BUDGET_WORKLOAD)
    assert all(r.is_finished for r in requests)
    for rec in sim.trace:
        decodes = sum(e.phase == "decode" for e in rec.scheduled)
        assert rec.num_tokens <= (max(cap, decodes + 1) if decodes else 8192)
    alone = Simulator(model, hw, config, record_block_tables=False)
    alone.scheduler = BudgetScheduler(config, alone.block_manager, step_budget, cap)
    alone.run([RequestSpec(0.0, 5000, 4)])
    assert alone.trace[0].num_tokens == 5000, "a prompt alone goes in one step: nobody waits"


@pytest.mark.ch06
def test_open_ended_exercises_have_model_answers() -> None:
    assert sorted(MODEL_ANSWERS) == ["06.4", "06.5"]
    assert all("Rubric" in answer for answer in MODEL_ANSWERS.values())
