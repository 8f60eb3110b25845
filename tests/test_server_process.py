"""ServerProcess: a server in a child process on a free port, always stopped, start-up timed."""

from __future__ import annotations

import gc
import os
import socket
import sys
import textwrap
import urllib.request

import pytest

import minillm
from minillm.serve import server_process
from minillm.serve.server_process import ServerProcess, child_env

# A stand-in for `python -m minillm.serve`: answers /health at once, so these tests take
# milliseconds rather than a model load. It binds --port like the real server (and fails the
# same way when the port is taken).
FAKE_SERVER = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    host, port = sys.argv[sys.argv.index("--host") + 1], int(sys.argv[sys.argv.index("--port") + 1])
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    print("fake: model loaded in 0.25 s", flush=True)
    HTTPServer((host, port), Health).serve_forever()
""")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    def command(self: ServerProcess) -> list[str]:
        return [sys.executable, "-c", FAKE_SERVER, *self.args, "--host", self.host,
                "--port", str(self.port)]
    monkeypatch.setattr(ServerProcess, "command", command)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): it has exited, and only waits to be reaped.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] == "Z"


def test_flags_the_class_owns_are_refused() -> None:
    with pytest.raises(ValueError, match="--port"):
        ServerProcess(["--max-num-seqs", "4", "--port", "8000"])
    with pytest.raises(ValueError, match="--host"):
        ServerProcess(["--host=0.0.0.0"])


def test_serves_health_and_times_start_up(fake: None) -> None:
    with ServerProcess(["--max-num-seqs", "4"]) as s:
        assert urllib.request.urlopen(s.url + "/health", timeout=5).status == 200
        assert s.running and s.model_load == 0.25
        assert 0 < s.start_up < 60
        assert "--max-num-seqs" in s.command() and str(s.port) in s.command()
    assert not s.running


def test_an_error_inside_the_block_still_stops_the_child(fake: None) -> None:
    with pytest.raises(KeyError), ServerProcess() as s:
        pid = s.pid
        raise KeyError("a failing notebook cell")
    assert gone(pid)


def test_a_forgotten_server_is_stopped_when_collected(fake: None) -> None:
    s = ServerProcess()
    pid = s.pid
    del s
    gc.collect()
    assert gone(pid)


def test_a_port_taken_meanwhile_is_retried_on_another(fake: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken])
        real = server_process.free_port
        monkeypatch.setattr(server_process, "free_port",
                            lambda host: next(ports, None) or real(host))
        with ServerProcess() as s:
            assert s.port != taken
            assert urllib.request.urlopen(s.url + "/health", timeout=5).status == 200


def test_a_server_that_exits_names_its_output_and_is_gone() -> None:
    """The real `minillm serve` with a bad flag value exits at once: the error carries what it
    printed, and no process is left."""
    with pytest.raises(RuntimeError, match="max_num_seqs|max-num-seqs") as err:
        ServerProcess(["--max-num-seqs", "0"], timeout=120)
    assert "exit status 2" in str(err.value)


def test_the_child_imports_this_minillm_and_pins_threads() -> None:
    env = child_env(torch_threads=1)
    home = os.path.dirname(os.path.dirname(minillm.__file__))  # the minillm imported here
    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.path.realpath(home)
    assert env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in child_env(None) or \
        child_env(None)["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS")


def test_a_failed_start_names_the_first_exception_its_output_printed() -> None:
    log = ("INFO starting\n(Worker pid=7) ERROR [executor.py:1063] ValueError: No common block "
           "size for 16 (CPU_ATTN: [MultipleOf(32)]).\n" + "noise\n" * 500 +
           "RuntimeError: Engine core initialization failed.\n")
    assert server_process.first_error(log) == \
        ": ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert server_process.first_error("INFO all is well\n") == ""
