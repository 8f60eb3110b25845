"""Each student's own capstone brief (minillm.capstone.student_scenario): the same name always
gets the same brief, names spread over every family, model, GPU and rate, each brief leaves a
passing deployment (the recipe's), and a bad name is refused with what to pass instead."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from minillm.calc.models import as_config
from minillm.labs.__main__ import main
from minillm.labs.ch11 import REPORT_TOLERANCE
from minillm.plan.capstone import FAMILIES, SCENARIOS, evaluate, reference, student_scenario

pytestmark = pytest.mark.ch11

NAMES = [f"student {i}" for i in range(200)]


def option_of(scenario) -> tuple[str, str, int]:
    return scenario.model, scenario.hardware.name, scenario.gpus


def test_the_same_name_always_gets_the_same_brief() -> None:
    first, again = student_scenario("Ada Lovelace"), student_scenario("Ada Lovelace")
    assert first == again and list(first.workload()) == list(again.workload())
    # Case and spacing are one name (a roll may spell it "ada  lovelace"); the brief is the same.
    variant = student_scenario("  ada  LOVELACE ")
    assert dataclasses.replace(variant, name=first.name) == first
    assert student_scenario("Grace Hopper") != first


def test_briefs_spread_over_every_family_option_and_rate() -> None:
    briefs = [student_scenario(name) for name in NAMES]
    options = {option for family in FAMILIES for option in family.options}
    assert {option_of(b) for b in briefs} == options, "200 names draw every (model, GPU, budget)"
    assert len({b.hardware.dollars_per_hour for b in briefs}) > 50, "prices are quotes, not one"
    assert len({b.seed for b in briefs}) == len(briefs), "each student's traffic is their own"
    # Hardly two of 200 students share a brief a copied answer could pass on: the same model,
    # GPU and budget with a rate and a price both within the grader's REPORT_TOLERANCE (and even
    # then their traffic, drawn from their own seeds, differs).
    twins = [(a.name, b.name) for a, b in itertools.combinations(briefs, 2)
             if option_of(a) == option_of(b)
             and abs(a.rate / b.rate - 1) <= REPORT_TOLERANCE
             and abs(a.hardware.dollars_per_hour / b.hardware.dollars_per_hour - 1)
             <= REPORT_TOLERANCE]
    assert len(twins) <= 2, twins  # of 19,900 pairs
    for brief in briefs:  # every request fits the model's context
        limit = max(d.hi for _, d in brief.prompt_len.components) + max(
            d.hi for _, d in brief.output_len.components)
        assert limit <= as_config(brief.model).max_position_embeddings, brief.name
        assert brief not in SCENARIOS.values()


def one_name_per_option() -> list[str]:
    """The first name of NAMES that draws each (model, GPU, budget) of FAMILIES."""
    found: dict[tuple[str, str, int], str] = {}
    for name in NAMES:
        found.setdefault(option_of(student_scenario(name)), name)
    return sorted(found.values(), key=NAMES.index)


@pytest.mark.parametrize("name", one_name_per_option())
def test_every_option_leaves_a_passing_deployment(name: str) -> None:
    """The recipe's own deployment meets the brief's SLO, with room: at 10% more traffic too, so
    a student's slightly different deployment can pass."""
    scenario = student_scenario(name)
    plan = reference(scenario)
    assert plan.attainment >= 0.9 and plan.gpus_used <= scenario.gpus
    busier = dataclasses.replace(scenario, rate=scenario.rate * 1.1)
    assert evaluate(busier, plan.deployment).attainment >= 0.9, scenario.describe()


@pytest.mark.parametrize("bad", ["", "   ", None, 42, ["Ada"]])
def test_a_bad_name_is_refused_with_what_to_pass(bad: object) -> None:
    with pytest.raises(ValueError, match=r"student must be a non-empty name .*got "):
        student_scenario(bad)  # type: ignore[arg-type]


def test_the_command_prints_the_students_brief_and_rubric(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["capstone", "Ada Lovelace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(student_scenario("Ada Lovelace").describe())
    assert "'student': 'Ada Lovelace'" in out and "- binding (2 points)" in out
    assert main(["capstone", " "]) == 2
    assert "student must be a non-empty name" in capsys.readouterr().out
    assert main(["capstone"]) == 2
    assert 'capstone "NAME"' in capsys.readouterr().out
