"""Grade a student's whole chapter notebook with one command: python -m minillm.labs grade NB.

The notebook is executed top to bottom in a fresh kernel (a cell that raises does not stop the
run), every ``check(...)`` call in it appends its verdict to a results file (see check.py), and
the verdicts are gathered into one table: each graded exercise of the notebook's chapter(s)
passed, failed (with the grader's hint) or never ran; open-ended exercises are listed with where
their model answers are. Grading imports no reference solution, so it works on a copy of the
labs package without minillm/labs/solutions (see handout.py).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

from minillm.labs.check import RESULTS_ENV
from minillm.labs.exercises import EXERCISES

GRADED_CALL = re.compile(r"""check\(\s*["'](\d\d\.\d+)["']""")
OPEN_ENDED = re.compile(r"(\d\d\.\d+)\s*\(open-ended\)")


@dataclass(frozen=True)
class Result:
    """One row of the grade table. status: "pass" | "fail" | "not run" | "open-ended"."""

    id: str
    title: str
    status: str
    hint: str


def notebook_exercises(nb: nbformat.NotebookNode) -> tuple[list[str], list[str]]:
    """(graded ids called with check, open-ended ids in the markdown) of a notebook, in order."""
    graded: list[str] = []
    open_ended: list[str] = []
    for cell in nb.cells:
        found = GRADED_CALL if cell.cell_type == "code" else OPEN_ENDED
        target = graded if cell.cell_type == "code" else open_ended
        for exercise_id in found.findall(cell.source):
            if exercise_id not in target:
                target.append(exercise_id)
    return graded, open_ended


def chapters_of(path: Path, ids: list[str]) -> list[str]:
    """The chapter numbers ("04") a notebook belongs to: from its exercise ids and its name."""
    chapters = {i.split(".")[0] for i in ids}
    if re.match(r"\d\d_", path.name):
        chapters.add(path.name[:2])
    return sorted(chapters)


def execute(nb: nbformat.NotebookNode, folder: Path, results: Path, timeout: int) -> list[str]:
    """Run every cell in a fresh kernel started in folder; the errors of the cells that raised."""
    from nbclient import NotebookClient  # nbclient comes with jupyter (the [book] extra)

    # "python3" is this Python's own kernel, whatever kernel name the student's notebook saved:
    # the notebook is graded against the minillm (and graders) installed here.
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    previous = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(results)  # the kernel inherits the environment
    stopped = []
    try:
        client.execute()
    except Exception as err:  # a cell ran past timeout, or the kernel died: grade what ran
        stopped.append(f"the run stopped: {type(err).__name__}: {err}")
    finally:
        if previous is None:
            del os.environ[RESULTS_ENV]
        else:
            os.environ[RESULTS_ENV] = previous
    errors = []
    for number, cell in enumerate(nb.cells, 1):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(f"cell {number}: {output['ename']}: {output['evalue']}")
    return errors + stopped


def grade_notebook(path: str | Path, timeout: int = 600) -> tuple[list[Result], list[str]]:
    """Execute the notebook at path; (one Result per exercise of its chapters, cell errors)."""
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    graded, open_ended = notebook_exercises(nb)
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        results.touch()
        errors = execute(nb, path.parent, results, timeout)
        verdicts = {}  # the last check of each exercise counts
        for line in results.read_text().splitlines():
            entry = json.loads(line)
            verdicts[entry["id"]] = entry
    chapters = chapters_of(path, graded + open_ended)
    expected = [i for i in sorted(EXERCISES) if i.split(".")[0] in chapters]
    expected += [i for i in graded if i not in expected]  # an unknown id is reported too
    rows = []
    for exercise_id in expected:
        title = EXERCISES[exercise_id].title if exercise_id in EXERCISES else "unknown exercise"
        entry = verdicts.get(exercise_id)
        if entry is None:
            where = ("its check(...) call did not run (an error or a timeout came first)"
                     if exercise_id in graded
                     else f'the notebook never calls check("{exercise_id}", ...)')
            rows.append(Result(exercise_id, title, "not run", where))
        else:
            status = "pass" if entry["passed"] else "fail"
            rows.append(Result(exercise_id, title, status, entry["message"]))
    for exercise_id in open_ended:
        chapter = exercise_id.split(".")[0]
        rows.append(Result(exercise_id, "graded by hand", "open-ended",
                           f"model answer and rubric: python -m minillm.labs answers ch{chapter}"))
    return rows, errors


def table(rows: list[Result], width: int = 100) -> str:
    """The results as a fixed-width text table, one exercise a row, its hint wrapped below."""
    lines = [f"{'exercise':<9}{'result':<12}{'title':<34}hint", "-" * width]
    for row in rows:
        title = row.title if len(row.title) <= 32 else row.title[:31] + "…"
        hint = textwrap.wrap(" ".join(row.hint.split()), width - 55) or [""]
        lines.append(f"{row.id:<9}{row.status.upper():<12}{title:<34}{hint[0]}")
        lines += [" " * 55 + more for more in hint[1:]]
    return "\n".join(lines)


def main(path: str, timeout: int = 600) -> int:
    """Grade one notebook, print the table; 0 when every graded exercise passed, else 1."""
    if not Path(path).is_file():
        print(f"no notebook at {path}")
        return 2
    print(f"grading {path}: running every cell in a fresh kernel ...", flush=True)
    rows, errors = grade_notebook(path, timeout)
    print(table(rows))
    graded = [r for r in rows if r.status != "open-ended"]
    passed = sum(r.status == "pass" for r in graded)
    print(f"\n{passed} of {len(graded)} graded exercises pass")
    if errors:
        print("cells that raised (the chapter's own checks or the student's edits):")
        for error in errors:
            print("  " + " ".join(error.split())[:200])
    return 0 if graded and passed == len(graded) else 1
