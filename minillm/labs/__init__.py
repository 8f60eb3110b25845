"""Graded exercises for the chapters.

In a notebook, grade one exercise with ``check``::

    from minillm.labs import check
    check("00.1", my_tpot)        # prints a pass/fail message, returns True/False

From a shell::

    python -m minillm.labs grade 00_tour.ipynb   # run a student's notebook, grade it in one table
    python -m minillm.labs answers ch00          # reference solutions and model answers
    python -m minillm.labs strip-solutions DIR   # a repository copy for students, without them
    python -m minillm.labs capstone "NAME"       # that student's own capstone brief
    python -m minillm.labs ch00                  # the chapter's lab tests (pytest -m ch00), which
                                                 # check each grader on right and wrong answers

| module | owns |
|---|---|
| ``exercise.py`` | ``Exercise`` (id, title, prompt, grader) and helpers the graders share |
| ``chCC.py`` | chapter CC's graders and its ``EXERCISES`` list |
| ``capstone_rubric.py`` | the rubric an instructor grades the capstone's reasoning on (11.2) |
| ``exercises.py`` | the registry: every chapter's exercises by id |
| ``check.py`` | ``check(id, answer)``: runs a grader, prints a reader-facing verdict |
| ``grade.py`` | ``grade``: executes a whole notebook, gathers every check's verdict |
| ``handout.py`` | ``answers`` and ``strip-solutions``: the solutions policy |
| ``solutions/chCC.py`` | reference solutions (``SOLUTIONS``) and model answers of the open-ended |
|  | exercises (``MODEL_ANSWERS``); no grader imports them, so a course can delete them |
"""

from minillm.labs.check import check
from minillm.labs.exercises import EXERCISES, Exercise

__all__ = ["EXERCISES", "Exercise", "check"]
