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

    python -m minillm.bench chapters [NOTEBOOK ...] --out DIR

writes DIR/chapters.json and DIR/chapters.log (every chapter's printed output) and prints one
line per chapter. Where anywidget or traitlets is missing, a stand-in lets `widgets` import:
the chapters show views through their static SVG, never through the live widget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: minillm/bench/chapters.py


@dataclass
class CellFailure:
    """One code cell that raised: its index among the code cells, the exception, and the
    source line it was raised from (an assert's own line, for an AssertionError)."""

    cell: int
    error: str
    line: str


@dataclass
class ChapterRun:
    """One chapter run: code cells in all, how many raised nothing, the failures, seconds."""

    chapter: str
    cells: int = 0
    passed: int = 0
    failures: list[CellFailure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.cells > 0 and not self.failures

    def summary(self) -> str:
        status = "ok" if self.ok else f"{len(self.failures)} cell(s) failed"
        head = (f"{self.chapter}: {self.passed}/{self.cells} code cells passed in "
                f"{self.seconds:.0f} s, {status}")
        return "\n".join([head] + [f"    cell {f.cell}: {f.error}  [{f.line}]"
                                   for f in self.failures])


def chapter_paths(root: Path = ROOT) -> list[Path]:
    """The chapter notebooks, NN_topic.ipynb, in order."""
    return sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> list[str]:
    """The source of each code cell of a notebook, in order."""
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in notebook["cells"] if cell["cell_type"] == "code"]


class _StandIn:
    """Anything at all: a class to subclass, a trait to .tag(), a decorator that keeps the
    function it decorates. Enough for `widgets` to import without anywidget."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        return args[0] if len(args) == 1 and callable(args[0]) else _StandIn()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # no __file__, __wrapped__...: inspect must not be fooled
            raise AttributeError(name)
        return _StandIn()


def _module_attribute(name: str) -> type[_StandIn]:
    if name.startswith("__"):  # inspect.getmodule reads every module's __file__
        raise AttributeError(name)
    return _StandIn


def _stand_in_for_missing(names: list[str]) -> list[str]:
    """Put a stand-in module in sys.modules for each name that cannot be imported."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__getattr__ = _module_attribute  # type: ignore[method-assign]
            sys.modules[name] = module
            missing.append(name)
    return missing


def _failure(index: int, source: str, error: BaseException) -> CellFailure:
    lines = source.splitlines()
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<cell>"]
    lineno = frames[-1].lineno if frames else None
    line = lines[lineno - 1].strip() if lineno and lineno <= len(lines) else ""
    message = str(error).strip().splitlines()
    return CellFailure(index, f"{type(error).__name__}: {message[0] if message else ''}"[:300],
                       line[:200])


def run_chapter(path: Path) -> ChapterRun:
    """Run one notebook's code cells in this process (cwd: the notebook's folder)."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # plt.show() draws nothing, raises nothing
    _stand_in_for_missing(["anywidget", "traitlets"])
    run = ChapterRun(path.stem)
    namespace: dict[str, object] = {"__name__": "__main__"}
    start = time.perf_counter()
    os.chdir(path.parent)
    for index, source in enumerate(code_cells(path)):
        run.cells += 1
        print(f"--- {path.stem}, code cell {index}", flush=True)
        try:
            exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - our own notebooks
            run.passed += 1
        except Exception as error:  # a failed cell is recorded, and the chapter goes on
            traceback.print_exc()
            run.failures.append(_failure(index, source, error))
    run.seconds = time.perf_counter() - start
    return run


def run_in_subprocess(path: Path, timeout: float, log: Path) -> ChapterRun:
    """run_chapter in a fresh Python, its output appended to log; a timeout is a failure."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), MPLBACKEND="Agg")
        start = time.perf_counter()
        with log.open("a") as out:
            try:
                subprocess.run([sys.executable, "-m", "minillm.bench.chapters", "--one",
                                str(path), "--result", str(result)], stdout=out,
                               stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                return ChapterRun(path.stem, failures=[CellFailure(
                    -1, f"timed out after {timeout:.0f} s", "")],
                    seconds=time.perf_counter() - start)
        if not result.exists():
            return ChapterRun(path.stem, failures=[CellFailure(
                -1, f"the chapter's Python exited without a result: see {log.name}", "")],
                seconds=time.perf_counter() - start)
        data = json.loads(result.read_text())
        data["failures"] = [CellFailure(**f) for f in data["failures"]]
        return ChapterRun(**data)


def run_all(paths: list[Path], out: Path, timeout: float = 240.0) -> list[ChapterRun]:
    """Run each chapter in its own subprocess; write out/chapters.json after each one."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "chapters.log"
    log.write_text("")
    runs: list[ChapterRun] = []
    for path in paths:
        runs.append(run_in_subprocess(path, timeout, log))
        print(runs[-1].summary(), flush=True)
        (out / "chapters.json").write_text(json.dumps(
            [dict(asdict(r), ok=r.ok) for r in runs], indent=2) + "\n")
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="chapter notebooks (default: every chapters/NN_*.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="folder for chapters.json and chapters.log")
    parser.add_argument("--timeout", type=float, default=240.0,
                        help="seconds one chapter may take (default 240)")


def main(args: argparse.Namespace) -> int:
    """0 when every chapter ran with no failed cell, else 1."""
    runs = run_all(args.notebooks or chapter_paths(), args.out, args.timeout)
    return 0 if runs and all(r.ok for r in runs) else 1


if __name__ == "__main__":  # one chapter, in the subprocess run_in_subprocess starts
    one = argparse.ArgumentParser()
    one.add_argument("--one", type=Path, required=True)
    one.add_argument("--result", type=Path, required=True)
    ns = one.parse_args()
    chapter = run_chapter(ns.one.resolve())
    ns.result.write_text(json.dumps(asdict(chapter)))
