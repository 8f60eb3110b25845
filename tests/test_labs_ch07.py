"""Chapter 07's graded exercises accept the reference and name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.calc.roofline import decode_step_time
from minillm.calc.sizing import max_concurrency
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
    assert [r.metrics.token_times for r in recorded_stream(60, 0)] == \
        [r.metrics.token_times for r in records], "a seed gives the grader the same stream"
    assert [r.output_len for r in recorded_stream(60, 1)] != [r.output_len for r in records]


@pytest.mark.ch07
def test_run_duration_ignores_a_failed_request_that_ends_last() -> None:
    """The duration runs from the first arrival (failed requests included: they were sent) to
    the last completed request's finish; a failure that drags on must not stretch it."""
    from minillm.labs.ch07 import make_record
    from minillm.metrics import RequestMetrics

    def rec(arrival: float, times: list[float], error: str | None = None):
        m = RequestMetrics(arrival_time=arrival)
        m.token_times = times
        return make_record(16, len(times), m, error)

    records = [rec(1.0, [1.2, 2.0]), rec(0.5, [0.9, 5.0], "the stream broke"),
               rec(1.5, [1.7, 3.0])]
    assert run_duration(records) == pytest.approx(3.0 - 0.5)


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
def test_every_open_ended_exercise_of_the_chapter_has_a_model_answer() -> None:
    """The chapter's own list of open-ended exercises, read from the notebook, is the list of
    model answers: adding an exercise without one (or renumbering) breaks this."""
    import json
    import re
    from pathlib import Path

    notebook = Path(__file__).parent.parent / "chapters" / "07_measuring_serving.ipynb"
    text = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                   if c["cell_type"] == "markdown")
    assert sorted(re.findall(r"\*\*(07\.\d+) \(open-ended\)\.\*\*", text)) == sorted(MODEL_ANSWERS)


@pytest.mark.ch07
def test_the_model_answer_to_07_4_holds_on_the_simulator() -> None:
    """07.4's model answer says the open loop's p99 TTFT grows with the run's length past
    capacity (the n-th request waits about n (1/c - 1/r)), faster at 3x than at 1.5x, while a
    closed loop's stays put. Check it on the modelled H100 with the chapter's workload."""
    from minillm.sim.simulator import simulate
    from minillm.workloads.streams import Mixture, closed_loop, poisson

    prompts, outputs = Mixture([(0.9, (16, 64)), (0.1, (384, 512))]), (16, 48)
    gpu = dict(model="llama-3-8b", hw="H100-SXM", max_num_seqs=64, record_block_tables=False)
    cap = simulate(workload=closed_loop(256, 64, prompts, outputs, seed=1),
                   **gpu).summary().request_throughput

    def p99(workload) -> float:
        return simulate(workload=workload, **gpu).summary().ttft.p99

    open_loop = {(f, n): p99(poisson(n, f * cap, prompts, outputs, seed=2))
                 for f in (1.5, 3.0) for n in (256, 1024)}
    closed = {n: p99(closed_loop(n, 64, prompts, outputs, seed=2)) for n in (256, 1024)}
    for f in (1.5, 3.0):
        assert open_loop[f, 1024] > 2.5 * open_loop[f, 256], "the queue grows with the run"
    assert open_loop[3.0, 1024] > 1.5 * open_loop[1.5, 1024], "faster the further past capacity"
    assert closed[1024] < 1.5 * closed[256], "the closed loop's tail does not grow"
