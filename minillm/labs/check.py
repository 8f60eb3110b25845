"""check(exercise_id, answer): grade one exercise and print a verdict a reader can act on."""

from __future__ import annotations

import traceback
from typing import Any

from minillm.labs.exercises import EXERCISES


def check(exercise_id: str, answer: Any) -> bool:
    """Grade answer (a function or a value) for exercise_id, e.g. check("00.1", my_tpot).

    Prints "PASS" or "FAIL" with what was wrong, and returns True or False. A wrong answer, an
    unfinished stub (NotImplementedError) or an error in the answer's own code never raises.
    """
    exercise = EXERCISES.get(exercise_id)
    if exercise is None:
        known = ", ".join(sorted(EXERCISES))
        print(f"FAIL  no exercise {exercise_id!r}; the graded exercises are: {known}")
        return False
    head = f"{exercise.id} ({exercise.title})"
    try:
        message = exercise.grade(answer)
    except NotImplementedError:
        print(f"FAIL  {head}: not done yet; replace `raise NotImplementedError` with your code")
        return False
    except AssertionError as err:
        print(f"FAIL  {head}: {err or 'the answer is not right yet'}")
        return False
    except Exception as err:  # the reader's code raised: name the error and the line
        print(f"FAIL  {head}: your answer raised {type(err).__name__}: {err}{where(err)}")
        return False
    print(f"PASS  {head}: {message}")
    return True


def where(err: BaseException) -> str:
    """' (at <function>, line N)' for the innermost frame of err, or '' when unknown."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (in {last.name}, line {last.lineno})"
