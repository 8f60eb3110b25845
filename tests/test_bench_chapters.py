"""`bench chapters`: the chapters' code cells run outside Jupyter, every failure recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from minillm.bench import chapter_cells, chapters


def notebook(path: Path, cells: list[str]) -> Path:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# a chapter\n"]}]
        + [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [],
            "execution_count": None} for src in cells],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_every_failed_cell_is_recorded_and_the_chapter_goes_on(tmp_path: Path) -> None:
    path = notebook(tmp_path / "99_demo.ipynb", [
        "x = 1",
        "y = x + 1\nassert y == 3, f'y is {y}'",
        "z = x + 10",
        "print(undefined_name)",
        "assert z == 11",
    ])
    run = chapters.run_in_subprocess(path, timeout=60, log=tmp_path / "log")
    assert (run.chapter, run.cells, run.passed) == ("99_demo", 5, 3)
    assert [f.cell for f in run.failures] == [1, 3]
    assert run.failures[0].error == "AssertionError: y is 2"
    assert run.failures[0].line == "assert y == 3, f'y is {y}'"
    assert run.failures[1].error.startswith("NameError")
    assert not run.ok and "2 cell(s) failed" in run.summary()
    assert "--- 99_demo, code cell 4" in (tmp_path / "log").read_text()


def test_a_chapter_that_hangs_is_a_timeout_failure(tmp_path: Path) -> None:
    path = notebook(tmp_path / "98_slow.ipynb", ["import time\ntime.sleep(30)"])
    run = chapters.run_in_subprocess(path, timeout=2, log=tmp_path / "log")
    assert not run.ok and "timed out" in run.failures[0].error


def test_run_all_writes_json_after_each_chapter(tmp_path: Path) -> None:
    paths = [notebook(tmp_path / "01_a.ipynb", ["a = 1"]),
             notebook(tmp_path / "02_b.ipynb", ["assert False, 'no'"])]
    runs = chapters.run_all(paths, tmp_path / "out", timeout=60)
    saved = json.loads((tmp_path / "out" / "chapters.json").read_text())["chapters"]
    assert [r.ok for r in runs] == [True, False] == [r["ok"] for r in saved]
    assert saved[1]["failures"][0]["error"] == "AssertionError: no"


def test_stand_in_lets_a_missing_widget_library_import(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "minillm_no_such_widget_library"
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert chapters._stand_in_for_missing([name, "json"]) == [name]
    lib = sys.modules.pop(name)

    class Widget(lib.AnyWidget):  # subclassing, traits and decorators all work
        value = lib.Unicode("").tag(sync=True)

        @lib.observe("value")
        def changed(self) -> str:
            return "kept"

    assert Widget().changed() == "kept"


def test_stand_in_has_no_dunders_for_inspect(monkeypatch: pytest.MonkeyPatch) -> None:
    # inspect.getmodule walks sys.modules reading __file__ (torchvision's registrations do, on
    # import): a stand-in must not answer it with a stand-in.
    import inspect

    name = "minillm_no_such_widget_library"
    monkeypatch.delitem(sys.modules, name, raising=False)
    chapters._stand_in_for_missing([name])
    try:
        assert getattr(sys.modules[name], "__file__", None) is None
        assert not hasattr(sys.modules[name].Anything(), "__wrapped__")
        run_chapter = chapter_cells.run_chapter  # inspect.getmodule walks sys.modules
        assert inspect.getmodule(run_chapter.__code__) is chapter_cells
    finally:
        sys.modules.pop(name)


def test_the_chapters_are_found_in_order() -> None:
    names = [p.stem for p in chapters.chapter_paths()]
    assert names[:3] == ["00_tour", "01_prefill_vs_decode", "02_roofline"]
    assert names == sorted(names)


def test_every_cell_is_recorded_with_its_id_seconds_and_error(tmp_path: Path) -> None:
    path = notebook(tmp_path / "01_a.ipynb", ["a = 1", "assert a == 2, f'a is {a}'"])
    nb = json.loads(path.read_text())
    nb["cells"][1]["id"], nb["cells"][2]["id"] = "first-cell", "the-assert"
    path.write_text(json.dumps(nb))
    chapters.run_all([path], tmp_path / "out", timeout=60, gpu_shaped="fp16")
    report = json.loads((tmp_path / "out" / "chapters.json").read_text())
    assert report["gpu_shaped"] == "fp16" and "T4-shaped" in report["device"]
    records = report["chapters"][0]["records"]
    assert [(r["index"], r["id"], r["ok"]) for r in records] == [
        (0, "first-cell", True), (1, "the-assert", False)]
    assert records[1]["error"] == "AssertionError: a is 1"
    assert records[1]["line"] == "assert a == 2, f'a is {a}'"
    assert all(r["seconds"] >= 0 for r in records)
    table = (tmp_path / "out" / "chapters.md").read_text()
    assert "T4-shaped" in table and "| 01_a | 1/2 |" in table
    assert "cell 1 `the-assert`: AssertionError: a is 1" in table


def test_a_timed_out_chapter_reports_the_cells_it_finished(tmp_path: Path) -> None:
    path = notebook(tmp_path / "98_slow.ipynb", ["a = 1", "b = 2", "import time\ntime.sleep(60)",
                                                 "c = 3"])
    run = chapters.run_in_subprocess(path, timeout=15, log=tmp_path / "log")  # torch imports first
    assert (run.cells, run.passed, run.current) == (4, 2, 2)
    assert [(r.index, r.ok) for r in run.records] == [(0, True), (1, True), (2, False)]
    assert run.failures[-1].cell == 2 and "timed out after 15 s in cell 2" in run.failures[-1].error
    assert run.timeout == 15


def test_the_budget_is_shared_by_the_chapters_left() -> None:
    assert chapters.chapter_timeout(450, 13, 240) == pytest.approx(450 / 13)
    assert chapters.chapter_timeout(400, 2, 240) == 200  # what the fast chapters left
    assert chapters.chapter_timeout(900, 1, 240) == 240  # at most --timeout
    assert chapters.chapter_timeout(10, 5, 240) == 30  # at least 30 s
    assert chapters.chapter_timeout(-5, 1, 240) == 30


def test_run_all_gives_each_chapter_its_share_of_the_budget(tmp_path: Path) -> None:
    paths = [notebook(tmp_path / "01_a.ipynb", ["a = 1"]),
             notebook(tmp_path / "02_b.ipynb", ["b = 1"])]
    runs = chapters.run_all(paths, tmp_path / "out", timeout=240, budget=100)
    assert 49 < runs[0].timeout <= 50 < runs[1].timeout <= 100  # the first left time over
    assert json.loads((tmp_path / "out" / "chapters.json").read_text())["budget"] == 100


def test_the_cli_has_a_budget_of_450_s() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    chapters.add_arguments(parser)
    assert parser.parse_args([]).budget == 450


def test_a_triton_shaped_chapter_builds_the_interpreted_kernels(tmp_path: Path) -> None:
    """--attention triton: the chapter's Python has the interpreter on before triton loads, and
    LLM() builds the Triton backend as a GPU would; without a shape the option is refused."""
    assert chapters.shaped_environment("fp16", "triton") == {
        "MINILLM_GPU_SHAPED": "fp16", "MINILLM_GPU_SHAPED_ATTENTION": "triton",
        "TRITON_INTERPRET": "1"}
    assert chapters.shaped_environment(None) == {}
    with pytest.raises(ValueError, match="GPU-shaped"):
        chapters.shaped_environment(None, "triton")
    path = notebook(tmp_path / "02_t.ipynb", [
        "import os\nassert os.environ['TRITON_INTERPRET'] == '1'",
        "from minillm import LLM, SamplingParams\nllm = LLM(max_num_seqs=2)\n"
        "assert llm.engine.runner.backend.name == 'triton', llm.engine.runner.backend.name",
        "out = llm.generate(['ROMEO:'], SamplingParams(max_tokens=3, temperature=0.0))\n"
        "assert len(out[0].token_ids) == 3"])
    runs = chapters.run_all([path], tmp_path / "out", timeout=300, gpu_shaped="fp16",
                            attention="triton")
    assert runs[0].ok, runs[0].summary()
    report = json.loads((tmp_path / "out" / "chapters.json").read_text())
    assert report["attention"] == "triton" and "(interpreted)" in report["device"]
