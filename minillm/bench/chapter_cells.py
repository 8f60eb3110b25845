"""One chapter's code cells run in this process, in order in one namespace, as a kernel would:
the records of each cell (seconds, ok or the error and the line it was raised from) and the
stand-in that lets `widgets` import where anywidget or traitlets is missing.

minillm.bench.chapters runs each chapter in a subprocess of its own through run_chapter, and
re-exports these names.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class CellFailure:
    """One code cell that raised: its index among the code cells (None when the chapter died
    outside any cell), the exception, and the source line it was raised from (an assert's own
    line, for an AssertionError)."""

    cell: int | None
    error: str
    line: str

    @property
    def where(self) -> str:
        return "outside any cell" if self.cell is None else f"cell {self.cell}"


@dataclass
class CellRecord:
    """One code cell run: its index among the code cells, the notebook's cell id, seconds, and
    whether it raised nothing (else the error and its line, as in CellFailure)."""

    index: int
    id: str
    seconds: float
    ok: bool
    error: str = ""
    line: str = ""


@dataclass
class ChapterRun:
    """One chapter run: code cells in all, how many raised nothing, the failures, seconds, each
    cell run (records), the timeout it ran under, and the cell it was in (None: it finished)."""

    chapter: str
    cells: int = 0
    passed: int = 0
    failures: list[CellFailure] = field(default_factory=list)
    seconds: float = 0.0
    records: list[CellRecord] = field(default_factory=list)
    timeout: float | None = None
    current: int | None = None

    @property
    def ok(self) -> bool:
        return self.cells > 0 and not self.failures

    def summary(self) -> str:
        status = "ok" if self.ok else f"{len(self.failures)} cell(s) failed"
        head = (f"{self.chapter}: {self.passed}/{self.cells} code cells passed in "
                f"{self.seconds:.0f} s, {status}")
        return "\n".join([head] + [f"    {f.where}: {f.error}  [{f.line}]" for f in self.failures])

    @classmethod
    def from_json(cls, data: dict) -> ChapterRun:
        data = dict(data)
        data.pop("ok", None)
        data["failures"] = [CellFailure(**f) for f in data.get("failures", [])]
        data["records"] = [CellRecord(**r) for r in data.get("records", [])]
        return cls(**data)


def notebook_code_cells(path: Path) -> list[tuple[str, str]]:
    """The (id, source) of each code cell of a notebook, in order ("" where a cell has no id)."""
    notebook = json.loads(path.read_text())
    return [(str(cell.get("id", "")),
             "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
            for cell in notebook["cells"] if cell["cell_type"] == "code"]


def code_cells(path: Path) -> list[str]:
    """The source of each code cell of a notebook, in order."""
    return [source for _, source in notebook_code_cells(path)]


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


def write_json(path: Path, data: object) -> None:
    """Write whole or not at all: a chapter killed mid-write leaves the last complete result."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run_chapter(path: Path, result: Path | None = None) -> ChapterRun:
    """Run one notebook's code cells in this process (cwd: the notebook's folder); with result,
    write the run so far there before and after every cell."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # plt.show() draws nothing, raises nothing
    _stand_in_for_missing(["anywidget", "traitlets"])
    cells = notebook_code_cells(path)
    run = ChapterRun(path.stem, cells=len(cells))
    namespace: dict[str, object] = {"__name__": "__main__"}
    start = time.perf_counter()
    os.chdir(path.parent)
    for index, (cell_id, source) in enumerate(cells):
        run.current = index
        run.seconds = time.perf_counter() - start
        if result is not None:
            write_json(result, asdict(run))
        print(f"--- {path.stem}, code cell {index} ({cell_id})", flush=True)
        began = time.perf_counter()
        try:
            exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - our own notebooks
            run.passed += 1
            run.records.append(CellRecord(index, cell_id, time.perf_counter() - began, True))
        except Exception as error:  # a failed cell is recorded, and the chapter goes on
            traceback.print_exc()
            failure = _failure(index, source, error)
            run.failures.append(failure)
            run.records.append(CellRecord(index, cell_id, time.perf_counter() - began, False,
                                          failure.error, failure.line))
    run.current = None
    run.seconds = time.perf_counter() - start
    if result is not None:
        write_json(result, asdict(run))
    return run


def cell_id(path: Path, index: int) -> str:
    cells = notebook_code_cells(path)
    return cells[index][0] if 0 <= index < len(cells) else ""
