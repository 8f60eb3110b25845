"""Running a server: uvicorn with a shutdown that ends every request with a word, and
start_server(), which runs one on a background thread of this process (notebooks, tests)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from minillm.llm import LLM
from minillm.serve.app import build_app
from minillm.serve.config import ServerConfig
from minillm.serve.engine_client import EngineClient


class GracefulServer(uvicorn.Server):
    """uvicorn, with a shutdown that ends every request with a word.

    On SIGINT/SIGTERM uvicorn stops accepting, waits for open connections, and after its own
    timeout cancels the handlers before the app's shutdown runs, which would cut a stream with
    no error event. So the engine loop is stopped first, after shutdown_grace seconds: each
    stream still running gets an error event and [DONE], each whole response a 503; uvicorn's
    timeout is set a few seconds later, to let those last bytes go out."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str,
                 config: ServerConfig):
        self.grace = config.shutdown_grace
        self.engine = app.state.server.engine
        super().__init__(uvicorn.Config(
            app, host=host, port=port, log_level=log_level, http="h11",
            h11_max_incomplete_event_size=config.max_header_bytes,
            timeout_graceful_shutdown=int(config.shutdown_grace) + 5))

    async def shutdown(self, sockets: Any = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace, self.engine.request_stop)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


class RunningServer:
    """A server on a background thread (start_server); a context manager that stops it.

    engine: the EngineClient it serves through; llm: the LLM it serves on a thread of this
    process (None when the engine core runs in a process of its own)."""

    def __init__(self, uvicorn_server: Any, thread: threading.Thread, host: str, port: int,
                 model_name: str, engine: EngineClient, llm: LLM | None):
        self._server, self._thread = uvicorn_server, thread
        self.url, self.port = f"http://{host}:{port}", port
        self.model_name, self.engine, self.llm = model_name, engine, llm

    def stats(self) -> dict[str, int]:
        """The engine's counters (LLM.stats()'s keys) as of its last step."""
        return self.engine.stats()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunningServer({self.url}, model {self.model_name!r})"


def start_server(engine: LLM | EngineClient, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, timeout: float = 30.0,
                 config: ServerConfig | None = None) -> RunningServer:
    """Serve engine over HTTP from a background thread of this process; port 0 picks a free one.

    engine: an LLM (driven by a thread of this process: read llm.trace and llm.stats() freely,
    but do not call llm.generate meanwhile), or an EngineCoreClient (the engine core in a
    process of its own, which the server stops when it stops). model_name is what clients send
    as `model` (default: the checkpoint folder's name); config the guards and limits (an
    api_key, allowed hosts and origins, the body limit). Returns once the server accepts
    connections.
    """
    llm = engine if isinstance(engine, LLM) else None
    model_name = model_name or engine.model_name
    config = config or ServerConfig()
    app = build_app(engine, model_name, config, host)
    server = GracefulServer(app, host, port, "warning", config)
    thread = threading.Thread(target=server.run, name="minillm-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            app.state.server.engine.stop(0)  # an engine core process goes with it
            raise RuntimeError(f"the server did not start on {host}:{port} (is the port free?)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, host, bound, model_name, app.state.server.engine, llm)
