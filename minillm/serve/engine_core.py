"""The engine core in a process of its own: its loop, and the messages it trades with the server.

vLLM V1 splits serving in two processes: the API server (HTTP, tokenizing, detokenizing, stop
strings) and the engine core (scheduling, the forward, sampling), fed and drained over ZMQ
sockets. minillm does the same over one multiprocessing pipe: EngineCoreClient (core_client.py)
in the server's process, run_engine_core here in the child. The core loop is the whole engine
loop and nothing else:

    wait for requests when idle; take every add and abort queued; run one step;
    send each request's new tokens (and the pool's counters) in one message

The core never turns tokens into text: its requests are made with detokenize=False, so it ends
them at end-of-sequence or max_tokens only, and the front end, which detokenizes anyway to
stream text, finds stop strings and aborts the request here (vLLM's OutputProcessor does the
same: a stopped request may run a step or two past its stop, and those tokens are dropped).

Failure: a step that raises ends every request in flight, says why (CoreFailed) and exits with
status 1; a front end that goes away (its end of the pipe closes) ends the core with status 0.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import torch

from minillm.calc import machine
from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.llm import LLM
from minillm.request import FinishReason, Request
from minillm.sampling import SamplingParams

log = logging.getLogger("minillm.serve.engine_core")


# ---- the front end's messages to the core ----------------------------------------------------

@dataclass(frozen=True)
class AddRequest:
    """A request the front end has checked and tokenized (the core checks it again)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # time.perf_counter(): one clock for every process of a machine
    priority: int


@dataclass(frozen=True)
class Abort:
    request_id: str


class Shutdown(NamedTuple):
    """Abort everything in flight and exit."""


# ---- the core's messages to the front end ----------------------------------------------------

@dataclass(frozen=True)
class CoreReady:
    """The core has loaded its model: what the front end needs to check and serve requests."""

    config: EngineConfig  # resolved: num_kv_blocks and max_model_len set
    vocab_size: int
    model_name: str
    device: str
    torch_threads: int
    speculative: bool
    stats: dict[str, int]
    load_seconds: float  # building the LLM: weights, the pool, the draft (not the imports)


class CoreOutput(NamedTuple):
    """One request's news from one step (a tuple: thousands a second cross the pipe)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None  # None where logprobs were not asked for
    token_times: list[float]  # when each new token was taken
    first_scheduled_time: float | None
    num_cached_tokens: int
    finish_reason: FinishReason | None  # "stop" here means end-of-sequence
    finished_time: float | None
    error: str | None


class CoreStep(NamedTuple):
    """What one step (or a batch of aborts while idle) gives the front end."""

    outputs: list[CoreOutput]
    forgotten: list[str]  # ids of requests aborted at the front end's word, now dropped
    stats: dict[str, int]  # LLM.stats() after the step


@dataclass(frozen=True)
class CoreFailed:
    """The core could not start, or a step failed: the exception, as text."""

    kind: str
    message: str


Hook = str  # "package.module:function", called with the core's LLM once it is built (tests)


@dataclass(frozen=True)
class CoreSetup:
    """The front end's first message: what to build, and where the caller imports from."""

    model: Any  # LLM's first argument: a checkpoint folder, None (the shipped model), a shape
    llm_kwargs: dict[str, Any]
    log_level: str
    hook: Hook | None
    sys_path: list[str]  # so the hook imports from where the caller's modules live


class EngineCore:
    """The engine loop of the core process: requests in from conn, steps, news out."""

    def __init__(self, engine: Engine, conn: Connection):
        self.engine, self.conn = engine, conn
        self.sent: dict[str, int] = {}  # output tokens already sent, per request in flight

    def run(self) -> int:
        """Serve until told to stop (0), the front end goes away (0) or a step fails (1)."""
        engine = self.engine
        try:
            while True:
                busy = engine.has_unfinished_requests()
                forgotten = self._take_messages(block=not busy)
                if forgotten is None:
                    return 0
                if engine.has_unfinished_requests():
                    got, _ = engine.run_step()
                    self._send(CoreStep([self._news(req) for req in got], forgotten,
                                        engine.stats()))
                elif forgotten:  # aborts freed blocks: let the front end's gauges say so
                    self._send(CoreStep([], forgotten, engine.stats()))
        except EOFError:  # the front end has gone (_send, _take_messages): nobody to serve
            return 0
        except BaseException as e:
            log.exception("the engine step failed; ending every request in flight")
            for request_id in list(engine.requests):
                engine.abort_request(request_id)
            try:
                self._send(CoreFailed(type(e).__name__, f"{e}"))
            except EOFError:
                pass
            return 1

    def _send(self, message: object) -> None:
        try:
            self.conn.send(message)
        except OSError:  # a broken pipe: the front end has gone
            raise EOFError from None

    def _take_messages(self, block: bool) -> list[str] | None:
        """Apply every queued add and abort (waiting for one when idle); the ids aborted, or
        None when told to stop."""
        forgotten: list[str] = []
        while True:
            try:
                if not (block or self.conn.poll()):
                    break
                message = self.conn.recv()
            except OSError:  # a reset pipe: the front end has gone, as with EOF
                raise EOFError from None
            block = False
            if isinstance(message, Shutdown):
                for request_id in list(self.engine.requests):
                    self.engine.abort_request(request_id)
                return None
            if isinstance(message, Abort):
                self._abort(message.request_id)
                forgotten.append(message.request_id)
            else:
                self._add(message)
        return forgotten

    def _abort(self, request_id: str) -> None:
        if request_id in self.engine.requests:  # it may have finished meanwhile
            self.engine.abort_request(request_id)
        self.sent.pop(request_id, None)

    def _add(self, add: AddRequest) -> None:
        """Queue one request; one the engine refuses fails alone, with the reason."""
        try:
            req = self.engine.make_request(add.prompt_token_ids, add.params, add.request_id,
                                           add.arrival_time, add.priority, detokenize=False)
            self.engine.enqueue(req)
        except Exception as e:
            log.warning("could not queue request %s", add.request_id, exc_info=True)
            self._send(CoreStep([CoreOutput(add.request_id, [], None, [], None, 0, "error",
                                             time.perf_counter(), f"{type(e).__name__}: {e}")],
                                [], self.engine.stats()))
            return
        self.sent[add.request_id] = 0

    def _news(self, req: Request) -> CoreOutput:
        """What req gained in this step: the tokens since the last message, and how it ended."""
        n = self.sent.get(req.request_id, 0)
        m = req.metrics
        news = CoreOutput(
            req.request_id, req.token_ids[req.num_prompt_tokens + n:],
            req.output_logprobs[n:] if req.params.logprobs is not None else None,
            m.token_times[n:], m.first_scheduled_time, req.num_cached_tokens,
            req.finish_reason, m.finished_time, req.error)
        if req.finish_reason is None:
            self.sent[req.request_id] = req.num_output_tokens
        else:
            self.sent.pop(req.request_id, None)
        return news


def _call_hook(hook: Hook, llm: LLM) -> None:
    module, _, name = hook.partition(":")
    getattr(importlib.import_module(module), name)(llm)


def run_engine_core(conn: Connection, setup: CoreSetup) -> int:
    """The core process's body: build the LLM, say CoreReady (or CoreFailed), serve; the exit
    status (0 stopped, 1 a step failed, 2 it could not start)."""
    logging.basicConfig(level=setup.log_level.upper(),
                        format="%(levelname)s:     [engine core] %(message)s")
    # Ctrl-C reaches the whole process group; the front end decides how the core stops (a
    # grace period for running requests, then Shutdown), so the core ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    machine.settle_threads()  # the same rule as the server's own process
    sys.path[:] = setup.sys_path
    start = time.perf_counter()
    try:
        llm = LLM(setup.model, **setup.llm_kwargs)
        if setup.hook is not None:
            _call_hook(setup.hook, llm)
    except BaseException as e:  # a bad flag, a missing model: said at start-up
        conn.send(CoreFailed(type(e).__name__, f"{e}"))
        if not isinstance(e, (ValueError, OSError, TypeError)):
            traceback.print_exc()
        return 2
    engine = llm.engine
    conn.send(CoreReady(llm.config, llm.model.config.vocab_size, llm.model_name,
                        str(engine.device), torch.get_num_threads(), engine.spec is not None,
                        engine.stats(), time.perf_counter() - start))
    return EngineCore(engine, conn).run()


def main(fd: int) -> int:
    pipe = Connection(fd)
    return run_engine_core(pipe, pipe.recv())


if __name__ == "__main__":  # python -m minillm.serve.engine_core FD (EngineCoreClient runs it)
    # Through the module's importable name, so that what it pickles unpickles on the other side.
    from minillm.serve import engine_core

    sys.exit(engine_core.main(int(sys.argv[1])))
