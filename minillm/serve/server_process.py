"""A minillm server in a process of its own, for measurements over HTTP.

start_server (minillm.serve) runs the server on a thread of the caller's process. That is
handy in a test, but a benchmark driven from the same process then measures the client, the
server's event loop and the engine contending for one interpreter and one GIL. ServerProcess
runs `python -m minillm.serve` (the `minillm serve` command) as a child process instead, on a
free loopback port, and waits until GET /health answers.

The child is always stopped: by close(), on leaving a `with` block, when the object is garbage
collected, at interpreter exit, and (on Linux) by the kernel if the parent dies first, so a
failed notebook cell or a killed kernel leaves no server behind holding a port and a core.

It also times start-up on its own: `start_up` runs from the process start to the first /health
that answers 200 (interpreter, imports, model load, binding the port), which a benchmark
must never mix into its first request's TTFT.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from minillm.calc import machine

_RESERVED_FLAGS = ("--host", "--port")
# The banner `minillm serve` prints once its model is loaded (minillm/serve/__main__.py).
_MODEL_LOADED = re.compile(r"model loaded in ([0-9.]+) s")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on host that no socket holds now (the OS picks it). Another process could
    take it before the server binds it; ServerProcess retries on a fresh port if so."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def die_with_parent() -> None:  # runs in the child between fork and exec
    """Linux: ask the kernel to send this process SIGTERM when its parent dies. (Strictly, when
    the parent's thread that started it ends: start a ServerProcess from a thread that outlives
    it, as a notebook's cells and a test's body are.)"""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: close() and the finalizer still stop it
        pass


def first_error(log: str) -> str:
    """The first line of log that names an exception ("ValueError: ..."), as ": LINE": a server
    of several processes (vLLM's) prints its cause long before its last words."""
    match = re.search(r"^.*?\b(\w+(?:Error|Exception): .+)$", log, re.M)
    return f": {match.group(1)[:500]}" if match else ""


def _stop(proc: subprocess.Popen, log: IO[bytes], grace: float) -> None:
    """SIGTERM (the server's graceful shutdown), SIGKILL after `grace` seconds; close the log."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        log.close()


def child_env(torch_threads: int | None) -> dict[str, str]:
    """The child's environment: this process's, with minillm importable from where this one
    imported it (whatever the working directory), and its torch thread count pinned if asked."""
    env = dict(os.environ)
    home = str(Path(__file__).resolve().parents[2])  # the folder holding minillm/
    env["PYTHONPATH"] = os.pathsep.join([home, *filter(None, [env.get("PYTHONPATH")])])
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(torch_threads)
    return env


def default_torch_threads() -> int | None:
    """1 on a CPU with two cores or fewer (machine.settle_threads' rule: a second torch thread
    stalls whenever another process holds a core, and the client is that process); else the
    child's own default."""
    return 1 if machine.device() == "cpu" and (os.cpu_count() or 1) <= 2 else None


class ServerProcess:
    """`python -m minillm.serve ARGS` in a child process on a free loopback port (see the module
    docstring). Use as a context manager, or call close(); either way the child is stopped.

    args: the server's flags (`["--max-num-seqs", "16"]`), without --host or --port.
    url, port, pid; start_up: seconds from starting the process to /health answering;
    model_load: the seconds the server itself reports for loading its model (None if it did not
    say). timeout: how long start-up may take before the child is stopped and RuntimeError raised.
    """

    def __init__(self, args: Sequence[str] = (), *, host: str = "127.0.0.1",
                 timeout: float = 120.0, torch_threads: int | None | str = "auto",
                 attempts: int = 3):
        args = [str(a) for a in args]
        reserved = [a for a in args if a.split("=")[0] in _RESERVED_FLAGS]
        if reserved:
            raise ValueError(f"ServerProcess picks the host and a free port itself; drop "
                             f"{reserved} from args (pass host=... for another address)")
        if not timeout > 0 or attempts < 1:
            raise ValueError(f"timeout must be > 0 s and attempts >= 1, got {timeout!r}, "
                             f"{attempts!r}")
        threads = default_torch_threads() if torch_threads == "auto" else torch_threads
        self.host, self.args = host, args
        self.start_up = float("nan")
        self.model_load: float | None = None
        self._finalizer: weakref.finalize | None = None
        for attempt in range(attempts):
            started = self._launch(self.environment(threads))
            ready = self._wait_for_health(started, timeout)
            if ready:
                self.start_up = time.perf_counter() - started
                loaded = _MODEL_LOADED.search(self.log())
                self.model_load = float(loaded.group(1)) if loaded else None
                return
            log = self.log()
            taken = "address already in use" in log.lower()
            self.close()
            if not (taken and attempt + 1 < attempts):  # another process took the port: retry
                raise RuntimeError(f"the server did not answer /health on {self.url} within "
                                   f"{timeout:g} s (exit status {self._proc.returncode})"
                                   f"{first_error(log)}; its output ends:\n{log[-2000:]}")

    def _launch(self, env: dict[str, str]) -> float:
        self.port = free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks
        started = time.perf_counter()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        self.pid = self._proc.pid
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._log, 15.0)
        return started

    def environment(self, torch_threads: int | None) -> dict[str, str]:
        """The child's environment (child_env); another server's launcher adds its own."""
        return child_env(torch_threads)

    def command(self) -> list[str]:
        """The child's command line: `python -m minillm.serve ARGS --host H --port P`."""
        return [sys.executable, "-m", "minillm.serve", *self.args, "--host", self.host,
                "--port", str(self.port)]

    def _wait_for_health(self, started: float, timeout: float) -> bool:
        """Poll /health every 20 ms until it answers 200 (True), or the child exits or the
        timeout passes (False)."""
        while time.perf_counter() - started < timeout:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as reply:
                    if reply.status == 200:
                        return True
            except OSError:  # not listening yet (refused), or not answering yet
                pass
            time.sleep(0.02)
        return False

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def log(self) -> str:
        """What the server has printed so far (stdout and stderr)."""
        if self._log.closed:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 15 s); safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else f"stopped ({self._proc.returncode})"
        return f"ServerProcess({self.url}, pid {self.pid}, {state})"
