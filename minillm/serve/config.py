"""ServerConfig: who may talk to `minillm serve`, and how much one request may ask of it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
API_KEY_ENV = "MINILLM_API_KEY"  # vLLM's is VLLM_API_KEY


def is_loopback(host: str) -> bool:
    """Whether binding host serves this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """The server's limits and guards (minillm.serve.guard enforces them before any route).

    api_key: None, or the key every route but /health and /metrics requires, as
        `Authorization: Bearer KEY` (vLLM's --api-key).
    allowed_hosts: the Host header values accepted (names or addresses, without the port), so a
        web page cannot reach a loopback server through DNS rebinding; None allows the bound
        host and the loopback names; ("*",) allows any.
    allowed_origins: the browser origins that may call the API cross-origin (CORS); empty,
        the default, turns CORS off and refuses requests that carry another site's Origin.
        (vLLM 0.33.0's --allowed-origins defaults to none as well; 0.11.0's was ["*"].)
    max_body_bytes: the largest request body (413 above it).
    body_timeout: seconds a client has to send its whole body (408 after it).
    max_header_bytes: the largest request head (request line and headers) h11 will parse.
    enable_docs: serve /docs, /redoc and /openapi.json (behind the key when there is one).
    shutdown_grace: seconds a shutdown lets running requests finish before ending each with
        an error event (a stream) or a 503 (a whole response).
    """

    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 2 * 2**20
    body_timeout: float = 30.0
    max_header_bytes: int = 16 * 2**10
    enable_docs: bool = False
    shutdown_grace: float = 5.0

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key
                                         or not self.api_key.isascii()):
            raise ValueError("api_key must be a non-empty ASCII string")
        for name in ("max_body_bytes", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
                raise ValueError(f"{name} must be an integer >= 1024, got {value!r}")
        for name in ("body_timeout", "shutdown_grace"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("allowed_hosts", "allowed_origins"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def hosts_for(self, bound_host: str) -> tuple[str, ...] | None:
        """The Host names accepted for a server bound to bound_host; None accepts any."""
        if self.allowed_hosts is not None:
            return None if "*" in self.allowed_hosts else self.allowed_hosts
        if bound_host in ("0.0.0.0", "::", ""):  # every interface: its names are not known
            return None
        return (bound_host.strip("[]"), *LOOPBACK_NAMES)
