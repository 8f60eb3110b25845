"""The engine on a thread of its own, and each request's outputs as an async stream.

The engine is synchronous and not thread-safe, so exactly one thread touches it: EngineLoop's.
HTTP handlers (on the asyncio event loop) hand it validated Requests and abort orders through a
queue; after every step the thread hands the step's outputs to the event loop in one call (one
wake-up per step, not one per request), which puts each in its request's asyncio.Queue.
Requests that arrive while a step runs join the batch at the next step: that is continuous
batching across HTTP clients.

Request ids are the loop's to give (reserve_id): a client's X-Request-Id is only a label, used
as the id when no request in flight holds it, else suffixed. An id stays reserved until the
engine thread has forgotten the request, so two requests can never share a stream.

A step that raises is the engine's failure, not one request's (a request's own failures end
that request inside the step: Engine._sample): the loop logs it, ends every request in flight
with an error, and calls on_death, which `minillm serve` uses to exit non-zero so that a
supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from minillm.llm import LLM, Prompt
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams

log = logging.getLogger(__name__)


class EngineDead(RuntimeError):
    """The engine loop has stopped (shut down, or a step failed); no new requests. A 503."""

    status = 503


class EngineFailed(EngineDead):
    """A step failed with this request in it: the server's fault, a 500 (as vLLM answers)."""

    status = 500


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
    request: Request  # the object, not its id: a later request may reuse a freed id


class EngineLoop:
    """Runs llm's engine on a background thread, stepping while any request is unfinished.

    on_step(outputs) runs on the engine thread after every step (the Prometheus metrics hook).
    on_death() runs on the engine thread once, after a failed step has ended every request.
    A long-running server bounds the engine's trace with EngineConfig.max_trace_steps.
    """

    def __init__(self, llm: LLM, on_step: Callable[[list[RequestOutput]], None] | None = None,
                 on_death: Callable[[], None] | None = None):
        self.llm, self.engine = llm, llm.engine
        self.on_step, self.on_death = on_step, on_death
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._sinks: dict[str, _Add] = {}  # the unfinished requests' streams
        self._ids: set[str] = set()  # reserved: in flight, or not yet forgotten by the engine
        self._ids_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self.error: BaseException | None = None

    # ---- called from the event loop ---------------------------------------------------------

    def start(self) -> None:
        if self.engine.has_unfinished_requests():
            raise ValueError("the engine has unfinished requests: serve from an idle LLM")
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to abort whatever is in flight (each stream ends with an error) and
        end; returns at once."""
        if self._thread.is_alive():
            self._inbox.put(None)

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is still in flight, then end the thread."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def reserve_id(self, prefix: str, label: str | None = None) -> str:
        """A request id no request in flight holds: label itself when free, else label (or
        prefix) and a random suffix. Held until the engine thread forgets the request."""
        with self._ids_lock:
            request_id = label if label and label not in self._ids else \
                f"{label or prefix}-{uuid.uuid4().hex}"
            self._ids.add(request_id)
        return request_id

    def release_id(self, request_id: str) -> None:
        """For an id whose request never reached the engine (it was refused)."""
        with self._ids_lock:
            self._ids.discard(request_id)

    def make_request(self, prompt: Prompt, params: SamplingParams, request_id: str,
                     arrival_time: float, priority: int = 0) -> Request:
        """A validated Request (ValueError names a bad value). Reads only immutable engine state
        (config, tokenizer, pool size), so it is safe off the engine thread."""
        return self.engine.make_request(prompt, params, request_id, arrival_time, priority)

    async def stream(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Queue request (its id from reserve_id); yield its output after each step that gives
        it a token, until it finishes. Leaving early (a client that disconnects) aborts it and
        frees its blocks."""
        if not self.alive:
            self.release_id(request.request_id)
            raise EngineDead("the engine is not running") from self.error
        outputs: asyncio.Queue[Item] = asyncio.Queue()
        self._inbox.put(_Add(request, outputs, asyncio.get_running_loop()))
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, EngineDead):  # shutting down
                    raise EngineDead(str(item)) from item
                if isinstance(item, BaseException):
                    raise EngineFailed(f"the engine failed: {item}") from item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._inbox.put(_Abort(request))

    # ---- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        self.engine.owner_thread = threading.get_ident()
        try:
            while (applied := self._drain(block=not self.engine.has_unfinished_requests())) >= 0:
                if not self.engine.has_unfinished_requests():
                    if applied:
                        self._after_step([])  # aborts freed blocks: let the gauges say so
                    continue
                outputs = self.engine.step()
                self._deliver([(out.request_id, out) for out in outputs])
                self._after_step(outputs)
        except BaseException as e:  # a failed step: fail every request rather than hang them
            self.error = e
            log.exception("the engine step failed; ending every request in flight")
        finally:  # stopped: abort what is left, and tell its clients so none waits forever
            self._end_all()

    def _end_all(self) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        error = self.error or EngineDead("the server is shutting down")
        self._deliver([(request_id, error) for request_id in list(self._sinks)])
        self.engine.owner_thread = None
        self._after_step([])  # the gauges show the aborts, not a frozen batch
        if self.error is not None and self.on_death is not None:
            self.on_death()

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        """The metrics hook; its failure is logged, and never stops the engine."""
        if self.on_step is None:
            return
        try:
            self.on_step(outputs)
        except Exception:
            log.exception("the metrics hook failed after a step")

    def _deliver(self, items: list[tuple[str, Item]]) -> None:
        """Send each item to its request's stream, one call per event loop; forget finished
        requests' streams and free their ids."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Item], Item]]] = {}
        for request_id, item in items:
            sink = self._sinks.get(request_id)
            if sink is None:  # aborted meanwhile
                continue
            by_loop.setdefault(sink.loop, []).append((sink.outputs, item))
            if not isinstance(item, RequestOutput) or item.finished:
                del self._sinks[request_id]
                self.release_id(request_id)
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
                self._add(item)
            else:
                self._abort(item.request)
            applied += 1
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return applied

    def _abort(self, request: Request) -> None:
        """Drop request if it is still in flight (it may have finished meanwhile)."""
        request_id = request.request_id
        if self.engine.requests.get(request_id) is request:
            self.engine.abort_request(request_id)
        sink = self._sinks.get(request_id)
        if sink is not None and sink.request is request:
            del self._sinks[request_id]
            self.release_id(request_id)

    def _add(self, item: _Add) -> None:
        """Queue one request; one that cannot be queued fails alone."""
        self._sinks[item.request.request_id] = item
        try:
            self.engine.enqueue(item.request)
        except Exception as e:
            log.exception("could not queue request %s", item.request.request_id)
            self._deliver([(item.request.request_id, e)])
