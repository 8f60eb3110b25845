"""The chapters' shape, checked without running them (nbval runs them): each is committed with
its outputs cleared and has the parts CHAPTERS.md asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minillm.labs import EXERCISES

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == kind]


def test_the_chapters_are_numbered_in_order() -> None:
    assert [p.name[:2] for p in CHAPTERS] == [f"{n:02d}" for n in range(13)]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_committed_with_outputs_cleared(path: Path) -> None:
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, (
                f"{path.name}: clear the outputs before committing (jupyter nbconvert "
                f"--clear-output --inplace {path.name})")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_cell_has_a_unique_id(path: Path) -> None:
    # nbformat 4.5 requires them (a missing one is a warning today, an error in later nbformat),
    # and Jupyter Book and nbval name cells by them.
    ids = [cell.get("id") for cell in json.loads(path.read_text())["cells"]]
    assert None not in ids, f"{path.name}: a cell has no id (nbformat.validator.normalize)"
    assert len(set(ids)) == len(ids), f"{path.name}: two cells share an id"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_has_the_parts_of_a_chapter(path: Path) -> None:
    number = path.name[:2]
    markdown, code = "\n".join(cells(path, "markdown")), "\n".join(cells(path, "code"))
    assert re.match(rf"# {number} — ", markdown), "the first cell is '# NN — Title'"
    assert "**The question.**" in markdown and "## Summary" in markdown
    assert "## Exercises" in markdown
    assert "print(machine.describe())" in code, "say which machine measured the numbers"
    assert "inspect.getsource(" in code, "show the engine's source live, never a pasted copy"
    graded = set(re.findall(r'check\("(\d\d\.\d+)"', code))
    assert graded, "at least one graded exercise"
    assert graded <= set(EXERCISES), f"unknown exercises {graded - set(EXERCISES)}"
    assert {e for e in EXERCISES if e.startswith(number)} <= graded, (
        "every graded exercise of this chapter appears in it")
    assert "raise NotImplementedError" in code, "exercises are committed as unfilled stubs"
    assert "plt.show()" in code or re.search(r"^(BatchTimeline|BlockTableView|"
                                             r"RooflineExplorer|KVCalculator)\(", code, re.M)
