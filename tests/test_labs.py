"""minillm.labs: every graded exercise passes with its reference solution and fails, with a
reader-facing message and no traceback, with an unfilled stub or a common wrong answer.

The tests that need the reference solutions skip in a student handout, where an instructor has
removed minillm/labs/solutions (python -m minillm.labs strip-solutions): the rest still run."""

from __future__ import annotations

import json

import pytest

from minillm.labs import EXERCISES, check
from minillm.labs.__main__ import main

try:
    from minillm.labs.solutions import SOLUTIONS
except ModuleNotFoundError:  # a handout without the solutions
    SOLUTIONS = {}
needs_solutions = pytest.mark.skipif(not SOLUTIONS, reason="this copy has no reference solutions")


def raises_not_implemented(*args: object, **kwargs: object) -> object:
    raise NotImplementedError


def returns_none(*args: object, **kwargs: object) -> object:
    return None


def per_exercise(ids: list[str]) -> list:
    """One param per exercise id, marked with its chapter (pytest -m ch00 selects 00.x)."""
    return [pytest.param(i, id=i, marks=getattr(pytest.mark, EXERCISES[i].chapter)) for i in ids]


ALL = per_exercise(sorted(EXERCISES))


@needs_solutions
def test_every_exercise_has_a_solution() -> None:
    assert sorted(SOLUTIONS) == sorted(EXERCISES)


@needs_solutions
@pytest.mark.parametrize("exercise_id", ALL)
def test_reference_solution_passes(exercise_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(exercise_id, SOLUTIONS[exercise_id]) is True
    assert capsys.readouterr().out.startswith(f"PASS  {exercise_id}")


@pytest.mark.parametrize("stub", [raises_not_implemented, returns_none, 42],
                         ids=["raises", "none", "not-callable"])
@pytest.mark.parametrize("exercise_id", ALL)
def test_unfilled_stub_fails(exercise_id: str, stub: object,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert check(exercise_id, stub) is False
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL  {exercise_id}") and "Traceback" not in out


def test_errors_in_the_answer_are_reported_not_raised(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert check("00.2", lambda n, p: n / 0) is False
    out = capsys.readouterr().out
    assert "ZeroDivisionError" in out and "line" in out and "Traceback" not in out


def test_unknown_exercise_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("99.9", lambda metrics: None) is False
    assert "00.1" in capsys.readouterr().out


def test_lab_runner_rejects_a_bad_chapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["00"]) == 2
    assert "usage" in capsys.readouterr().out


def test_a_verdict_is_recorded_where_the_grader_asks(tmp_path, monkeypatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("MINILLM_LABS_RESULTS", str(results))
    assert check("00.2", lambda n, p: -(-n // p)) is True
    assert check("00.2", lambda n, p: n // p) is False
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["id"], r["passed"]) for r in lines] == [("00.2", True), ("00.2", False)]
    assert "round up" in lines[1]["message"]
    capsys.readouterr()


@pytest.mark.parametrize("argv", [["grade"], ["answers"], ["answers", "chXY"],
                                  ["strip-solutions"], ["frobnicate", "x"]])
def test_every_command_prints_usage_on_bad_arguments(argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage" in capsys.readouterr().out
