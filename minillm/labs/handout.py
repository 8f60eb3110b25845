"""The solutions policy in code: model answers for self-learners, a copy without them for a course.

- ``answers("04")`` is what ``python -m minillm.labs answers ch04`` prints: each exercise of the
  chapter with its reference solution (graded ones, the source of the function in
  minillm/labs/solutions/chCC.py) or its model answer or rubric (open-ended ones, the chapter's
  ``MODEL_ANSWERS`` dict there).
- ``strip_solutions(folder)`` is ``python -m minillm.labs strip-solutions DIR``: it turns a copy
  of the repository into a student handout by deleting minillm/labs/solutions/, the test files
  that import it at module level, and the git history (which holds the solutions too). The
  graders (check, grade, the chapter labs) never import the solutions, so they keep working.
  The capstone (exercise 11.2) has no answer key at all: each student's brief is drawn from
  their name (minillm.capstone.student_scenario), the grader works its bar out with the
  library's recommend() when it grades, and the one worked answer with written reasoning, for
  one name, is a solution like the others (tests/test_ch11_capstone_handout.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from minillm.labs.exercises import EXERCISES

ROOT = Path(__file__).resolve().parents[2]  # the source checkout that holds this package
SOLUTIONS = Path("minillm") / "labs" / "solutions"
IMPORTS_SOLUTIONS = re.compile(r"^(from|import) minillm\.labs\.solutions", re.M)


def has_solutions() -> bool:
    """Whether this copy of minillm has its reference solutions (an instructor may remove them)."""
    return importlib.util.find_spec("minillm.labs.solutions") is not None


def answers(chapter: str) -> str | None:
    """Markdown: every exercise of the chapter with its reference solution or model answer.

    None when this copy has no solutions (an instructor's handout); ValueError for a chapter
    that has no exercises."""
    if not has_solutions():
        return None
    if not any(i.startswith(chapter + ".") for i in EXERCISES):
        chapters = sorted({"ch" + i.split(".")[0] for i in EXERCISES})
        raise ValueError(f"no chapter {chapter!r} with exercises; the chapters are {chapters}")
    module = importlib.import_module(f"minillm.labs.solutions.ch{chapter}")
    parts = [f"# Chapter {chapter}: reference solutions and model answers"]
    solutions = getattr(module, "SOLUTIONS", {})
    for exercise_id in sorted(i for i in EXERCISES if i.startswith(chapter + ".")):
        parts.append(f"## {exercise_id} (graded): {EXERCISES[exercise_id].title}")
        solution = solutions.get(exercise_id)
        parts.append("```python\n" + inspect.getsource(solution).rstrip() + "\n```"
                     if solution else "(no reference solution yet)")
    model_answers: dict[str, str] = getattr(module, "MODEL_ANSWERS", {})
    for exercise_id, text in sorted(model_answers.items()):
        parts.append(f"## {exercise_id} (open-ended): model answer and rubric")
        parts.append(text.strip())
    return "\n\n".join(parts) + "\n"


def test_files_needing_solutions(folder: Path) -> list[Path]:
    """Test files that import minillm.labs.solutions at module level (they cannot be collected
    without it); a test that imports it inside a try, as tests/test_labs.py does, stays."""
    return sorted(p for p in (folder / "tests").glob("*.py")
                  if IMPORTS_SOLUTIONS.search(p.read_text(encoding="utf-8")))


def strip_solutions(folder: str | Path) -> list[Path]:
    """Make the repository copy at folder a student handout; returns what was removed."""
    folder = Path(folder).resolve()
    if not (folder / "minillm" / "labs").is_dir():
        raise FileNotFoundError(f"{folder} is not a copy of the minillm repository "
                                "(no minillm/labs/): clone or copy it there first")
    if folder == ROOT:
        raise ValueError(f"{folder} is the checkout this command runs from; strip a copy "
                         f"instead: git clone {folder} handout && python -m minillm.labs "
                         "strip-solutions handout")
    removed = [folder / SOLUTIONS, folder / ".git", *test_files_needing_solutions(folder)]
    removed = [p for p in removed if p.exists()]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for cache in (folder / "minillm" / "labs" / "__pycache__").glob("*"):
        cache.unlink()  # no stale bytecode of a removed module
    return removed


def labs_work_in(folder: Path) -> str:
    """Import the labs (every chapter's graders) from folder in a fresh Python: '' if fine,
    else the error. Checks the handout does not depend on the solutions it lost."""
    code = ("import importlib.util, pathlib, minillm.labs as labs; "
            f"assert pathlib.Path(labs.__file__).is_relative_to({str(folder)!r}), labs.__file__; "
            "assert importlib.util.find_spec('minillm.labs.solutions') is None; "
            "print(len(labs.EXERCISES))")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(folder)})
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return ""
