"""Ahead-of-time compilation of Triton kernels for a named GPU, in a fresh interpreter.

The kernel tests switch Triton's CPU interpreter on (TRITON_INTERPRET=1) before triton is first
imported, and an interpreted kernel cannot be compiled; so a compile check runs its function's
source in a subprocess with the interpreter off. No GPU is needed: triton.compile targets a
compute capability by name.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_in_subprocess(fn: Callable[..., None], *args: object) -> None:
    """Run fn(*args) from fn's own source (fn must import what it uses), interpreter off;
    fail with the subprocess's stderr if it raises."""
    code = f"{inspect.getsource(fn)}\n{fn.__name__}({', '.join(map(repr, args))})\n"
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, stated to silence its warning
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
