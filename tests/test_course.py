"""The course around the chapters: the pages (learning path, notation, glossary, instructor
guide, solutions policy) say what they must, and the solutions policy works as they say.

- ``python -m minillm.labs grade NB`` executes a whole notebook and reports every exercise of its
  chapter in one table (a pass, a fail with its hint, a check that never ran, the open-ended);
- the graders never import the reference solutions, and grading works in a copy stripped of
  them (``strip-solutions``), where ``answers`` says they are gone;
- ``answers chNN`` prints each chapter's reference solutions and model answers, and every
  open-ended exercise of every chapter has a model answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from minillm.labs import EXERCISES
from minillm.labs.__main__ import main
from minillm.labs.grade import OPEN_ENDED
from minillm.labs.handout import has_solutions

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "chapters"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
COURSE_PAGES = ["learning_path", "notation", "glossary", "instructor_guide", "solutions"]
# The engines the appendix maps the book's knobs onto, each with the bib entry of its docs.
ENGINES = {"vLLM": "vllm2025docs", "SGLang": "sglang2025docs",
           "TensorRT-LLM": "tensorrtllm2026docs", "TGI": "tgi2026docs",
           "LMDeploy": "lmdeploy2026docs"}

# The glossary's terms, exactly as the chapters link them with {term}`NAME`.
TERMS = ["TTFT", "TPOT", "ITL", "E2E latency", "throughput", "goodput", "SLO", "prefill",
         "decode", "KV cache", "KV block", "block table", "slot mapping", "paged attention",
         "prefix caching", "arithmetic intensity", "roofline", "ridge point", "prefill crossover",
         "memory-bound", "compute-bound", "continuous batching", "static batching",
         "chunked prefill", "token budget", "preemption", "KV wall", "GQA", "MQA", "seat",
         "percentile", "calibration", "CUDA graph", "admission", "swap", "priority",
         "tensor parallelism", "pipeline parallelism", "all-reduce", "pipeline bubble",
         "disaggregation", "data parallelism", "online softmax", "log-sum-exp", "IO-aware",
         "SRAM", "HBM", "FlashAttention", "split-KV"]
# In a student handout (strip-solutions) the tests that read the solutions skip; the rest run.
needs_solutions = pytest.mark.skipif(not has_solutions(), reason="a copy without the solutions")
SYMBOLS = ["B", "T", "S", "H", "K", "D", "L", "E", "F", "V", "N", "P", "I", "O", "AI", "M",
           "G", "R", "J", "Z",  # chapter 12: GQA group, a tile's rows and keys, splits
           "k", "α", "τ", "t", "p", "m", "μ", "l"]  # chapters 10-12: draft, acceptance, TP, PP, ...


def markdown_of(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "markdown")


def glossary_terms() -> dict[str, str]:
    """term -> its definition, from the {glossary} directive of chapters/glossary.md."""
    text = (BOOK / "glossary.md").read_text()
    body = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S).group(1)
    entries = re.findall(r"^(\S[^\n]*)\n((?:[ ]+\S[^\n]*\n?)+)", body, re.M)
    return {term: " ".join(definition.split()) for term, definition in entries
            if not term.startswith(":")}


# ---------------------------------------------------------------------------------- the pages

def test_the_toc_holds_the_course_pages_and_the_chapters_in_order() -> None:
    toc = (BOOK / "_toc.yml").read_text()
    files = re.findall(r"file:\s*(\S+)", toc)
    assert [f for f in files if re.match(r"\d\d_", f)] == [p.stem for p in CHAPTERS]
    for page in COURSE_PAGES:
        assert page in files, f"{page}.md is not in chapters/_toc.yml"
        assert (BOOK / f"{page}.md").is_file()
        assert f"]({page}.md)" in (BOOK / "intro.md").read_text(), f"intro.md: link {page}"


def test_the_glossary_defines_every_term_with_a_chapter() -> None:
    terms = glossary_terms()
    missing = [t for t in TERMS if t not in terms]
    assert not missing, f"glossary.md lacks {missing} (chapters link them with {{term}})"
    for term, definition in terms.items():
        sentences = len(re.findall(r"[.!?](\s|$)", definition))
        assert 1 <= sentences <= 4, f"{term}: 1-3 sentences and a pointer, not {definition}"
        chapters = re.findall(r"\]\((\d\d_\w+)\.ipynb\)", definition)
        assert chapters, f"{term}: link the chapter that teaches it"
        for chapter in chapters:
            assert (BOOK / f"{chapter}.ipynb").is_file(), f"{term}: no chapter {chapter}"


def test_every_term_and_citation_a_page_uses_exists() -> None:
    """The -W site build fails on an unknown {term} or {cite}; this names the page first."""
    terms = {t.lower() for t in glossary_terms()}
    keys = set(re.findall(r"^@\w+\{([^,]+),", (BOOK / "references.bib").read_text(), re.M))
    pages = [(p.name, markdown_of(p)) for p in CHAPTERS]
    pages += [(p.name, p.read_text()) for p in BOOK.glob("*.md")]
    for name, text in pages:
        for role in re.findall(r"\{term\}`([^`]+)`", text):
            target = re.search(r"<([^>]+)>$", role)
            term = (target.group(1) if target else role).strip()
            assert term.lower() in terms, f"{name}: {{term}}`{role}` is not in glossary.md"
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text):
            for key in group.split(","):
                assert key.strip() in keys, f"{name}: {{cite}}`{key}` not in references.bib"


def test_notation_defines_each_symbol_once() -> None:
    text = (BOOK / "notation.md").read_text()
    rows = re.findall(r"^\| ([A-Za-zα-ω]{1,2})(?: \([^)]*\))? \|", text, re.M)
    assert sorted(rows) == sorted(SYMBOLS), "one row per symbol of the brief"
    assert "prompt length" in text and "output length" in text and "block size" in text
    for metric in ["TTFT", "TPOT", "ITL", "E2E latency"]:
        assert f"{{term}}`{metric}`" in text, f"notation.md: define {metric} with a formula"
    assert "(E2E − TTFT) / (O − 1)" in text


def test_the_learning_path_gives_prerequisites_and_a_measured_time_per_chapter() -> None:
    text = (BOOK / "learning_path.md").read_text()
    for needed in ["Python", "linear algebra", "transformer"]:
        assert needed in text
    for path in CHAPTERS:
        row = next((line for line in text.splitlines() if f"]({path.name})" in line
                    and line.startswith("|")), None)
        assert row, f"learning_path.md: no row for {path.name}"
        assert re.search(r"\|\s*~?\d+(\.\d+)?\s*(s|min)\s*\|", row), f"no measured time: {row}"
    assert "measured on a 2-core CPU" in text
    # The times, then their provenance in one place: no commit hash before the last section.
    body, _, provenance = text.partition("## Where the times come from")
    assert provenance, "learning_path.md: a section 'Where the times come from'"
    assert not re.search(r"\b[0-9a-f]{7}\b", body), "commit hashes belong in the last section"
    timed = set()
    for first_column in re.findall(r"^\| ([\d–, ]+) \|", provenance, re.M):
        for part in first_column.split(","):
            lo, _, hi = part.strip().partition("–")
            timed |= {f"{n:02d}" for n in range(int(lo), int(hi or lo) + 1)}
    assert timed == {p.name[:2] for p in CHAPTERS}, "when each chapter was timed"
    assert re.findall(r"\b[0-9a-f]{7}\b", provenance), "the commits the times were measured at"


def test_the_instructor_guide_covers_schedule_grading_and_where_it_runs() -> None:
    text = (BOOK / "instructor_guide.md").read_text()
    for needed in ["python -m minillm.labs grade", "python -m minillm.labs chNN",
                   "strip-solutions", "Binder", "GPU", "laptop", "Known limitations"]:
        assert needed.lower() in text.lower(), needed
    schedule = re.findall(r"^\| (\d+) \| ([^|]*) \|", text, re.M)
    assert [int(week) for week, _ in schedule] == list(range(1, len(schedule) + 1))
    taught = {week: re.findall(r"\]\((\d\d)_\w+\.ipynb\)", cell) for week, cell in schedule}
    assert all(len(chapters) <= 1 for chapters in taught.values()), "one chapter a week"
    scheduled = sorted(c for chapters in taught.values() for c in chapters)
    assert scheduled == sorted(p.name[:2] for p in CHAPTERS), "every chapter, once"
    # The capstone (chapter 11's 11.2) gets at least two weeks after its chapter, and no later
    # week brings a new chapter to compete with it.
    capstone_week = next(int(w) for w, chapters in taught.items() if chapters == ["11"])
    later = [(int(w), cell) for w, cell in schedule if int(w) > capstone_week]
    capstone_weeks = [w for w, cell in later if "capstone" in cell]
    assert len(capstone_weeks) >= 2, "two weeks or more for the capstone"
    assert not [w for w, chapters in taught.items() if int(w) > capstone_week and chapters]


def test_the_instructor_guide_weights_sum_to_100_and_names_what_exists() -> None:
    """The assessment's weights sum to 100%; every `python -m minillm.labs` command the guide
    names is one the CLI runs, and every minillm name it gives can be imported."""
    import importlib

    text = (BOOK / "instructor_guide.md").read_text()
    assessment = text.split("## Assessment")[1].split("\n## ")[0]
    weights = [int(w) for w in re.findall(r"^\|[^|]+\| (\d+)% \|", assessment, re.M)]
    assert len(weights) >= 4 and sum(weights) == 100, weights
    cli = (ROOT / "minillm" / "labs" / "__main__.py").read_text()
    for command in set(re.findall(r"python -m minillm\.labs ([\w-]+)", text)):
        if re.fullmatch(r"ch(NN|\d\d)", command):
            assert 'argv[0].startswith("ch")' in cli
        else:
            assert f'argv[0] == "{command}"' in cli, f"`python -m minillm.labs {command}`: no such"
    for dotted in set(re.findall(r"`(minillm(?:\.\w+)+)", text)):
        module, _, name = dotted.rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = importlib.util.find_spec(dotted) is not None
        assert found, f"instructor_guide.md names {dotted}, which minillm does not have"


def test_the_engines_appendix_names_each_knob_for_every_engine() -> None:
    """appendix_engines.md is on the site and linked from the landing page and the README; each
    engine's docs are cited; every table of its knob sections has a row for minillm and one per
    engine; and the minillm names it gives are the engine's real ones (EngineConfig fields,
    `minillm serve` flags, /metrics names), so the page cannot drift from the code."""
    from dataclasses import fields

    from minillm.config import EngineConfig

    text = (BOOK / "appendix_engines.md").read_text()
    assert "appendix_engines" in re.findall(r"file:\s*(\S+)", (BOOK / "_toc.yml").read_text())
    assert "](appendix_engines.md)" in (BOOK / "intro.md").read_text()
    assert "appendix_engines.md" in (ROOT / "README.md").read_text()
    keys = set(re.findall(r"^@\w+\{([^,]+),", (BOOK / "references.bib").read_text(), re.M))
    for engine, key in ENGINES.items():
        assert key in keys and f"{{cite}}`{key}`" in text, f"cite {engine}'s docs ({key})"
    knobs = text.split("## The book's knobs")[1].split("## What minillm leaves out")[0]
    for section in knobs.split("\n### ")[1:]:
        rows = [line.split("|")[1].strip() for line in section.splitlines()
                if line.startswith("| ") and not line.startswith("| engine")]
        assert [r.split(" (")[0] for r in rows] == ["minillm", *ENGINES], section.splitlines()[0]
    for target in re.findall(r"\{doc\}`([^`<]+)`", text):
        assert (BOOK / f"{target}.ipynb").is_file() or (BOOK / f"{target}.md").is_file(), target

    minillm_rows = [line for line in knobs.splitlines() if line.startswith("| minillm")]
    settings = " ".join(row.split("|")[2] for row in minillm_rows)  # the setting column
    config = {f.name for f in fields(EngineConfig)}
    for name in re.findall(r"`([a-z]+_[a-z_]+)(?:=[^`]*)?`", settings):  # not values: `fcfs`
        assert name in config, f"appendix: minillm has no EngineConfig.{name}"
    minillm_rows = "\n".join(minillm_rows)
    flags = "".join((ROOT / "minillm" / path).read_text()
                    for path in ["serve/__main__.py", "bench/serve.py"])
    for flag in re.findall(r"`(--[a-z-]+)`", minillm_rows):
        assert f'"{flag}"' in flags, f"appendix: neither `minillm serve` nor its bench has {flag}"
    metrics = (ROOT / "minillm" / "serve" / "prometheus.py").read_text()
    for metric in re.findall(r"`(vllm:[a-z_]+)`", minillm_rows):
        assert f'"{metric}"' in metrics, f"appendix: minillm's /metrics has no {metric}"


# ------------------------------------------------------------------------------- grading

def write_notebook(path: Path, cells: list[tuple[str, str]]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(textwrap.dedent(src)) for kind, src in cells]
    nbformat.write(nb, path)
    return path


RIGHT_BLOCKS = """
    from minillm.labs import check
    def blocks_needed(num_tokens, block_size):
        return -(-num_tokens // block_size)
    check("00.2", blocks_needed)
"""


def labs(*args: str, cwd: Path = ROOT, pythonpath: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MINILLM_LABS_RESULTS", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "minillm.labs", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_grade_reports_every_exercise_of_the_notebook_in_one_table(tmp_path: Path) -> None:
    notebook = write_notebook(tmp_path / "00_student.ipynb", [
        ("md", "# 00 — a student's copy\n\n**00.3 (open-ended).** Step it by hand."),
        ("code", RIGHT_BLOCKS),
        ("code", """
            def my_tpot(metrics):  # a common mistake: n gaps instead of n - 1
                t = metrics.token_times
                return (t[-1] - t[0]) / len(t)
            check("00.1", my_tpot)
        """),
        ("code", "raise RuntimeError('a later cell breaks')\ncheck('01.1', None)"),
    ])
    done = labs("grade", str(notebook))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if re.match(r"\d\d\.\d+ ", line)}
    assert rows["00.1"] == "FAIL" and "n - 1" in out, out
    assert rows["00.2"] == "PASS", out
    assert rows["00.3"] == "OPEN-ENDED", out
    assert rows["01.1"] == "NOT" and "did not run" in out, out  # "NOT RUN"
    chapter_01 = [i for i in EXERCISES if i.startswith("01.")]
    assert set(chapter_01) <= set(rows), "every graded exercise of a chapter it touches"
    assert "1 of " in out and "RuntimeError: a later cell breaks" in out


@needs_solutions
def test_graders_never_import_the_reference_solutions() -> None:
    """Every reference solution passes its grader with minillm.labs.solutions blocked from
    import: a grader that reached for a solution would fail here."""
    code = textwrap.dedent("""
        import sys
        from minillm.labs.solutions import SOLUTIONS
        for name in [m for m in sys.modules if m.startswith("minillm.labs.solutions")]:
            del sys.modules[name]

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.startswith("minillm.labs.solutions"):
                    raise ImportError(f"a grader imported {name}")

        sys.meta_path.insert(0, Block())
        from minillm.labs.check import verdict
        verdicts = {i: verdict(i, f) for i, f in SOLUTIONS.items()}
        bad = {i: message for i, (passed, message) in verdicts.items() if not passed}
        assert not bad, bad
        assert not [m for m in sys.modules if m.startswith("minillm.labs.solutions")]
        print("graded", len(SOLUTIONS))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"graded {len(EXERCISES)}" in done.stdout


@needs_solutions
def test_a_copy_without_solutions_still_grades(tmp_path: Path) -> None:
    handout = tmp_path / "handout"
    for part in ["minillm", "tests", "widgets"]:
        shutil.copytree(ROOT / part, handout / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", handout)
    (handout / ".git").mkdir()  # a clone's history holds the solutions too
    done = labs("strip-solutions", str(handout))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (handout / "minillm" / "labs" / "solutions").exists()
    assert not (handout / ".git").exists()
    assert (handout / "tests" / "test_labs.py").exists(), "test_labs.py runs without solutions"
    for test in (handout / "tests").glob("*.py"):
        assert not re.search(r"^(from|import) minillm\.labs\.solutions", test.read_text(), re.M)

    # The student's answers: chapter 00's reference solutions, pasted in as a student would
    # (the handout has no solutions package to import them from).
    pasted = (ROOT / "minillm" / "labs" / "solutions" / "ch00.py").read_text()
    notebook = write_notebook(handout / "00_student.ipynb", [
        ("code", "import importlib.util\n"
                 "assert importlib.util.find_spec('minillm.labs.solutions') is None\n"
                 f"import minillm\nassert minillm.__file__.startswith({str(handout)!r})"),
        ("code", pasted),
        ("code", "from minillm.labs import check\n"
                 "for exercise_id, answer in SOLUTIONS.items():\n"
                 "    check(exercise_id, answer)")])
    graded = labs("grade", str(notebook), cwd=handout, pythonpath=handout)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    count = len([i for i in EXERCISES if i.startswith("00.")])
    assert f"{count} of {count} graded exercises pass" in graded.stdout, graded.stdout
    assert "cells that raised" not in graded.stdout, graded.stdout

    gone = labs("answers", "ch00", cwd=handout, pythonpath=handout)
    assert gone.returncode == 2 and "no reference solutions" in gone.stdout


@needs_solutions
def test_strip_solutions_refuses_the_checkout_it_runs_from(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    assert main(["strip-solutions", str(ROOT)]) == 2
    assert "strip a copy" in capsys.readouterr().out
    assert (ROOT / "minillm" / "labs" / "solutions").is_dir()


# ------------------------------------------------------------------------ model answers

def open_ended_exercises() -> list[str]:
    return sorted({i for path in CHAPTERS for i in OPEN_ENDED.findall(markdown_of(path))})


@needs_solutions
@pytest.mark.parametrize("chapter", sorted({i.split(".")[0] for i in EXERCISES}))
def test_answers_print_solutions_and_model_answers(chapter: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from minillm.labs.handout import answers

    assert main(["answers", f"ch{chapter}"]) == 0
    out = capsys.readouterr().out
    assert out == answers(chapter)
    for exercise_id in [i for i in EXERCISES if i.startswith(chapter + ".")]:
        assert f"## {exercise_id} (graded)" in out and "def " in out
    module = __import__(f"minillm.labs.solutions.ch{chapter}", fromlist=["_"])
    for exercise_id, text in getattr(module, "MODEL_ANSWERS", {}).items():
        assert f"## {exercise_id} (open-ended)" in out and text.strip() in out


@needs_solutions
def test_every_open_ended_exercise_has_a_model_answer() -> None:
    """Each '(open-ended)' exercise of a chapter has an entry in MODEL_ANSWERS of
    minillm/labs/solutions/chNN.py: a model answer or a rubric an instructor grades by."""
    from minillm.labs.solutions import ch00  # noqa: F401  (the package is there)

    missing = []
    for exercise_id in open_ended_exercises():
        module = __import__(f"minillm.labs.solutions.ch{exercise_id[:2]}", fromlist=["_"])
        answer = getattr(module, "MODEL_ANSWERS", {}).get(exercise_id, "")
        if len(answer.split()) < 20:
            missing.append(exercise_id)
    assert open_ended_exercises(), "the chapters have open-ended exercises"
    assert not missing, f"no model answer (MODEL_ANSWERS, 20+ words) for {missing}"
