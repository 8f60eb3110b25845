"""Chapter 07's graded exercises accept the reference and name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check
from minillm.labs.ch07 import (
    CAPACITY_CASES,
    SIZING_CASES,
    is_good,
    recorded_stream,
    reference_capacity,
    reference_max_num_seqs,
    run_duration,
    sweep_of_records,
    tpot_of,
)
from minillm.labs.solutions.ch07 import MODEL_ANSWERS, SOLUTIONS, goodput
from minillm.roofline import decode_step_time
from minillm.sizing import max_concurrency


@pytest.mark.ch07
@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_reference_solutions_pass(exercise: str) -> None:
    assert check(exercise, SOLUTIONS[exercise]) is True


@pytest.mark.ch07
def test_recorded_stream_has_chunks_that_are_not_tokens() -> None:
    """The grader's records are what makes 07.1 a real exercise: several tokens per chunk, some
    failures, and one-token replies (TPOT 0, as vLLM counts them)."""
    records = recorded_stream(60, 0)
    done = [r for r in records if r.error is None]
    assert any(len(r.metrics.token_times) < r.output_len for r in done)
    assert 0 < len(records) - len(done) < 10
    assert any(r.output_len == 1 and tpot_of(r) == 0.0 for r in done)
    assert all(r.metrics.finished_time is not None for r in records), \
        "as the client writes them, failed records have chunk times too"
    assert all(r.metrics.tpot == tpot_of(r) or r.output_len == 1 for r in done), \
        "the records carry usage's token count, so RequestMetrics.tpot is vLLM's TPOT"
    assert run_duration(records) > 0


@pytest.mark.ch07
def test_capacity_cases_exercise_each_rule() -> None:
    """Among the cases: a lucky run past the first miss, a sweep where failures decide, and one
    where no rate meets the target."""
    slo = {"ttft": 0.5, "tpot": 0.025}
    answers = [reference_capacity(sweep_of_records(s, rates, c, lucky), slo, a)
               for s, rates, c, a, lucky in CAPACITY_CASES]
    assert None in answers and len(set(answers)) >= 4
    seed, rates, c, a, lucky = CAPACITY_CASES[1]
    runs = sweep_of_records(seed, rates, c, lucky)
    assert sum(is_good(r, slo) for r in runs[lucky]) >= a * len(runs[lucky]) > \
        sum(is_good(r, slo) for r in runs[5])


@pytest.mark.ch07
def test_sizing_cases_bind_on_either_limit() -> None:
    walls = [max_concurrency(m, hw, s, 0.9) for m, hw, s, _ in SIZING_CASES]
    answers = [reference_max_num_seqs(*case) for case in SIZING_CASES]
    assert any(a == w > 0 for a, w in zip(answers, walls)), "the KV wall binds somewhere"
    assert any(0 < a < w for a, w in zip(answers, walls)), "the TPOT target binds somewhere"
    assert 0 in walls, "and the weights alone fill a GPU"


def chunk_tpot_goodput(records, slo, duration):
    good = 0
    for r in records:
        if r.error is None:
            n = len(r.metrics.token_times)  # chunks, not tokens
            v = {"ttft": r.metrics.ttft, "e2e": r.metrics.e2e,
                 "tpot": (r.metrics.e2e - r.metrics.ttft) / (n - 1) if n > 1 else 0.0}
            good += all(v[k] <= b for k, b in slo.items())
    return good / duration


def strict_goodput(records, slo, duration):
    good = 0
    for r in records:
        if r.error is None:
            v = {"ttft": r.metrics.ttft, "tpot": tpot_of(r), "e2e": r.metrics.e2e}
            good += all(v[k] < b for k, b in slo.items())
    return good / duration


@pytest.mark.ch07
@pytest.mark.parametrize("wrong, hint", [
    (chunk_tpot_goodput, "not the number of chunks"),
    (lambda records, slo, d: goodput(records, slo, d) * d / len(records), "is a rate"),
    (lambda records, slo, d: sum(r.error is None for r in records) / d, "meet every bound"),
    (lambda records, slo, d: sum(all(
        {"ttft": r.metrics.ttft, "tpot": tpot_of(r), "e2e": r.metrics.e2e}[k] <= b
        for k, b in slo.items()) for r in records) / d, "a failed request never counts"),
    (strict_goodput, "compare with <="),
])
def test_goodput_wrong_answers_are_named(wrong, hint: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert check("07.1", wrong) is False
    assert hint in capsys.readouterr().out


def most_good(runs, slo, attainment):
    return max(sorted(runs), key=lambda rate: goodput(runs[rate], slo, 1.0) / len(runs[rate]))


def any_passing(runs, slo, attainment):
    ok = [rate for rate in runs if goodput(runs[rate], slo, 1.0) >= attainment * len(runs[rate])]
    return max(ok, default=None)


def ignores_failures(runs, slo, attainment):
    best = None
    for rate in sorted(runs):
        done = [r for r in runs[rate] if r.error is None]
        if goodput(done, slo, 1.0) < attainment * len(done):
            break
        best = rate
    return best


@pytest.mark.ch07
@pytest.mark.parametrize("wrong, hint", [
    (most_good, "the most requests met the SLO"),
    (any_passing, "does not count"),
    (ignores_failures, "divide by all the requests"),
])
def test_capacity_wrong_answers_are_named(wrong, hint: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert check("07.2", wrong) is False
    assert hint in capsys.readouterr().out


def by_slo_only(model, hw, s, tpot):
    best = 0
    for b in range(1, 4097):
        if decode_step_time(model, hw, b, s).time > tpot:
            break
        best = b
    return best


@pytest.mark.ch07
@pytest.mark.parametrize("wrong, hint", [
    (lambda model, hw, s, tpot: max_concurrency(model, hw, s, 0.9), "the KV wall alone"),
    (by_slo_only, "take the smaller of the two"),
    (lambda model, hw, s, tpot: min(max_concurrency(model, hw, s),
                                    by_slo_only(model, hw, s, tpot)), "headroom"),
])
def test_sizing_wrong_answers_are_named(wrong, hint: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert check("07.3", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch07
def test_open_ended_exercises_have_model_answers() -> None:
    assert sorted(MODEL_ANSWERS) == ["07.4", "07.5"]
    assert all("Rubric" in answer for answer in MODEL_ANSWERS.values())
