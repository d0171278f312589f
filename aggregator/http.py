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
import socket
from collections.abc import Sequence

import anyio
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


def transport_security(host: str, port: int, allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """Host/Origin checks (DNS-rebinding protection) for this bind, always explicit.

    The SDK enables them by itself only for the exact names 127.0.0.1, localhost
    and ::1; any other loopback address (127.0.0.2) would be served unchecked.
    A wildcard bind cannot know its own names: there the required token guards it,
    plus whatever `--allow-host` names.
    """
    wildcard = host in ("0.0.0.0", "::")
    names = [*allowed_hosts]
    if not wildcard:
        names.append(f"[{host}]" if ":" in host else host)
    if is_loopback(host):
        names += ["127.0.0.1", "localhost", "[::1]"]
    if wildcard and not allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [pattern for name in dict.fromkeys(names) for pattern in (name, f"{name}:*")]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def build_app(
    server: AggregatorServer, *, host: str, port: int, token: str | None, allowed_hosts: Sequence[str] = ()
) -> ASGIApp:
    """The Starlette app at `/mcp`, wrapped in the bearer check when a token is set."""
    check_bind(host, token)
    app: ASGIApp = server.lowlevel.streamable_http_app(
        streamable_http_path="/mcp", host=host, transport_security=transport_security(host, port, allowed_hosts)
    )
    if token:
        app = BearerAuth(app, token)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything starts, so a taken port is one clear error (exit 2), not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as exc:
        raise HttpConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def serve_http(app: ASGIApp, sock: socket.socket, *, log_level: str = "warning") -> None:
    """Run uvicorn on `sock` in the current event loop; on cancellation, shut it down gracefully."""
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False, log_config=None)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # the CLI owns signals
    host, port = sock.getsockname()[:2]
    log.info("serving over HTTP", url=f"http://{host}:{port}/mcp")
    finished = anyio.Event()

    async def run() -> None:
        with anyio.CancelScope(shield=True):  # stopped through should_exit, never cancelled mid-request
            try:
                await server.serve(sockets=[sock])
            finally:
                finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            await finished.wait()
        finally:
            server.should_exit = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await finished.wait()
            server.force_exit = True
