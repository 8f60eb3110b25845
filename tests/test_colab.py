"""Opening a chapter on a free GPU: the setup cell every chapter starts with, and the site's
Colab launch buttons.

The setup cell installs minillm from the repository only on Colab or Kaggle, keeping the CUDA
build of torch those images ship; anywhere else it runs no command and changes nothing. Its logic
is checked here by executing it with `subprocess` and `os.system` replaced, on this machine as
it is, with a fake `google.colab` module, and with Kaggle's environment variable. The launch
links are checked in the built site's HTML (skipped when the site has not been built).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "chapters"
SITE = Path(os.environ.get("MINILLM_SITE") or BOOK / "_build" / "html")
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
CONFIG = (BOOK / "_config.yml").read_text()
REPOSITORY = re.search(r"^repository:\n\s+url:\s*(\S+)", CONFIG, re.M).group(1)
BRANCH = re.search(r"^repository:\n(?:\s+.*\n)*?\s+branch:\s*(\S+)", CONFIG, re.M).group(1)
COLAB = "https://colab.research.google.com"


def setup_cell(path: Path) -> dict:
    return next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


SETUP = "".join(setup_cell(CHAPTERS[0])["source"])


class Ran(Exception):
    """Raised by the stand-ins for subprocess and os.system when the cell runs a command."""


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every command the cell runs, recorded instead of run; os.system fails the test."""
    ran: list[list[str]] = []

    def record(cmd: list[str], *args: object, **kwargs: object) -> subprocess.CompletedProcess:
        ran.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    def refuse(*args: object, **kwargs: object) -> None:
        raise Ran(f"the setup cell ran {args}")

    for name in ("run", "check_call", "call"):
        monkeypatch.setattr(subprocess, name, record)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "check_output", refuse)
    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    return ran


def run_setup() -> dict:
    namespace: dict = {}
    exec(compile(SETUP, "<setup cell>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_starts_with_the_same_setup_cell(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    assert cells[0]["cell_type"] == "markdown" and cells[1]["cell_type"] == "code", (
        "the setup cell is the first code cell, right after the title")
    assert "".join(cells[1]["source"]) == SETUP, f"{path.name}: the setup cell differs"
    assert SETUP.startswith("# Setup on Colab or Kaggle")


def test_the_cell_imports_only_the_standard_library() -> None:
    """minillm is not installed yet where the cell matters, and chapter 04 sets TRITON_INTERPRET
    before its first `import torch`: the cell must import neither."""
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(SETUP))
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in (node.names if isinstance(node, ast.Import)
                              else [ast.alias(node.module or "")])}
    assert imported <= set(sys.stdlib_module_names), imported


def test_does_nothing_outside_colab_and_kaggle(commands: list[list[str]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    environ, path = dict(os.environ), list(sys.path)
    run_setup()
    assert commands == []
    assert dict(os.environ) == environ and sys.path == path
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("where", ["colab", "kaggle"])
def test_installs_minillm_from_the_repository_and_keeps_torch(
        where: str, commands: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    if where == "colab":
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    run_setup()
    assert len(commands) == 1, commands
    cmd = commands[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"], "pip of the notebook's kernel"
    assert f"minillm @ git+{REPOSITORY}" in cmd, f"installs minillm from {REPOSITORY}"
    assert "anywidget" in cmd, "the chapters' widgets need anywidget"
    # The image's torch (a CUDA build) stays: the only torch requirement is its own version, and
    # nothing asks pip to upgrade or reinstall.
    torch_requirements = [a for a in cmd if a.startswith("torch")]
    assert torch_requirements == [f"torch=={importlib.metadata.version('torch')}"]
    assert not {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I"} & set(cmd)


class Links(HTMLParser):
    """The href of every <a> and the src of every <img> and <script> of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"] or "")
        if tag in ("img", "script") and values.get("src"):
            self.sources.append(values["src"] or "")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_page_has_a_colab_link(path: Path) -> None:
    page = SITE / f"{path.stem}.html"
    if not (SITE / "intro.html").is_file():
        pytest.skip("the site is not built: jupyter-book build chapters/")
    links = Links()
    links.feed(page.read_text(encoding="utf-8"))
    repo = REPOSITORY.removeprefix("https://github.com/")
    expected = f"{COLAB}/github/{repo}/blob/{BRANCH}/chapters/{path.name}"
    assert expected in links.hrefs, f"{page.name}: no link to {expected}"
    # The button's logo is the theme's own copy: the page still loads nothing from the network.
    remote = [s for s in links.sources if re.match(r"(https?:)?//", s)]
    assert remote == [], f"{page.name} loads {remote}"
