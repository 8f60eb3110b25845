"""EngineCoreClient: the engine core in a process of its own, as the server's EngineClient.

The core (engine_core.py) schedules, runs the forward and samples, and nothing else. This side,
in the server's process, checks and tokenizes each request (InputProcessor, the engine's own
checks: a bad request never reaches the core), sends it down the pipe, and reads each step's
news on a thread: detokenizing, stop strings and the outputs are the OutputProcessor's, then
the outputs go to their streams as EngineLoop's do. So the step never waits for HTTP, JSON or
text, and they never wait for the step: each process has its own interpreter lock (and on a
CPU, its own core). vLLM V1 serves this way by default (its AsyncLLM and EngineCoreProc).

Request ids: an aborted request's id stays reserved until the core says it has dropped it
(CoreStep.forgotten), so a new request can never be mistaken for an old one's late tokens.

Failure: a core whose step fails says why and exits; a core that is killed closes its pipe.
Either way every stream ends with an error, on_death runs, /health answers 503.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from minillm.input_processor import InputProcessor
from minillm.llm import Prompt, default_model_path
from minillm.model_config import ModelConfig
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams
from minillm.serve.engine_client import EngineClient, EngineDead, Sink, StepHook
from minillm.serve.engine_core import (
    Abort,
    AddRequest,
    CoreFailed,
    CoreReady,
    CoreSetup,
    CoreStep,
    Hook,
    Shutdown,
)
from minillm.serve.output_processor import OutputProcessor
from minillm.serve.server_process import child_env, die_with_parent
from minillm.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

# A failure the core met while starting, raised here as what it was: a bad value or a missing
# folder is the caller's to fix (minillm serve exits with status 2 on these).
_START_ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError, "TypeError": TypeError,
                                             "OSError": OSError,
                                             "FileNotFoundError": FileNotFoundError}


def _stop_process(process: subprocess.Popen, grace: float) -> None:
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


class EngineCoreClient(EngineClient):
    """Starts the engine core process, waits until its model is loaded, and serves through it.

    model and llm_kwargs: what LLM(model, **llm_kwargs) takes, built in the core process.
    startup_timeout: seconds the core may take to load. log_level: the core's logging.
    hook: "module:function" called with the core's LLM before it serves (tests).
    Raises what the core raised while starting (ValueError for a bad setting, OSError for a
    missing model folder), or RuntimeError if it died or timed out.
    """

    def __init__(self, model: str | Path | ModelConfig | None = None, *,
                 on_step: StepHook | None = None, on_death: Callable[[], None] | None = None,
                 startup_timeout: float = 600.0, log_level: str = "warning",
                 hook: Hook | None = None, **llm_kwargs: Any):
        super().__init__(on_step, on_death)
        self._process, self._conn = self._launch()
        self.pid = self._process.pid
        self._finalizer = weakref.finalize(self, _stop_process, self._process, 0.0)
        self._conn.send(CoreSetup(model, llm_kwargs, log_level, hook, list(sys.path)))
        # The server's own tokenizer loads while the core starts (a missing folder is the
        # core's to report: it names the flag).
        folder = None if isinstance(model, ModelConfig) else Path(model or default_model_path())
        self.tokenizer = load_tokenizer(folder) if folder is not None and folder.is_dir() \
            else None
        ready = self._await_ready(startup_timeout)
        self.config, self.model_name, self.device = ready.config, ready.model_name, ready.device
        self.speculative, self.torch_threads = ready.speculative, ready.torch_threads
        self.load_seconds = ready.load_seconds
        self.processor = InputProcessor(self.tokenizer, self.config, ready.vocab_size)
        self._outputs = OutputProcessor(self.tokenizer)
        self._stats = ready.stats
        self._lock = threading.Lock()  # the sinks and the outputs' states: two threads touch them
        self._aborting: set[str] = set()  # aborts sent, not yet confirmed by the core
        self._outbox: queue.SimpleQueue[AddRequest | Abort | Shutdown] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="minillm-core-reader",
                                        daemon=True)
        self._writer = threading.Thread(target=self._write, name="minillm-core-writer",
                                        daemon=True)
        self._stopping = False
        self._closed = False  # set once every stream has been ended: no request may join

    @staticmethod
    def _launch() -> tuple[subprocess.Popen, Connection]:
        """`python -m minillm.serve.engine_core FD`, one end of a socket pair its pipe. (Not
        multiprocessing's spawn: it re-runs the caller's main module, which a reader's script
        without an `if __name__ == "__main__"` guard would not survive.)"""
        if os.name != "posix":
            raise RuntimeError("the engine core's own process needs a POSIX system (Linux, "
                               "macOS): serve on a thread instead (start_server(LLM(...)), "
                               "or minillm serve --no-engine-core-process)")
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "minillm.serve.engine_core", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=child_env(None),
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        return process, Connection(ours.detach())

    def _await_ready(self, timeout: float) -> CoreReady:
        deadline = time.monotonic() + timeout
        try:
            while not self._conn.poll(0.05):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise EOFError
            message = self._conn.recv()
        except EOFError:
            self._finalizer()
            code = self._process.returncode
            raise RuntimeError(f"the engine core process did not start within {timeout:g} s"
                               if code is None else f"the engine core process exited with "
                               f"status {code} while starting") from None
        if isinstance(message, CoreFailed):
            _stop_process(self._process, 10)
            error = _START_ERRORS.get(message.kind)
            raise (error(message.message) if error is not None
                   else RuntimeError(f"{message.kind}: {message.message}"))
        assert isinstance(message, CoreReady), message
        return message

    # ---- EngineClient ------------------------------------------------------------------------

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def request_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._outbox.put(Shutdown())

    def stop(self, timeout: float = 30.0) -> None:
        if self._reader.ident is None:  # never started: nothing in flight to end
            self._finalizer()
            return
        self.request_stop()
        if self._reader.is_alive():
            self._reader.join(timeout)
        _stop_process(self._process, 0 if self.error is not None else timeout)
        self._finalizer.detach()

    @property
    def alive(self) -> bool:
        return self._reader.is_alive() and self.error is None and not self._stopping

    def stats(self) -> dict[str, int]:
        return self._stats

    def make_request(self, prompt: Prompt, params: SamplingParams, request_id: str,
                     arrival_time: float, priority: int = 0) -> Request:
        token_ids = self.processor.process(prompt, params, priority)
        return Request(request_id, token_ids, params, arrival_time,
                       prompt=prompt if isinstance(prompt, str) else None, priority=priority)

    def _submit(self, sink: Sink) -> None:
        req = sink.request
        with self._lock:
            if self._closed:  # the core stopped after stream() checked
                self._refuse(sink)
                return
            self._sinks[req.request_id] = sink
            self._outputs.add(req)
        self._outbox.put(AddRequest(req.request_id, req.prompt_token_ids, req.params,
                                    req.arrival_time, req.priority))

    def _cancel(self, request: Request) -> None:
        """The client left: drop its stream now, and the request in the core."""
        request_id = request.request_id
        with self._lock:
            sink = self._sinks.get(request_id)
            if sink is None or sink.request is not request:  # it ended meanwhile
                return
            del self._sinks[request_id]
            self._outputs.drop(request_id)
            self._aborting.add(request_id)
        self._outbox.put(Abort(request_id))

    def _stream_ended(self, request_id: str) -> None:
        if request_id not in self._aborting:  # else its id is freed when the core confirms
            self.release_id(request_id)

    # ---- the threads -------------------------------------------------------------------------

    def _write(self) -> None:
        """Send what the server queued, in order (a send may wait while the core steps)."""
        while True:
            message = self._outbox.get()
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the core has gone: the reader ends every stream
                return
            if isinstance(message, Shutdown):
                return

    def _read(self) -> None:
        """Take each step's news until the core stops; then end every stream left."""
        try:
            while True:
                message = self._conn.recv()
                if isinstance(message, CoreFailed):
                    self.error = RuntimeError(f"{message.kind}: {message.message}")
                    break
                self._on_step(message)
        except (EOFError, OSError):
            if not self._stopping:
                try:
                    self._process.wait(2)
                except subprocess.TimeoutExpired:
                    pass
                self.error = RuntimeError(f"the engine core process exited (status "
                                          f"{self._process.returncode})")
        except BaseException as e:  # this side's own failure: as fatal as the core's
            self.error = e
            log.exception("reading the engine core's outputs failed")
        finally:
            self._end_all()

    def _on_step(self, step: CoreStep) -> None:
        outputs: list[RequestOutput] = []
        stopped: list[str] = []
        with self._lock:
            for news in step.outputs:
                out, stop_here = self._outputs.process(news)
                if out is None:  # aborted here meanwhile: its late news is dropped
                    continue
                outputs.append(out)
                if stop_here:
                    stopped.append(out.request_id)
                    self._aborting.add(out.request_id)
            for request_id in step.forgotten:
                self._aborting.discard(request_id)
                self.release_id(request_id)
            self._stats = step.stats
            self._deliver([(out.request_id, out) for out in outputs])
        for request_id in stopped:  # a stop string ended it here: the core may drop it
            self._outbox.put(Abort(request_id))
        self._after_step(outputs, log)

    def _end_all(self) -> None:
        if self.error is not None:
            log.error("the engine core failed (%s); ending every request in flight", self.error)
        error = self.error or EngineDead("the server is shutting down")
        with self._lock:
            self._closed = True
            self._deliver([(request_id, error) for request_id in list(self._sinks)])
            for request_id in list(self._aborting):
                self.release_id(request_id)
            self._aborting.clear()
        # The core and its pool are gone: no request runs there, no block is held.
        self._stats = {**self._stats, "num_running": 0, "num_waiting": 0, "num_swapped": 0,
                       "num_free_blocks": self._stats["num_blocks"]}
        self._after_step([], log)
        self._died()
