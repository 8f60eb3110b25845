"""The engine on a thread of its own, and each request's outputs as an async stream.

The engine is synchronous and not thread-safe, so exactly one thread touches it: EngineLoop's.
HTTP handlers (on the asyncio event loop) hand it validated Requests and abort orders through a
queue; after every step the thread hands the step's outputs to the event loop in one call (one
wake-up per step, not one per request), which puts each in its request's asyncio.Queue.
Requests that arrive while a step runs join the batch at the next step: that is continuous
batching across HTTP clients.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from minillm.llm import LLM, Prompt
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams


class EngineDead(RuntimeError):
    """The engine loop has stopped (shut down, or a step failed); no new requests."""


Item = RequestOutput | BaseException


@dataclass
class _Add:
    request: Request
    outputs: asyncio.Queue[Item]  # the request's stream, read on loop
    loop: asyncio.AbstractEventLoop


def _fan_out(deliveries: list[tuple[asyncio.Queue[Item], Item]]) -> None:
    """On the event loop: put each output in its request's queue."""
    for outputs, item in deliveries:
        outputs.put_nowait(item)


@dataclass
class _Abort:
    request_id: str


class EngineLoop:
    """Runs llm's engine on a background thread, stepping while any request is unfinished.

    on_step(outputs) runs on the engine thread after every step (the Prometheus metrics hook).
    A long-running server bounds the engine's trace with EngineConfig.max_trace_steps.
    """

    def __init__(self, llm: LLM, on_step: Callable[[list[RequestOutput]], None] | None = None):
        self.llm, self.engine = llm, llm.engine
        self.on_step = on_step
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._sinks: dict[str, _Add] = {}  # the unfinished requests' streams
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self.error: BaseException | None = None

    # ---- called from the event loop ---------------------------------------------------------

    def start(self) -> None:
        if self.engine.has_unfinished_requests():
            raise ValueError("the engine has unfinished requests: serve from an idle LLM")
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is still in flight, then end the thread."""
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def make_request(self, prompt: Prompt, params: SamplingParams, request_id: str,
                     arrival_time: float, priority: int = 0) -> Request:
        """A validated Request (ValueError names a bad value). Reads only immutable engine state
        (config, tokenizer, pool size), so it is safe off the engine thread."""
        return self.engine.make_request(prompt, params, request_id, arrival_time, priority)

    async def stream(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Queue request; yield its output after each step that gives it a token, until it
        finishes. Leaving early (a client that disconnects) aborts it and frees its blocks."""
        if not self.alive:
            raise EngineDead("the engine is not running") from self.error
        outputs: asyncio.Queue[Item] = asyncio.Queue()
        self._inbox.put(_Add(request, outputs, asyncio.get_running_loop()))
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise EngineDead(f"request {request.request_id} failed: {item}") from item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._inbox.put(_Abort(request.request_id))

    # ---- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        self.engine.owner_thread = threading.get_ident()
        try:
            while (applied := self._drain(block=not self.engine.has_unfinished_requests())) >= 0:
                if not self.engine.has_unfinished_requests():
                    if applied and self.on_step is not None:
                        self.on_step([])  # aborts freed blocks: let the gauges say so now
                    continue
                outputs = self.engine.step()
                self._deliver([(out.request_id, out) for out in outputs])
                if self.on_step is not None:
                    self.on_step(outputs)
        except BaseException as e:  # a failed step: fail every request rather than hang them
            self.error = e
        finally:  # stopped: abort what is left, and tell its clients so none waits forever
            for request_id in list(self.engine.requests):
                self.engine.abort_request(request_id)
            error = self.error or EngineDead("the server is shutting down")
            self._deliver([(request_id, error) for request_id in self._sinks])
            self.engine.owner_thread = None

    def _deliver(self, items: list[tuple[str, Item]]) -> None:
        """Send each item to its request's stream, one call per event loop; forget finished
        requests' streams."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Item], Item]]] = {}
        for request_id, item in items:
            sink = self._sinks.get(request_id)
            if sink is None:  # aborted meanwhile
                continue
            by_loop.setdefault(sink.loop, []).append((sink.outputs, item))
            if not isinstance(item, RequestOutput) or item.finished:
                del self._sinks[request_id]
        for loop, deliveries in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_fan_out, deliveries)

    def _drain(self, block: bool) -> int:
        """Apply queued adds and aborts (waiting for one when idle): how many; -1 means stop."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return 0
        applied = 0
        while True:
            if item is None:
                return -1
            if isinstance(item, _Add):
                self.engine.enqueue(item.request)
                self._sinks[item.request.request_id] = item
            elif item.request_id in self.engine.requests:  # not finished meanwhile
                self.engine.abort_request(item.request_id)
                self._sinks.pop(item.request_id, None)
            applied += 1
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return applied
