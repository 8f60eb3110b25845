"""How the server fails: every error as OpenAI's error object, with its status.

A client's mistake is an APIError (protocol.py) and a 4xx; a failed or stopping engine
(EngineDead) a 500 or a 503; Starlette's own HTTP errors (a route or a method that does not
exist: 404, 405) keep their status in the same shape; anything else is a bug, logged with its
traceback and answered with a 500 that names only the exception's type. app.py installs the
handlers (build_app) and re-exports both names.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minillm.serve.engine_loop import EngineDead
from minillm.serve.protocol import APIError

# A server's bugs log under the app's name (minillm.serve.app), where an operator looks for them.
log = logging.getLogger("minillm.serve.app")


def engine_error(e: EngineDead) -> APIError:
    """A failed engine is a 500, a stopped one (shutting down) a 503."""
    return APIError(str(e), status=e.status, kind="InternalServerError" if e.status == 500
                    else "ServiceUnavailable")


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error object, 404 and 405 included; a bug is a logged 500."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(EngineDead)
    async def engine_dead(_: Request, e: EngineDead) -> JSONResponse:
        return JSONResponse(engine_error(e).body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        kind = {404: "NotFoundError", 405: "MethodNotAllowedError"}.get(e.status_code,
                                                                        "BadRequestError")
        return JSONResponse(APIError(str(e.detail), status=e.status_code, kind=kind).body(),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def bug(raw: Request, e: Exception) -> JSONResponse:
        log.error("unexpected error on %s %s", raw.method, raw.url.path, exc_info=e)
        return JSONResponse(APIError(f"internal error: {type(e).__name__}", status=500,
                                     kind="InternalServerError").body(), status_code=500)
