"""python -m minillm.labs: the labs from a shell.

    python -m minillm.labs chNN                  run chapter NN's lab tests (pytest -m chNN)
    python -m minillm.labs grade NOTEBOOK.ipynb  execute a student's notebook, grade every
                                                 exercise in one table (exit 1 if any fails)
    python -m minillm.labs answers chNN          reference solutions and model answers of NN
    python -m minillm.labs strip-solutions DIR   make the repository copy DIR a student handout
    python -m minillm.labs capstone "NAME"       a student's own capstone brief (exercise 11.2)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
USAGE = __doc__.split("\n\n", 1)[1].rstrip()


def run_lab(chapter: str) -> int:
    """pytest -m chNN over the checkout's tests/: the graders checked on known answers."""
    if not TESTS.is_dir():
        print(f"no tests folder at {TESTS}: run this from a source checkout (pip install -e .)")
        return 2
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", chapter, str(TESTS)]
    return subprocess.call(cmd, cwd=TESTS.parent)


def grade(argv: list[str]) -> int:
    from minillm.labs.grade import main as grade_main

    timeout = 600
    if len(argv) == 3 and argv[1] == "--timeout" and argv[2].isdigit():
        timeout = int(argv[2])
    elif len(argv) != 1:
        print("usage: python -m minillm.labs grade NOTEBOOK.ipynb [--timeout SECONDS_PER_CELL]")
        return 2
    return grade_main(argv[0], timeout)


def answers(chapter: str) -> int:
    from minillm.labs.handout import answers as chapter_answers

    try:
        text = chapter_answers(chapter.removeprefix("ch"))
    except ValueError as err:
        print(err)
        return 2
    if text is None:
        print("this copy of minillm has no reference solutions (minillm/labs/solutions/ was "
              "removed for a course); ask your instructor, or see the public repository")
        return 2
    print(text, end="")
    return 0


def strip(folder: str) -> int:
    from minillm.labs.handout import labs_work_in, strip_solutions

    try:
        removed = strip_solutions(folder)
    except (FileNotFoundError, ValueError) as err:
        print(err)
        return 2
    for path in removed:
        print(f"removed {path}")
    problem = labs_work_in(Path(folder).resolve())
    if problem:
        print(f"the stripped copy's labs do not import: {problem}")
        return 1
    print(f"{folder} is a student handout: the chapters, the engine and every grader, no "
          "reference solutions or model answers")
    return 0


def capstone(student: str) -> int:
    """Print the student's brief, how to load it, and the rubric the reasoning is graded on."""
    from minillm.labs.capstone_rubric import rubric_text
    from minillm.plan.capstone import student_scenario

    try:
        scenario = student_scenario(student)
    except ValueError as err:
        print(err)
        return 2
    print(scenario.describe())
    print(f"\nIn Python: minillm.capstone.student_scenario({student!r}). Answer "
          f"check(\"11.2\", answer) with 'student': {student!r} in the answer; the grader "
          "checks what your deployment achieves on this brief, and your instructor grades the "
          "reasoning on this rubric:\n" + rubric_text())
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0].startswith("ch") and argv[0][2:].isdigit():
        return run_lab(argv[0])
    if argv and argv[0] == "grade":
        return grade(argv[1:])
    if len(argv) == 2 and argv[0] == "answers" and argv[1].removeprefix("ch").isdigit():
        return answers(argv[1])
    if len(argv) == 2 and argv[0] == "strip-solutions":
        return strip(argv[1])
    if len(argv) == 2 and argv[0] == "capstone":
        return capstone(argv[1])
    print("usage:\n" + USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
