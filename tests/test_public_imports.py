"""Every import of minillm (or widgets) that a chapter, a course page or the README writes still
runs: the names readers type are the public API, wherever the package keeps the file."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_of(path: Path) -> list[str]:
    """The Python a reader runs from path: a notebook's code cells, or a page's ```python blocks
    (IPython's %magics and !shell lines dropped)."""
    if path.suffix == ".ipynb":
        cells = [cell["source"] for cell in json.loads(path.read_text())["cells"]
                 if cell["cell_type"] == "code"]
        blocks = ["".join(source) if isinstance(source, list) else source for source in cells]
    else:
        blocks = re.findall(r"```(?:python|{code-cell} ipython3)\n(.*?)```", path.read_text(),
                            flags=re.S)
    return ["\n".join(line for line in block.splitlines()
                      if not line.lstrip().startswith(("%", "!"))) for block in blocks]


def public_imports() -> dict[str, list[str]]:
    """Each distinct import statement of minillm or widgets -> the files that write it."""
    found: dict[str, list[str]] = {}
    chapters = ROOT / "chapters"
    pages = [*sorted(chapters.glob("*.ipynb")), *sorted(chapters.glob("*.md")), ROOT / "README.md"]
    for path in pages:
        for block in _python_of(path):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue  # a block that shows a fragment, not a program
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                    modules = ([alias.name for alias in node.names]
                               if isinstance(node, ast.Import) else [node.module or ""])
                    if any(m.split(".")[0] in ("minillm", "widgets") for m in modules):
                        found.setdefault(ast.unparse(node), []).append(path.name)
    return found


IMPORTS = public_imports()


def test_the_pages_import_the_package_at_all() -> None:
    """The collector itself works: the chapters import dozens of names from minillm, among them
    short names of modules that live in folders."""
    assert len(IMPORTS) > 50
    assert any(statement.startswith("from minillm.simulator import") for statement in IMPORTS)


@pytest.mark.parametrize("statement", sorted(IMPORTS))
def test_a_public_import_runs(statement: str) -> None:
    exec(statement, {})  # noqa: S102 - the statement is an import read from our own pages
