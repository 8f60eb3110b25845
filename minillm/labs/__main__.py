"""python -m minillm.labs chNN: run one chapter's lab tests alone (pytest -m chNN over tests/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith("ch"):
        print("usage: python -m minillm.labs chNN   (e.g. ch00; extra pytest options: use pytest)")
        return 2
    if not TESTS.is_dir():
        print(f"no tests folder at {TESTS}: run this from a source checkout (pip install -e .)")
        return 2
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", argv[0], str(TESTS)]
    return subprocess.call(cmd, cwd=TESTS.parent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
