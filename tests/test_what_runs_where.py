"""The pages say what runs where, and no more than was run: no page promises that the chapters
run "unchanged" on a GPU or that "a T4 will do" (no chapter has run on a real T4), and the
instructor guide's table names the three device classes and the GPU-shaped run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + [ROOT / "chapters" / f"{p}.md"
                                for p in ("intro", "learning_path", "instructor_guide")]


def test_no_page_promises_an_untested_gpu_run() -> None:
    for page in PAGES:
        text = " ".join(page.read_text().split())
        for promise in [r"runs? unchanged", r"unchanged, on a CUDA",
                        r"a (free )?(hosted )?T4 will do", r"a hosted T4 is enough",
                        r"written to hold on a CPU and on a GPU"]:
            assert not re.search(promise, text, re.I), f"{page.name}: '{promise}'"


def test_the_instructor_guide_table_says_what_runs_where() -> None:
    text = (ROOT / "chapters" / "instructor_guide.md").read_text()
    section = text.split("## What runs where")[1].split("\n## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("|"))
    for device in ["CPU", "T4", "H200"]:
        assert device in header, f"the table's columns: {device}"
    rows = {line.split("|")[1].strip() for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")}
    assert {"tested", "only expected"} <= rows, rows
    for command in ["python -m minillm.bench chapters --gpu-shaped fp16",
                    "python -m minillm.bench chapters --gpu-shaped bf16",
                    "python -m minillm.bench chapters --out DIR"]:
        assert command in section, command
    assert "none has run on one yet" in section, "says no chapter has run on a real T4"


def test_intro_and_learning_path_say_what_ran_on_a_gpu() -> None:
    for name in ("intro", "learning_path"):
        text = " ".join((ROOT / "chapters" / f"{name}.md").read_text().split())
        assert "chapter 04" in text and "instructor_guide.md" in text, name
