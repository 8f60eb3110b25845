"""Run every chapter's code cells outside Jupyter and report which cells, and which asserts, held.

The chapters run under nbval in the test suite, which needs a Jupyter kernel. A GPU machine
lent for a few minutes often has Python, torch and matplotlib but no Jupyter stack, and the
question there is the same: does each chapter run unchanged on this device, and which of its
checks hold? So this runs each notebook's code cells in order in one namespace, as a kernel
would, in a subprocess per chapter (one chapter's memory is freed before the next starts). A
cell passes when it raises nothing, as under `nbval-lax`. Unlike nbval it goes on after a
failed cell and records every failure with its exception, so one assert that misses on a new
device does not hide the others (a later cell that needed the failed one's variables fails
too, and is recorded as such).

    python -m minillm.bench chapters [NOTEBOOK ...] --out DIR [--budget 450] [--timeout 240]
                                     [--gpu-shaped bf16|fp16 [--attention triton]]

writes DIR/chapters.json (the device, the shape, and per chapter and per code cell: its index,
the notebook's cell id, seconds, ok or the error and the line it was raised from),
DIR/chapters.md (the same as a table to read) and DIR/chapters.log (every chapter's printed
output), and prints one line per chapter.

The budget keeps a lent machine's run short: each chapter's timeout is what is left of the
budget over the chapters left (at least 30 s, at most --timeout), so one slow chapter cannot
eat the whole run. The child writes its partial result before and after every cell, so a
chapter that times out still reports the cells it finished and the cell it was in.
--gpu-shaped runs on the CPU with a GPU's rules (minillm.device); --attention triton makes it
build the Triton kernels as a GPU would, run by Triton's interpreter (20x slower than torch's
attention or more: name the chapters; 00 passes in 4 minutes). Where anywidget or
traitlets is missing, a stand-in lets `widgets` import: the chapters show views through their
static SVG, never through the live widget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

# The in-process runner; its names are re-exported (the tests and gpu_checks read them here).
from minillm.bench.chapter_cells import CellFailure as CellFailure
from minillm.bench.chapter_cells import CellRecord as CellRecord
from minillm.bench.chapter_cells import ChapterRun as ChapterRun
from minillm.bench.chapter_cells import _stand_in_for_missing as _stand_in_for_missing
from minillm.bench.chapter_cells import cell_id, write_json
from minillm.bench.chapter_cells import code_cells as code_cells
from minillm.bench.chapter_cells import notebook_code_cells as notebook_code_cells
from minillm.bench.chapter_cells import run_chapter as run_chapter
from minillm.device import GPU_SHAPED_ATTENTION_ENV, GPU_SHAPED_ENV, SHAPES, capabilities

ROOT = Path(__file__).resolve().parents[2]  # the repository: minillm/bench/chapters.py
MIN_CHAPTER_TIMEOUT = 30.0  # seconds: no chapter gets less, whatever is left of the budget


def chapter_paths(root: Path = ROOT) -> list[Path]:
    """The chapter notebooks, NN_topic.ipynb, in order."""
    return sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb"))


def chapter_timeout(budget_left: float, chapters_left: int, timeout: float,
                    floor: float = MIN_CHAPTER_TIMEOUT) -> float:
    """A chapter's timeout: what is left of the budget shared by the chapters left, at least
    floor seconds and at most timeout. While every chapter stays within its share, the share
    never shrinks, so the run ends within the budget (plus each child's start and kill)."""
    share = budget_left / max(chapters_left, 1)
    return min(timeout, max(floor, share))


def shaped_environment(gpu_shaped: str | None, attention: str = "torch") -> dict[str, str]:
    """The environment variables that give a chapter's Python this shape (none: the device's
    own rules). attention "triton" turns Triton's interpreter on before anything imports it."""
    if gpu_shaped is None:
        if attention != "torch":
            raise ValueError("--attention triton is for a GPU-shaped run (on a GPU the Triton "
                             "kernels are what attention='auto' builds already)")
        return {}
    env = {GPU_SHAPED_ENV: gpu_shaped, GPU_SHAPED_ATTENTION_ENV: attention}
    if attention == "triton":
        env["TRITON_INTERPRET"] = "1"
    return env


def run_in_subprocess(path: Path, timeout: float, log: Path, gpu_shaped: str | None = None,
                      attention: str = "torch") -> ChapterRun:
    """run_chapter in a fresh Python, its output appended to log; a timeout is a failure of the
    cell it was in, reported with the cells it finished.
    gpu_shaped: "bf16" or "fp16" to run the chapter with a GPU's rules (minillm.device), with
    the torch attention backend or, attention="triton", the interpreted Triton kernels."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), MPLBACKEND="Agg")
        for name in (GPU_SHAPED_ENV, GPU_SHAPED_ATTENTION_ENV):
            env.pop(name, None)
        env.update(shaped_environment(gpu_shaped, attention))
        start = time.perf_counter()
        timed_out = False
        with log.open("a") as out:
            try:
                subprocess.run([sys.executable, "-m", "minillm.bench.chapters", "--one",
                                str(path), "--result", str(result), "--cells"], stdout=out,
                               stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                timed_out = True
        seconds = time.perf_counter() - start
        run = (ChapterRun.from_json(json.loads(result.read_text())) if result.exists()
               else ChapterRun(path.stem))
        in_child = run.seconds  # to the start of the cell it was in, if it was killed
        run.timeout, run.seconds = timeout, seconds
        if timed_out:
            cell = run.current
            error = f"timed out after {timeout:.0f} s" + (f" in cell {cell}" if cell is not None
                                                           else "")
            run.failures.append(CellFailure(cell, error, ""))
            if cell is not None:
                run.records.append(CellRecord(cell, cell_id(path, cell),
                                              max(0.0, seconds - in_child), False, error))
        elif not result.exists() or run.current is not None:
            where = f" in cell {run.current}" if run.current is not None else ""
            error = f"the chapter's Python exited without a result{where}: see {log.name}"
            run.failures.append(CellFailure(run.current, error, ""))
        return run


def describe_device(gpu_shaped: str | None, attention: str = "torch") -> str:
    """minillm.device's description of the device the chapters run with (this shape)."""
    shaped = shaped_environment(gpu_shaped, attention)
    names = (GPU_SHAPED_ENV, GPU_SHAPED_ATTENTION_ENV, "TRITON_INTERPRET")
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        os.environ.update(shaped)
        return capabilities().describe()
    finally:
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(saved)


def report_markdown(report: dict) -> str:
    """chapters.json as a table to read: chapter, cells passed, seconds, failures."""
    lines = [(f"# bench chapters: {report['passed']}/{report['cells']} code cells passed in "
              f"{report['seconds']:.0f} s"), "",
             f"- device: {report['device']}",
             f"- GPU-shaped: {report['gpu_shaped'] or 'no'}, attention "
             f"{report.get('attention', 'torch')}",
             f"- budget: {report['budget']:.0f} s" if report["budget"] is not None
             else "- budget: none", "",
             "| chapter | cells passed | seconds | timeout | failures |",
             "|---|---|---|---|---|"]
    for run in report["chapters"]:
        ids = {r["index"]: r["id"] for r in run["records"]}
        failures = "<br>".join(
            f"cell {f['cell']} `{ids.get(f['cell'], '')}`: {f['error']}"
            + (f" [`{f['line']}`]" if f["line"] else "") for f in run["failures"])
        timeout = f"{run['timeout']:.0f}" if run["timeout"] is not None else ""
        lines.append(f"| {run['chapter']} | {run['passed']}/{run['cells']} | "
                     f"{run['seconds']:.1f} | {timeout} | "
                     f"{failures.replace('|', chr(92) + '|') or 'ok'} |")
    return "\n".join(lines) + "\n"


def run_all(paths: list[Path], out: Path, timeout: float = 240.0,
            gpu_shaped: str | None = None, budget: float | None = None,
            attention: str = "torch") -> list[ChapterRun]:
    """Run each chapter in its own subprocess; write out/chapters.json and chapters.md after
    each one. budget: seconds for them all (chapter_timeout), None: timeout each."""
    device = describe_device(gpu_shaped, attention)  # refuses a bad shape before any chapter
    out.mkdir(parents=True, exist_ok=True)
    log = out / "chapters.log"
    log.write_text("")
    runs: list[ChapterRun] = []
    start = time.perf_counter()
    for done, path in enumerate(paths):
        left = None if budget is None else budget - (time.perf_counter() - start)
        limit = timeout if left is None else chapter_timeout(left, len(paths) - done, timeout)
        runs.append(run_in_subprocess(path, limit, log, gpu_shaped, attention))
        print(runs[-1].summary(), flush=True)
        report = {"device": device, "gpu_shaped": gpu_shaped, "attention": attention,
                  "budget": budget,
                  "seconds": time.perf_counter() - start,
                  "cells": sum(r.cells for r in runs), "passed": sum(r.passed for r in runs),
                  "chapters": [dict(asdict(r), ok=r.ok) for r in runs]}
        write_json(out / "chapters.json", report)
        (out / "chapters.md").write_text(report_markdown(report))
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="chapter notebooks (default: every chapters/NN_*.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="folder for chapters.json, chapters.md and chapters.log")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds one chapter may take at most (default 240; 900 in a "
                             "GPU-shaped run, whose 16-bit CPU matmuls are slow)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds for all the chapters (default 450, the lent GPU's call): "
                             "each gets what is left over the chapters left, at least "
                             f"{MIN_CHAPTER_TIMEOUT:.0f} s; 0 for no budget (--timeout each, "
                             "as in a GPU-shaped run, which takes minutes a chapter)")
    parser.add_argument("--gpu-shaped", choices=sorted(SHAPES), default=None,
                        help="run on the CPU with a GPU's rules: bf16 as an H200, fp16 as a T4")
    parser.add_argument("--attention", choices=("torch", "triton"), default="torch",
                        help="with --gpu-shaped: the attention backend 'auto' builds; triton "
                             "runs the kernels under Triton's interpreter (slow: name chapters)")


def main(args: argparse.Namespace) -> int:
    """0 when every chapter ran with no failed cell, else 1."""
    shaped = args.gpu_shaped is not None
    if args.attention != "torch" and not shaped:
        raise SystemExit("--attention triton needs --gpu-shaped bf16|fp16: on a GPU the Triton "
                         "kernels are what attention='auto' builds already")
    budget = None if shaped else args.budget or None  # a GPU-shaped run has no lent time to fit
    timeout = args.timeout or (900.0 if shaped else 240.0)
    runs = run_all(args.notebooks or chapter_paths(), args.out, timeout, args.gpu_shaped, budget,
                   args.attention)
    return 0 if runs and all(r.ok for r in runs) else 1


if __name__ == "__main__":  # one chapter, in the subprocess run_in_subprocess starts
    one = argparse.ArgumentParser()
    one.add_argument("--one", type=Path, required=True)
    one.add_argument("--result", type=Path, required=True)
    one.add_argument("--cells", action="store_true",
                     help="per-cell records, written before and after every cell (without it: "
                          "the totals at the end, as a parent started before them reads)")
    ns = one.parse_args()
    if ns.cells:
        run_chapter(ns.one.resolve(), ns.result.resolve())
    else:
        chapter = asdict(run_chapter(ns.one.resolve()))
        ns.result.write_text(json.dumps({k: chapter[k] for k in
                                         ("chapter", "cells", "passed", "failures", "seconds")}))
