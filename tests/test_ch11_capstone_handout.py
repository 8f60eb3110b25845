"""A course's handout (strip-solutions) holds no reference answer to the capstone and still
grades it: the reasoning the reference solution writes appears nowhere in the copy, and the
grader, which never imports the solutions, passes a student's own answer on their own brief and
fails the same answer handed in under a classmate's name."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minillm.labs.handout import has_solutions, strip_solutions

pytestmark = pytest.mark.ch11

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "minillm" / "labs" / "solutions" / "ch11.py"

GRADE_IN_HANDOUT = textwrap.dedent("""
    import dataclasses, importlib.util, sys
    import minillm
    assert minillm.__file__.startswith(sys.argv[1]), minillm.__file__
    assert importlib.util.find_spec("minillm.labs.solutions") is None
    from minillm.plan.capstone import evaluate, reference, student_scenario
    from minillm.labs.check import verdict

    def answer(student):  # a student's own work: the deployment, its figures, a paragraph
        scenario = student_scenario(student)
        deployment = reference(scenario).deployment
        run = evaluate(scenario, deployment)
        return {"student": student, **dataclasses.asdict(deployment), "goodput": run.goodput,
                "dollars_per_million_tokens": run.dollars_per_million_tokens,
                "reasoning": "my own argument " * 60}

    mine = answer("Grace Hopper")
    passed, message = verdict("11.2", mine)
    assert passed, message
    print("graded in the handout:", message)
    copied, message = verdict("11.2", {**mine, "student": "Alan Turing"})
    assert not copied and "Alan Turing" in message, message
""")


@pytest.mark.skipif(not has_solutions(), reason="this copy is already a handout")
def test_the_handout_has_no_reference_answer_and_still_grades(tmp_path: Path) -> None:
    handout = tmp_path / "handout"
    for part in ["minillm", "tests", "chapters", "widgets"]:
        shutil.copytree(ROOT / part, handout / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_build"))
    shutil.copy(ROOT / "pyproject.toml", handout)
    strip_solutions(handout)
    assert not (handout / "minillm" / "labs" / "solutions").exists()

    # The reference's written reasoning: the fixed text of its template (read from the
    # solution here, so this test does not carry it into the handout), none in the handout.
    source = SOLUTION.read_text(encoding="utf-8")
    template = source[source.index("reasoning = ("):source.index("return {", source.index(
        "reasoning = ("))]
    phrases = [p.strip() for p in re.findall(r'"([^"{}]{30,})"', template)]
    assert len(phrases) >= 5, phrases
    for path in handout.rglob("*"):
        if path.suffix in (".py", ".ipynb", ".md", ".txt", ".toml"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not [p for p in phrases if p in text], path

    done = subprocess.run([sys.executable, "-c", GRADE_IN_HANDOUT, str(handout)], cwd=handout,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(handout), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "The configuration passes" in done.stdout
