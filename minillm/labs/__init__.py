"""Graded exercises for the chapters.

In a notebook, grade one exercise with ``check``::

    from minillm.labs import check
    check("00.1", my_tpot)        # prints a pass/fail message, returns True/False

From a shell, run the tests of one chapter's lab alone (they carry a pytest marker per chapter,
as minitorch's do)::

    python -m minillm.labs ch00   # = pytest -m ch00 over the repository's tests/

| module | owns |
|---|---|
| ``exercise.py`` | ``Exercise`` (id, title, prompt, grader) and helpers the graders share |
| ``chCC.py`` | chapter CC's graders and its ``EXERCISES`` list |
| ``exercises.py`` | the registry: every chapter's exercises by id |
| ``check.py`` | ``check(id, answer)``: runs a grader, prints a reader-facing verdict |
| ``solutions/chCC.py`` | reference solutions (kept out of the chapters; CI checks they pass) |
"""

from minillm.labs.check import check
from minillm.labs.exercises import EXERCISES, Exercise

__all__ = ["EXERCISES", "Exercise", "check"]
