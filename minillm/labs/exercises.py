"""The registry of graded exercises: id ("CC.N", CC the chapter) -> an Exercise.

Each chapter's graders live in their own module, minillm/labs/chCC.py, which lists its
exercises in EXERCISES; this module gathers them, so adding a chapter touches no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

from minillm.labs.exercise import Exercise


def chapter_modules(package: str, folder: Path) -> list[ModuleType]:
    """The chCC modules of a package (minillm.labs or its solutions, in folder), in chapter
    order. By name and folder, not the package object: this runs while that package's
    __init__ is still importing, and reaching back into it would be a cycle."""
    names = sorted(m.name for m in pkgutil.iter_modules([str(folder)])
                   if re.fullmatch(r"ch\d\d", m.name))
    return [importlib.import_module(f"{package}.{name}") for name in names]


def gather() -> dict[str, Exercise]:
    exercises: dict[str, Exercise] = {}
    for module in chapter_modules("minillm.labs", Path(__file__).parent):
        for exercise in module.EXERCISES:
            assert exercise.id not in exercises, f"exercise {exercise.id} is defined twice"
            assert exercise.chapter == module.__name__.rsplit(".", 1)[1], (
                f"exercise {exercise.id} belongs in minillm/labs/{exercise.chapter}.py")
            exercises[exercise.id] = exercise
    return exercises


EXERCISES: dict[str, Exercise] = gather()
