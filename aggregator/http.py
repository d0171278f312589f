"""Serving the aggregator over streamable HTTP: bind rules, bearer token, Host checks.

Rules (DESIGN §4 of the core issue): bound to 127.0.0.1 by default, where the
SDK's DNS-rebinding protection checks Host and Origin; a bearer token
(`AGGREGATOR_TOKEN`) is required before it will listen on any other address,
and is checked on every request whenever it is set.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
from collections.abc import Sequence

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from aggregator.log import get_logger
from aggregator.server import AggregatorServer

log = get_logger(__name__)

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class HttpConfigError(ValueError):
    """An HTTP bind that would be unsafe; the CLI exits with code 2."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Pure ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            supplied = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(supplied, self._expected):
                await _reject(send)
                return
        await self.app(scope, receive, send)


async def _reject(send: Send) -> None:
    body = json.dumps({"error": "unauthorized", "message": "missing or wrong bearer token"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a bearer token."""
    if not is_loopback(host) and not token:
        raise HttpConfigError(
            f"refusing to listen on {host}: set AGGREGATOR_TOKEN to a secret bearer token first "
            "(clients then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1"
        )


def build_app(
    server: AggregatorServer, *, host: str, port: int, token: str | None, allowed_hosts: Sequence[str] = ()
) -> ASGIApp:
    """The Starlette app at `/mcp`, wrapped in the bearer check when a token is set."""
    check_bind(host, token)
    security: TransportSecuritySettings | None = None
    if not is_loopback(host) and host not in ("0.0.0.0", "::"):
        hosts = [f"{host}:{port}", host, *allowed_hosts]
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
        )
    elif host in ("0.0.0.0", "::"):
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # the token guards it
    app: ASGIApp = server.lowlevel.streamable_http_app(
        streamable_http_path="/mcp",
        host=host if is_loopback(host) else "0.0.0.0",
        transport_security=security,
    )
    if token:
        app = BearerAuth(app, token)
    return app


async def serve_http(app: ASGIApp, *, host: str, port: int, log_level: str = "warning") -> None:
    """Run uvicorn inside the current event loop until cancelled."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False, log_config=None
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # the CLI owns signals
    log.info("serving over HTTP", url=f"http://{host}:{port}/mcp")
    await server.serve()
