"""An Exercise, and the small helpers every chapter's graders share.

A grader takes the reader's answer (a function or a value), checks it with asserts whose
messages speak to the reader ("you divided by n; ..."), and returns a short message on success.
Anything the reader's own code raises is reported by check(), not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Exercise:
    """One graded exercise. grade(answer) raises AssertionError(reader message) when wrong."""

    id: str
    title: str
    prompt: str
    grade: Callable[[Any], str]

    @property
    def chapter(self) -> str:
        """The pytest marker of this exercise's lab, e.g. "ch00"."""
        return "ch" + self.id.split(".")[0]


def expect_callable(answer: Any, signature: str) -> None:
    assert callable(answer), (
        f"pass a function {signature}, not a {type(answer).__name__}")


def close(a: float, b: float, rel_tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)
