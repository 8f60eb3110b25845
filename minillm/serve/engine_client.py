"""What the HTTP server asks of an engine, whichever way it runs: EngineClient.

Two designs fill this one role (vLLM's name for it is EngineClient too):
- EngineLoop (engine_loop.py): the engine on a thread of the server's own process. The readable
  one; start_server(llm) serves an LLM a notebook already holds.
- EngineCoreClient (core_client.py): the engine core in a process of its own, fed and drained
  over a pipe, with tokenizing and detokenizing left in the server's process (vLLM V1's split),
  so HTTP, JSON and text never wait on the step, nor the step on them.

The server never asks which it holds. This base class owns what both share: request ids, each
request's stream of outputs (an asyncio.Queue read by the handler), and the engine's death.

Request ids are the client's to give (reserve_id): a client's X-Request-Id is only a label,
used as the id when no request in flight holds it, else suffixed. An id stays reserved until
the engine has forgotten the request, so two requests can never share a stream.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from minillm.config import EngineConfig
from minillm.input_processor import InputProcessor
from minillm.llm import Prompt
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams


class EngineDead(RuntimeError):
    """The engine has stopped (shut down, or a step failed); no new requests. A 503."""

    status = 503


class EngineFailed(EngineDead):
    """A step failed with this request in it: the server's fault, a 500 (as vLLM answers)."""

    status = 500


Item = RequestOutput | BaseException
StepHook = Callable[[list[RequestOutput]], None]


@dataclass
class Sink:
    """Where one request's outputs go: its queue, read on its event loop."""

    request: Request
    outputs: asyncio.Queue[Item]
    loop: asyncio.AbstractEventLoop


def _fan_out(deliveries: list[tuple[asyncio.Queue[Item], Item]]) -> None:
    """On the event loop: put each output in its request's queue."""
    for outputs, item in deliveries:
        outputs.put_nowait(item)


class EngineClient:
    """The engine as the server sees it. A subclass sets tokenizer, config (resolved),
    processor (its InputProcessor), speculative, model_name, device and torch_threads, and
    gives start, request_stop, stop, stats, _submit (hand a request to the engine) and _cancel
    (abort one).

    on_step(outputs) runs after every step that gave tokens (the Prometheus hook);
    on_death() runs once, after a failed engine has ended every request.
    """

    tokenizer: Any
    config: EngineConfig
    processor: InputProcessor
    speculative: bool
    model_name: str
    device: str  # where the engine runs its steps: "cpu", "cuda:0"
    torch_threads: int  # the intra-op threads of the engine's process

    def __init__(self, on_step: StepHook | None = None,
                 on_death: Callable[[], None] | None = None):
        self.on_step, self.on_death = on_step, on_death
        self._sinks: dict[str, Sink] = {}  # the unfinished requests' streams
        self._ids: set[str] = set()  # reserved: in flight, or not yet forgotten by the engine
        self._ids_lock = threading.Lock()
        self.error: BaseException | None = None

    # ---- what a subclass gives ---------------------------------------------------------------

    def start(self) -> None:
        raise NotImplementedError

    def request_stop(self) -> None:
        """Abort whatever is in flight (each stream ends with an error) and end; returns at
        once."""
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is still in flight, then end the engine."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def stats(self) -> dict[str, int]:
        """The engine's counters (LLM.stats()'s keys), as of its last step."""
        raise NotImplementedError

    def _submit(self, sink: Sink) -> None:
        raise NotImplementedError

    def _cancel(self, request: Request) -> None:
        raise NotImplementedError

    # ---- called from the event loop ----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.processor.vocab_size

    def reserve_id(self, prefix: str, label: str | None = None) -> str:
        """A request id no request in flight holds: label itself when free, else label (or
        prefix) and a random suffix. Held until the engine forgets the request."""
        with self._ids_lock:
            request_id = label if label and label not in self._ids else \
                f"{label or prefix}-{uuid.uuid4().hex}"
            self._ids.add(request_id)
        return request_id

    def release_id(self, request_id: str) -> None:
        """For an id whose request the engine has forgotten, or that never reached it."""
        with self._ids_lock:
            self._ids.discard(request_id)

    def make_request(self, prompt: Prompt, params: SamplingParams, request_id: str,
                     arrival_time: float, priority: int = 0) -> Request:
        """A validated Request, not yet queued (ValueError names a bad value). Safe off the
        engine's thread: it reads only what does not change (config, tokenizer, pool size)."""
        raise NotImplementedError

    async def stream(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Queue request (its id from reserve_id); yield its output after each step that gives
        it a token, until it finishes. Leaving early (a client that disconnects) aborts it and
        frees its blocks."""
        if not self.alive:
            self.release_id(request.request_id)
            raise EngineDead("the engine is not running") from self.error
        outputs: asyncio.Queue[Item] = asyncio.Queue()
        self._submit(Sink(request, outputs, asyncio.get_running_loop()))
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
                self._cancel(request)

    # ---- called from the engine's side -------------------------------------------------------

    def _deliver(self, items: list[tuple[str, Item]]) -> None:
        """Send each item to its request's stream, one call per event loop; forget the streams
        that end (a finished output, or an error)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Item], Item]]] = {}
        for request_id, item in items:
            sink = self._sinks.get(request_id)
            if sink is None:  # aborted meanwhile
                continue
            by_loop.setdefault(sink.loop, []).append((sink.outputs, item))
            if not isinstance(item, RequestOutput) or item.finished:
                del self._sinks[request_id]
                self._stream_ended(request_id)
        for loop, deliveries in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_fan_out, deliveries)

    def _refuse(self, sink: Sink) -> None:
        """On the event loop: a request that reached an engine which has just stopped (after
        stream's check) gets the stop's error at once, rather than wait forever."""
        self.release_id(sink.request.request_id)
        sink.outputs.put_nowait(self.error or EngineDead("the server is shutting down"))

    def _stream_ended(self, request_id: str) -> None:
        """A stream has had its last item: its id is free once the engine forgot it too."""
        self.release_id(request_id)

    def _after_step(self, outputs: list[RequestOutput], log: Any) -> None:
        """The metrics hook; its failure is logged, and never stops the engine."""
        if self.on_step is None:
            return
        try:
            self.on_step(outputs)
        except Exception:
            log.exception("the metrics hook failed after a step")

    def _died(self) -> None:
        if self.error is not None and self.on_death is not None:
            self.on_death()
