"""Reference solutions of the graded exercises, kept out of the chapters: one module per
chapter (chCC.py, with a SOLUTIONS dict), gathered here.

tests/test_labs.py checks that each one passes its grader (and that unfilled stubs fail).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from minillm.labs.exercises import chapter_modules

SOLUTIONS: dict[str, Callable[..., Any]] = {
    exercise_id: solution for module in chapter_modules(__name__, Path(__file__).parent)
    for exercise_id, solution in module.SOLUTIONS.items()}
