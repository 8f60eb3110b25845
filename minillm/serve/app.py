"""The HTTP server: FastAPI routes over an EngineLoop (running.py serves them with uvicorn).

One request's life: the guard (guard.py) checks its Host, Origin, key and content type and reads
its bounded body; the handler stamps its arrival, reserves an engine id, and on a worker thread
(a 2 MB prompt takes seconds to tokenize, which must not stall the streams) parses the body
(protocol.py), validates it and tokenizes it (EngineClient.make_request: the engine's own
checks); then it hands the request to the engine and relays the outputs as they come
(responses.py writes them), whole or as server-sent events. The engine is an EngineClient:
on a thread of this process (EngineLoop) or in a process of its own (EngineCoreClient); the
routes never ask which. Every failure the client caused is a 4xx with OpenAI's error object
(errors.py maps each failure to its status); nothing it does reaches another request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.middleware.cors import CORSMiddleware

from minillm.llm import LLM
from minillm.request import RequestOutput
from minillm.serve.config import ServerConfig
from minillm.serve.engine_client import EngineClient, EngineDead
from minillm.serve.engine_loop import EngineLoop
from minillm.serve.errors import add_error_handlers, engine_error
from minillm.serve.guard import Guard
from minillm.serve.prometheus import ServerMetrics
from minillm.serve.protocol import (
    APIError,
    ParsedRequest,
    check_model,
    engine_param,
    parse_chat,
    parse_completion,
)
from minillm.serve.responses import ResponseWriter

MAX_LABEL_CHARS = 256  # an X-Request-Id is echoed, logged and traced: keep it a label


class Server:
    """The routes' shared state: the engine (an EngineClient), its metrics, its name."""

    def __init__(self, engine: EngineClient, model_name: str, config: ServerConfig):
        self.engine, self.model_name, self.config = engine, model_name, config
        self.metrics = ServerMetrics(engine, model_name)
        engine.on_step = self.metrics.on_step
        # Parsing, the chat template and tokenizing run here, off the event loop.
        self.workers = ThreadPoolExecutor(2, thread_name_prefix="minillm-tokenize")
        c = engine.config
        assert c.max_model_len is not None and c.num_kv_blocks is not None
        self.capacity = min(c.max_model_len, c.num_kv_blocks * c.block_size)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The checkpoint's own chat template (the shipped model's writes a play) as token ids."""
        tok = self.engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError("this checkpoint has no chat template, so it cannot take chat "
                           "messages: use /v1/completions", "messages")
        return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            return_dict=False))

    def parse_body(self, data: bytes) -> dict[str, Any]:
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, 5,000 digits, nesting
            raise APIError(f"the request body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {body!r:.80}")
        return body

    def prepare(self, data: bytes, chat: bool, request_id: str, arrival: float
                ) -> tuple[ParsedRequest, Any]:
        """On a worker thread: the body checked and tokenized, as a Request not yet queued."""
        body = self.parse_body(data)
        check_model(body, self.model_name)
        parsed = (parse_chat(body, self.render_chat, self.capacity) if chat
                  else parse_completion(body))
        try:
            req = self.engine.make_request(parsed.prompt, parsed.params, request_id, arrival,
                                         parsed.priority)
        except ValueError as e:
            param = engine_param(str(e), chat)
            message = f"{param}: {e}" if param == "top_logprobs" else str(e)
            raise APIError(message, param) from None
        return parsed, req

    @staticmethod
    def label(raw: Request) -> str | None:
        """The client's X-Request-Id: echoed in the response id and used as the engine's id
        while no request in flight holds it."""
        label = raw.headers.get("x-request-id")
        if label is not None and (len(label) > MAX_LABEL_CHARS or not label.isprintable()):
            raise APIError(f"X-Request-Id must be at most {MAX_LABEL_CHARS} printable "
                           f"characters, got {len(label)}", "X-Request-Id")
        return label or None

    async def handle(self, raw: Request, chat: bool) -> Response:
        arrival = time.perf_counter()  # the server's clock for TTFT starts here
        label = self.label(raw)
        data = await raw.body()  # already read, whole and bounded, by the guard
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = self.engine.reserve_id(prefix, label)
        try:
            parsed, req = await asyncio.get_running_loop().run_in_executor(
                self.workers, self.prepare, data, chat, request_id, arrival)
        except BaseException:  # refused, or the client left while it was being tokenized
            self.engine.release_id(request_id)
            raise
        response_id = f"{prefix}-{label}" if label else request_id
        writer = ResponseWriter(response_id, self.model_name, parsed, self.engine.tokenizer)
        outputs = self.engine.stream(req)
        if parsed.stream:
            return StreamingResponse(self._events(outputs, writer, parsed),
                                     media_type="text/event-stream")
        last = await self._last(outputs, raw)
        if last is None:  # nobody is listening; 499 is nginx's "client closed request"
            return Response(status_code=499)
        if last.finish_reason == "error":
            raise APIError(f"the request failed: {last.error}", status=500,
                           kind="InternalServerError")
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
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if done:
                    return task.result()
                if await raw.is_disconnected():
                    task.cancel()  # closes the stream, which aborts the request
                    return None
        finally:
            task.cancel()

    @staticmethod
    async def _events(outputs: AsyncIterator[RequestOutput], writer: ResponseWriter,
                      parsed: ParsedRequest) -> AsyncIterator[str]:
        """Server-sent events: the role chunk with the first token (chat), a chunk per step with
        new text, the usage chunk, [DONE]. A failure is an error event, then [DONE]. When the
        client disconnects, this generator is closed, and so is outputs: abort."""
        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        first, last = writer.first_chunk(), None
        try:
            async for last in outputs:
                if last.finish_reason == "error":
                    yield event(APIError(f"the request failed: {last.error}", status=500,
                                         kind="InternalServerError").body())
                    break
                if first is not None:
                    yield event(first)
                    first = None
                chunk = writer.chunk(last)
                if chunk is not None:
                    yield event(chunk)
            else:
                if parsed.include_usage and last is not None:
                    yield event(writer.usage_chunk(last))
        except EngineDead as e:
            yield event(engine_error(e).body())
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"


def tokenize_routes(app: FastAPI, server: Server) -> None:
    """vLLM's /tokenize and /detokenize, which benchmark clients use to align prompt lengths."""
    tok = server.engine.tokenizer

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict[str, Any]:
        body = server.parse_body(await raw.body())
        check_model(body, server.model_name)
        if "messages" in body:
            ids = parse_chat(body, server.render_chat, server.capacity).prompt
        elif isinstance(body.get("prompt"), str):
            if tok is None:
                raise APIError("this checkpoint has no tokenizer", "prompt")
            try:
                ids = await asyncio.get_running_loop().run_in_executor(
                    server.workers, server.engine.processor.tokenize, body["prompt"])
            except ValueError as e:
                raise APIError(str(e), "prompt") from None
        else:
            raise APIError("tokenize takes a prompt string or chat messages", "prompt")
        return {"count": len(ids), "max_model_len": server.engine.config.max_model_len,
                "tokens": list(ids), "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict[str, Any]:
        body = server.parse_body(await raw.body())
        check_model(body, server.model_name)
        ids, vocab = body.get("tokens"), server.engine.vocab_size
        if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise APIError(f"tokens must be a list of token ids in [0, {vocab})", "tokens")
        if tok is None:
            raise APIError("this checkpoint has no tokenizer", "tokens")
        return {"prompt": tok.decode(ids)}


def build_app(engine: LLM | EngineClient, model_name: str | None = None,
              config: ServerConfig | None = None, bound_host: str = "127.0.0.1") -> FastAPI:
    """The OpenAI-compatible app serving engine (an LLM is served on a thread of this process,
    EngineLoop); the engine runs while the app does, and stops with it.
    config: the guards and limits (default ServerConfig()); bound_host: the address the server
    listens on, which decides the Host names it answers to."""
    if isinstance(engine, LLM):
        engine = EngineLoop(engine)
    model_name = model_name or engine.model_name
    config = config or ServerConfig()
    server = Server(engine, model_name, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.engine.start()
        yield
        server.engine.stop()  # aborts whatever the graceful shutdown did not finish
        server.workers.shutdown(wait=False, cancel_futures=True)

    docs = {} if config.enable_docs else {"docs_url": None, "redoc_url": None,
                                          "openapi_url": None}
    app = FastAPI(title="minillm", summary="An OpenAI-compatible server for minillm",
                  lifespan=lifespan, **docs)
    app.state.server = server
    if config.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"])
    app.add_middleware(Guard, config=config, bound_host=bound_host)  # outermost: first
    add_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if server.engine.alive else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "minillm",
            "root": model_name, "parent": None,
            "max_model_len": server.engine.config.max_model_len,
            "permission": []}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    for path, route in (("/health", health), ("/metrics", metrics)):  # probes use HEAD too
        app.add_api_route(path, route, methods=["HEAD"], include_in_schema=False)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await server.handle(raw, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await server.handle(raw, chat=True)

    tokenize_routes(app, server)
    return app
