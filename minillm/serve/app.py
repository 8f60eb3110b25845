"""The HTTP server: FastAPI routes over an EngineLoop, and start_server() for notebooks and tests.

One request's life: the handler stamps its arrival, parses the body (protocol.py), validates
and tokenizes it (Engine.make_request), hands it to the engine thread, and relays the outputs
as they come, whole or as server-sent events. Every failure the client caused is a 400 with
OpenAI's error object; nothing it does reaches another request.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minillm.llm import LLM
from minillm.request import RequestOutput
from minillm.serve.engine_loop import EngineDead, EngineLoop
from minillm.serve.prometheus import ServerMetrics
from minillm.serve.protocol import (
    APIError,
    ParsedRequest,
    ResponseWriter,
    check_model,
    parse_chat,
    parse_completion,
)


class Server:
    """The routes' shared state: the LLM, its engine loop, its metrics, its name."""

    def __init__(self, llm: LLM, model_name: str):
        self.llm, self.model_name = llm, model_name
        self.metrics = ServerMetrics(llm.engine, model_name)
        self.loop = EngineLoop(llm, self.metrics.on_step)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The checkpoint's own chat template (the shipped model's writes a play) as token ids."""
        tok = self.llm.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError("this checkpoint has no chat template, so it cannot take chat "
                           "messages: use /v1/completions", "messages")
        return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            return_dict=False))

    async def handle(self, raw: Request, chat: bool) -> Response:
        arrival = time.perf_counter()  # the server's clock for TTFT starts here
        try:
            body = json.loads(await raw.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {body!r:.80}")
        check_model(body, self.model_name)
        max_len = self.llm.config.max_model_len
        parsed = (parse_chat(body, self.render_chat, max_len) if chat
                  else parse_completion(body))
        # A client may name its request (X-Request-Id, as in vLLM): the engine's trace then uses
        # its name, so a benchmark's records map onto the engine's steps.
        prefix = "chatcmpl" if chat else "cmpl"
        client_id = raw.headers.get("x-request-id")
        request_id = client_id or f"{prefix}-{uuid.uuid4().hex}"
        try:
            req = self.loop.make_request(parsed.prompt, parsed.params, request_id, arrival,
                                         parsed.priority)
        except ValueError as e:
            param = ("max_tokens" if "max_tokens" in str(e) else None if "request_id" in str(e)
                     else "messages" if chat else "prompt")
            raise APIError(str(e), param) from None
        response_id = f"{prefix}-{client_id}" if client_id else request_id
        writer = ResponseWriter(response_id, self.model_name, parsed, self.llm.tokenizer)
        outputs = self.loop.stream(req)
        if parsed.stream:
            return StreamingResponse(self._events(outputs, writer, parsed),
                                     media_type="text/event-stream")
        last = await self._last(outputs, raw)
        if last is None:  # nobody is listening; 499 is nginx's "client closed request"
            return Response(status_code=499)
        return JSONResponse(writer.response(last))

    @staticmethod
    async def _last(outputs: AsyncIterator[RequestOutput], raw: Request) -> RequestOutput | None:
        """The finished output, or None when the client hung up first (its request aborted)."""
        async def collect() -> RequestOutput:
            last = None
            async for last in outputs:  # noqa: B007 - the last one is the finished one
                pass
            assert last is not None
            return last

        task = asyncio.ensure_future(collect())
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await raw.is_disconnected():
                task.cancel()  # closes the stream, which aborts the request
                return None

    @staticmethod
    async def _events(outputs: AsyncIterator[RequestOutput], writer: ResponseWriter,
                      parsed: ParsedRequest) -> AsyncIterator[str]:
        """Server-sent events: a chunk per step with new text, the usage chunk, [DONE].
        When the client disconnects, this generator is closed, and so is outputs: abort."""
        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        first = writer.first_chunk()
        if first is not None:
            yield event(first)
        last = None
        try:
            async for last in outputs:
                chunk = writer.chunk(last)
                if chunk is not None:
                    yield event(chunk)
        except EngineDead as e:
            yield event(APIError(str(e), status=500, kind="InternalServerError").body())
        else:
            if parsed.include_usage and last is not None:
                yield event(writer.usage_chunk(last))
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"


def build_app(llm: LLM, model_name: str | None = None) -> FastAPI:
    """The OpenAI-compatible app serving llm; its engine loop runs while the app does."""
    model_name = model_name or llm.model_name
    server = Server(llm, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.loop.start()
        yield
        server.loop.stop()  # aborts whatever the graceful shutdown did not finish

    app = FastAPI(title="minillm", summary="An OpenAI-compatible server for minillm",
                  lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(EngineDead)
    async def engine_dead(_: Request, e: EngineDead) -> JSONResponse:
        return JSONResponse(APIError(str(e), status=503, kind="ServiceUnavailable").body(),
                            status_code=503)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if server.loop.alive else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "minillm",
            "max_model_len": llm.config.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await server.handle(raw, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await server.handle(raw, chat=True)

    return app


class RunningServer:
    """A server on a background thread (start_server); a context manager that stops it."""

    def __init__(self, uvicorn_server: Any, thread: threading.Thread, host: str, port: int,
                 model_name: str, llm: LLM):
        self._server, self._thread = uvicorn_server, thread
        self.url, self.port = f"http://{host}:{port}", port
        self.model_name, self.llm = model_name, llm

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunningServer({self.url}, model {self.model_name!r})"


def start_server(llm: LLM, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, timeout: float = 30.0) -> RunningServer:
    """Serve llm over HTTP from a background thread of this process; port 0 picks a free one.

    model_name is what clients send as `model` (default: the checkpoint folder's name).
    Returns once the server accepts connections. The engine is then driven by the server's
    thread: read llm.trace and llm.stats() freely, but do not call llm.generate meanwhile.
    """
    import uvicorn

    model_name = model_name or llm.model_name
    app = build_app(llm, model_name)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="minillm-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port} (is the port free?)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, host, bound, model_name, llm)
