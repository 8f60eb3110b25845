"""check(exercise_id, answer): grade one exercise and print a verdict a reader can act on.

When the environment variable MINILLM_LABS_RESULTS names a file, every verdict is also appended
to it as one JSON line ({"id", "passed", "message"}): that is how ``python -m minillm.labs grade``
collects the results of a whole notebook that it executes.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import Any

from minillm.labs.exercises import EXERCISES

RESULTS_ENV = "MINILLM_LABS_RESULTS"


def check(exercise_id: str, answer: Any) -> bool:
    """Grade answer (a function or a value) for exercise_id, e.g. check("00.1", my_tpot).

    Prints "PASS" or "FAIL" with what was wrong, and returns True or False. A wrong answer, an
    unfinished stub (NotImplementedError) or an error in the answer's own code never raises.
    """
    passed, message = verdict(exercise_id, answer)
    exercise = EXERCISES.get(exercise_id)
    head = f"{exercise.id} ({exercise.title})" if exercise else repr(exercise_id)
    if exercise is None:
        print(f"FAIL  {message}")
    else:
        print(f"{'PASS' if passed else 'FAIL'}  {head}: {message}")
    record(exercise_id, passed, message)
    return passed


def verdict(exercise_id: str, answer: Any) -> tuple[bool, str]:
    """(passed, message) for answer: the grader's message, or what was wrong and where."""
    exercise = EXERCISES.get(exercise_id)
    if exercise is None:
        known = ", ".join(sorted(EXERCISES))
        return False, f"no exercise {exercise_id!r}; the graded exercises are: {known}"
    try:
        return True, exercise.grade(answer)
    except NotImplementedError:
        return False, "not done yet; replace `raise NotImplementedError` with your code"
    except AssertionError as err:
        return False, str(err) or "the answer is not right yet"
    except Exception as err:  # the reader's code raised: name the error and the line
        return False, f"your answer raised {type(err).__name__}: {err}{where(err)}"


def record(exercise_id: str, passed: bool, message: str) -> None:
    """Append the verdict to the file named by MINILLM_LABS_RESULTS, if any (one JSON line)."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"id": exercise_id, "passed": passed, "message": message}) + "\n")


def where(err: BaseException) -> str:
    """' (at <function>, line N)' for the innermost frame of err, or '' when unknown."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (in {last.name}, line {last.lineno})"
