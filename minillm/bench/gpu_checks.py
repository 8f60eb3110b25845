"""The GPU run's checks beside its figures: the GPU tests, and one chapter under nbval.

Both run as pytest subprocesses from the source tree, their logs and JUnit XML written under
the run's folder, so a reader of the folder sees which tests held on this GPU. The pyproject's
addopts are dropped (`-o addopts=`): they name nbval and xdist, which a lent GPU machine may not
have. Without nbval and ipykernel the chapter's code cells run through `bench chapters`, which
needs no Jupyter, and the note says so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from minillm.bench import chapters

ROOT = chapters.ROOT
GPU_TESTS = "gpu or kernels"  # the markers of tests that run on CUDA when it is there


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: tests counted from its JUnit XML, or a failure to run at all."""

    name: str
    passed: int
    failed: int
    skipped: int
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0

    def summary(self) -> str:
        return (f"{self.passed} passed, {self.failed} failed or errored, {self.skipped} skipped "
                f"in {self.seconds:.0f} s" + (f" ({self.detail})" if self.detail else ""))


def junit_counts(xml: Path) -> tuple[int, int, int]:
    """(passed, failed + errored, skipped) from pytest's JUnit XML."""
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total, failed, skipped = 0, 0, 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def run_pytest(name: str, pytest_args: list[str], out: Path, timeout: float) -> CheckResult:
    """pytest in a fresh Python at the repository root; out/NAME.log and out/NAME.xml."""
    out.mkdir(parents=True, exist_ok=True)
    xml, log = out / f"{name}.xml", out / f"{name}.log"
    xml.unlink(missing_ok=True)
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
               "-v", f"--junitxml={xml}", *pytest_args]  # -v: a cut log still names each test
    start = time.perf_counter()
    with log.open("w") as stream:
        stream.write(" ".join(command) + "\n")
        stream.flush()
        try:
            subprocess.run(command, cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT,
                           timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return CheckResult(name, 0, 1, 0, time.perf_counter() - start,
                               f"timed out after {timeout:.0f} s: see {log.name}")
    seconds = time.perf_counter() - start
    if not xml.exists():
        return CheckResult(name, 0, 1, 0, seconds, f"pytest wrote no report: see {log.name}")
    return CheckResult(name, *junit_counts(xml), seconds, f"see {log.name}")


def gpu_test_files(root: Path) -> list[Path]:
    """The test modules that mark tests gpu or kernels. Only these are collected: the others
    (a server's tests need FastAPI, which a GPU machine may lack) would be import errors."""
    return [path for path in sorted((root / "tests").glob("test_*.py"))
            if any(f"pytest.mark.{mark}" in path.read_text() for mark in ("gpu", "kernels"))]


def gpu_tests(out: Path, timeout: float = 240.0) -> CheckResult:
    """Every test marked gpu or kernels. Where Hypothesis is missing its property tests skip
    (hypothesis_stand_in) and the rest run; a module that fails to import is an error in the
    count, and the other modules still run."""
    files = [str(path.relative_to(ROOT)) for path in gpu_test_files(ROOT)]
    return run_pytest("gpu-tests", ["-p", "minillm.bench.hypothesis_stand_in", "-m", GPU_TESTS,
                                    "--continue-on-collection-errors", *files], out, timeout)


def has_nbval() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("nbval", "ipykernel"))


def chapter_under_nbval(chapter: str, out: Path, timeout: float = 200.0) -> CheckResult:
    """One chapter as the test suite runs it (nbval-lax: a cell passes when it raises nothing);
    through `bench chapters` where nbval or ipykernel is missing."""
    path = ROOT / "chapters" / f"{chapter}.ipynb"
    if has_nbval():
        return run_pytest(f"chapter-{chapter}", ["--nbval-lax", "--nbval-current-env",
                                                 str(path.relative_to(ROOT))], out, timeout)
    run = chapters.run_all([path], out, timeout)[0]
    return CheckResult(f"chapter-{chapter}", run.passed, len(run.failures), 0, run.seconds,
                       "nbval or ipykernel missing here: its code cells ran through "
                       "`bench chapters`, see chapters.log")
