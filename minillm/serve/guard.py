"""What every request must pass before a route sees it: its Host, its Origin, the API key, a JSON
content type, and a body of bounded size that arrives in bounded time.

Each refusal is OpenAI's error object with the status a client expects: 400 (a Host this server
does not answer to), 403 (another site's Origin), 401 (no key, or the wrong one), 415 (a POST
that is not application/json: the one kind of body a web page can send cross-origin without
asking first), 413 (a body over the limit, refused from its Content-Length when it has one) and
408 (a body that does not arrive in time, such as a Content-Length larger than what is sent).
The body is read here, whole and bounded, and handed on to the route.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

from minillm.serve.config import ServerConfig
from minillm.serve.protocol import APIError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A load balancer and Prometheus need no key. vLLM 0.33.0 guards only paths under /v1 (its
# /tokenize is open) and refuses with {"error": "Unauthorized"}; minillm guards every other path.
OPEN_PATHS = ("/health", "/metrics")


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.response = JSONResponse(APIError(message, status=status, kind=kind).body(),
                                     status_code=status)


def _host_name(host: str) -> str:
    """The name in a Host header, without its port ([::1]:8000 -> ::1)."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """ASGI middleware enforcing a ServerConfig for a server bound to bound_host."""

    def __init__(self, app: ASGIApp, config: ServerConfig, bound_host: str):
        self.app, self.config = app, config  # app: the routes, behind CORS when it is on
        self.hosts = config.hosts_for(bound_host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = sum(len(k) + len(v) for k, v in scope["headers"])
        if head > self.config.max_header_bytes:  # h11 bounds only a head that arrives slowly
            await Refused(431, "RequestHeaderFieldsTooLargeError",
                          f"the headers hold {head:,} bytes, over this server's limit of "
                          f"{self.config.max_header_bytes:,}").response(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        try:
            self._check_host_and_origin(headers)
            if self.config.allowed_origins and scope["method"] == "OPTIONS":
                await self.app(scope, receive, send)  # a CORS preflight carries no key
                return
            self._check_key(scope["path"], headers)
            if scope["method"] == "POST":
                receive = await self._read_body(receive, headers)
        except Refused as refused:
            await refused.response(scope, receive, send)
            return
        except _Gone:  # the client left while sending its body: nobody to answer
            return
        await self.app(scope, receive, send)

    def _check_host_and_origin(self, headers: dict[str, str]) -> None:
        host = headers.get("host", "")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            raise Refused(400, "BadRequestError",
                          f"Host {host!r} is not a name this server answers to "
                          f"({', '.join(self.hosts)}); add it with --allowed-hosts")
        origin = headers.get("origin")
        if origin is None or origin.split("://", 1)[-1] == host:  # same-origin
            return
        allowed = self.config.allowed_origins
        if "*" not in allowed and origin not in allowed:
            raise Refused(403, "PermissionDeniedError",
                          f"Origin {origin!r} may not call this server; allow it with "
                          "--allowed-origins")

    def _check_key(self, path: str, headers: dict[str, str]) -> None:
        key = self.config.api_key
        if key is None or path in OPEN_PATHS:
            return
        scheme, _, given = headers.get("authorization", "").partition(" ")
        # compare_digest takes the same time wherever the strings differ: no timing oracle
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("latin-1"), key.encode("latin-1")):
            raise Refused(401, "AuthenticationError",
                          "missing or wrong API key: send it as 'Authorization: Bearer KEY'")

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> Receive:
        """The whole body, bounded in size and time, as a receive() that replays it."""
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise Refused(415, "UnsupportedMediaTypeError",
                          f"the body must be sent as Content-Type: application/json, got "
                          f"{media or 'none'!r}")
        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refused(413, "RequestTooLargeError",
                          f"the body of {int(declared):,} bytes is over this server's limit "
                          f"of {limit:,} (--max-request-body-bytes)")
        chunks, size = [], 0
        deadline = time.monotonic() + self.config.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise Refused(408, "RequestTimeoutError",
                              f"the body did not arrive within {self.config.body_timeout:g} s "
                              f"({size:,} bytes received)") from None
            if message["type"] == "http.disconnect":
                raise _Gone
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise Refused(413, "RequestTooLargeError",
                              f"the body is over this server's limit of {limit:,} bytes "
                              "(--max-request-body-bytes)")
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what follows the body: the client's disconnect

        return replay


class _Gone(Exception):
    """The client disconnected before its body was whole."""
