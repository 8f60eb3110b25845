"""The GPU run's report: DIR/gpu-bench.json and DIR/gpu-bench.md, rewritten after every part.

A run on a lent GPU may be cut at any moment, so Run writes what it has after each part: the
figures so far, and notes (the device, each part's seconds, a failed part's error, each
check's summary). minillm.bench.gpu runs the parts and re-exports both names.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from minillm.bench import gpu_checks, kernels
from minillm.bench.kernels import Figure


def write_report(out: Path, figures: list[Figure], notes: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {"notes": notes, "figures": [f.as_dict() for f in figures]}
    (out / "gpu-bench.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# minillm GPU benchmark", ""] + [f"- {k}: {v}" for k, v in notes.items()]
    (out / "gpu-bench.md").write_text("\n".join(lines + ["", kernels.format_table(figures), ""]))


class Run:
    """The report so far: every part adds figures or notes and rewrites it at once."""

    def __init__(self, out: Path, notes: dict[str, object]) -> None:
        self.out, self.notes = out, notes
        self.figures: list[Figure] = []
        self.ok = True

    def part(self, name: str, fn: Callable[[], list[Figure]]) -> None:
        """Run one part, note its seconds, rewrite the report. A part that fails is noted,
        with its traceback printed, and the run goes on: one failure must not cost the
        other figures."""
        start = time.perf_counter()
        try:
            new = fn()
        except Exception as error:
            traceback.print_exc()
            self.notes[f"{name} failed"] = f"{type(error).__name__}: {error}"
            self.ok, new = False, []
        self.notes[f"seconds: {name}"] = round(time.perf_counter() - start, 1)
        self.figures += new
        write_report(self.out, self.figures, self.notes)
        for f in new:
            print(f"{f.name}: {kernels.number(f.value)} {f.unit}, {f.ratio:.2f} x "
                  f"{f.baseline_name}", flush=True)

    def check(self, name: str, fn: Callable[[], gpu_checks.CheckResult]) -> None:
        """A part whose outcome is a check (tests, a chapter): a note, not a figure."""
        def noted() -> list[Figure]:
            result = fn()
            self.notes[name] = result.summary()
            self.ok &= result.ok
            print(f"{name}: {result.summary()}", flush=True)
            return []
        self.part(name, noted)
