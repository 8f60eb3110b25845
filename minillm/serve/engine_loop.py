"""The engine on a thread of the server's own process: EngineLoop, the readable EngineClient.

The engine is synchronous and not thread-safe, so exactly one thread touches it: EngineLoop's.
HTTP handlers (on the asyncio event loop) hand it validated Requests and abort orders through a
queue; after every step the thread hands the step's outputs to the event loop in one call (one
wake-up per step, not one per request), which puts each in its request's asyncio.Queue.
Requests that arrive while a step runs join the batch at the next step: that is continuous
batching across HTTP clients. The price of one process: the step, HTTP, JSON and the text of
every stream share one interpreter lock (minillm.serve.core_client moves the engine out).

A step that raises is the engine's failure, not one request's (a request's own failures end
that request inside the step: Engine._sample): the loop logs it, ends every request in flight
with an error, and calls on_death, which `minillm serve` uses to exit non-zero so that a
supervisor restarts it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minillm.llm import LLM, Prompt
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.serve.engine_client import EngineClient, EngineDead, EngineFailed, Sink, StepHook

__all__ = ["EngineDead", "EngineFailed", "EngineLoop"]

log = logging.getLogger(__name__)


@dataclass
class _Abort:
    request: Request  # the object, not its id: a later request may reuse a freed id


class EngineLoop(EngineClient):
    """Runs llm's engine on a background thread, stepping while any request is unfinished.

    on_step(outputs) runs on the engine thread after every step (the Prometheus metrics hook).
    on_death() runs on the engine thread once, after a failed step has ended every request.
    A long-running server bounds the engine's trace with EngineConfig.max_trace_steps.
    """

    def __init__(self, llm: LLM, on_step: StepHook | None = None,
                 on_death: Callable[[], None] | None = None):
        super().__init__(on_step, on_death)
        self.llm, self.engine = llm, llm.engine
        self.tokenizer, self.config, self.model_name = llm.tokenizer, llm.config, llm.model_name
        self.processor, self.device = self.engine.processor, str(self.engine.device)
        self.speculative = self.engine.spec is not None
        self.torch_threads = torch.get_num_threads()
        self._inbox: queue.SimpleQueue[Sink | _Abort | None] = queue.SimpleQueue()
        self._inbox_lock = threading.Lock()  # the thread's end closes the inbox under it
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)

    # ---- called from the event loop ---------------------------------------------------------

    def start(self) -> None:
        if self.engine.has_unfinished_requests():
            raise ValueError("the engine has unfinished requests: serve from an idle LLM")
        self._thread.start()

    def request_stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)

    def stop(self, timeout: float = 30.0) -> None:
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def make_request(self, prompt: Prompt, params: SamplingParams, request_id: str,
                     arrival_time: float, priority: int = 0) -> Request:
        return self.engine.make_request(prompt, params, request_id, arrival_time, priority)

    def _submit(self, sink: Sink) -> None:
        with self._inbox_lock:
            if not self._closed:
                self._inbox.put(sink)
                return
        self._refuse(sink)

    def _cancel(self, request: Request) -> None:
        self._inbox.put(_Abort(request))

    # ---- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        self.engine.owner_thread = threading.get_ident()
        try:
            while (applied := self._drain(block=not self.engine.has_unfinished_requests())) >= 0:
                if not self.engine.has_unfinished_requests():
                    if applied:
                        self._after_step([], log)  # aborts freed blocks: let the gauges say so
                    continue
                outputs = self.engine.step()
                self._deliver([(out.request_id, out) for out in outputs])
                self._after_step(outputs, log)
        except BaseException as e:  # a failed step: fail every request rather than hang them
            self.error = e
            log.exception("the engine step failed; ending every request in flight")
        finally:  # stopped: abort what is left, and tell its clients so none waits forever
            self._end_all()

    def _end_all(self) -> None:
        with self._inbox_lock:  # requests queued since the last drain never reach the engine
            self._closed = True
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Sink):
                    self._sinks[item.request.request_id] = item
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        error = self.error or EngineDead("the server is shutting down")
        self._deliver([(request_id, error) for request_id in list(self._sinks)])
        self.engine.owner_thread = None
        self._after_step([], log)  # the gauges show the aborts, not a frozen batch
        self._died()

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
            if isinstance(item, Sink):
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

    def _add(self, sink: Sink) -> None:
        """Queue one request; one that cannot be queued fails alone."""
        self._sinks[sink.request.request_id] = sink
        try:
            self.engine.enqueue(sink.request)
        except Exception as e:
            log.exception("could not queue request %s", sink.request.request_id)
            self._deliver([(sink.request.request_id, e)])

