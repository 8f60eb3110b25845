"""binder/: the files repo2docker reads follow its conventions and install what the chapters
import (CPU PyTorch, this project with its [book] extra) on a Python this project supports."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def requirement_lines() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_runtime_names_a_supported_python() -> None:
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-3\.(\d+)", runtime)
    assert match, f"repo2docker wants 'python-3.X' in runtime.txt, got {runtime!r}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = int(re.search(r">=\s*3\.(\d+)", project["requires-python"]).group(1))
    assert int(match.group(1)) >= minimum


def test_requirements_take_cpu_torch_and_the_book_extra() -> None:
    lines = requirement_lines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    torch = [line for line in lines if line.startswith("torch")]
    assert len(torch) == 1 and torch[0].endswith("+cpu"), (
        f"pin PyTorch's CPU build (torch==X+cpu), not {torch}: the CUDA build is several GB")
    ci = (ROOT / ".ci" / "run").read_text()
    version = torch[0].split("==")[1].removesuffix("+cpu")
    assert f"torch=={version}" in ci, "Binder and CI should run the same PyTorch"
    assert "-e .[book]" in lines, "install this repository (editable) with its [book] extra"


def test_the_book_extra_has_what_the_chapters_import() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {re.split(r"[<>=\[ ;]", dep)[0].lower()
                 for dep in project["dependencies"] + project["optional-dependencies"]["book"]}
    imported = set()
    for notebook in (ROOT / "chapters").glob("*.ipynb"):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":
                imported |= set(re.findall(r"^(?:import|from) (\w+)", "".join(cell["source"]),
                                           re.M))
    ours = {"minillm", "widgets"}
    missing = {name for name in imported - ours - set(sys.stdlib_module_names)
               if name.lower() not in installed}
    assert not missing, f"chapters import {sorted(missing)}: add them to the [book] extra"
