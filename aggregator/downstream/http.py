"""Serving the aggregator over streamable HTTP: bind rules, bearer token, Host checks, limits.

Rules (DESIGN §4 of the core issue): bound to 127.0.0.1 by default, where the
SDK's DNS-rebinding protection checks Host and Origin; a bearer token
(`AGGREGATOR_TOKEN`) is required before it will listen on any other address,
and is checked on every request whenever it is set.

Limits (README "Failure behaviour"): a session with no request for
`session_idle_seconds` is closed; open sessions are bounded per client address
and in total, and a new session past a bound evicts the least busy, least
recently used one (of that client first) instead of locking every new client
out; a connection gets `header_timeout` seconds to send its request line and
headers and `body_timeout` more for its body, then it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import h11
import uvicorn
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from aggregator.log import get_logger
from aggregator.proxy.server import AggregatorServer
from aggregator.sdk.deferred import restore_sse_drain

restore_sse_drain()  # `serve` imported sse_starlette without uvicorn (issue 24: memory)

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


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds of the HTTP server (settings `AGGREGATOR_HTTP_*`)."""

    max_sessions: int = 1000
    max_sessions_per_client: int = 200
    session_idle_seconds: float = 900.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0


@dataclass(slots=True)
class _Seen:
    client: str
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0  # requests of this session being served now (an open GET stream counts)


class SessionLimits:
    """Pure ASGI middleware in front of the SDK's session manager: bounded sessions, eviction not lockout.

    The SDK refuses every new session with 503 once `max_sessions` are open, until
    some expire: a flood of sessions locks every other client out. Here, once a
    new session is established (so refused or invalid requests never evict), a
    bound it passes is restored by evicting another session: of the same client
    when the per-client bound is the one passed, preferring those with no request
    in progress, then the least recently used (the idle leftovers of a flood go
    first). The SDK's own bound stays as a backstop above ours.
    """

    def __init__(self, app: ASGIApp, manager: StreamableHTTPSessionManager, limits: HttpLimits) -> None:
        self.app = app
        self._manager = manager
        self._limits = limits
        self._seen: dict[str, _Seen] = {}
        self._lock = anyio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown", 0))[0]
        session_id = _header(scope, MCP_SESSION_ID_HEADER.encode())
        if session_id is None:
            await self.app(scope, receive, self._recording(send, client))
            return
        seen = self._seen.get(session_id)
        if seen is None:
            await self.app(scope, receive, send)
            return
        seen.busy += 1
        seen.last_used = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            seen.busy -= 1
            seen.last_used = time.monotonic()

    def _recording(self, send: Send, client: str) -> Send:
        """`send`, admitting the session a successful opening request created."""

        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                session_id = _header(message, MCP_SESSION_ID_HEADER.encode())
                if session_id is not None:
                    async with self._lock:
                        await self._admit(session_id, client)
            await send(message)

        return recording

    async def _admit(self, new: str, client: str) -> None:
        """Track session `new`; evict others while a bound is exceeded (only real sessions count)."""
        live = self._sessions()
        for gone in [sid for sid in self._seen if sid not in live]:  # ended: DELETE, idle expiry, crash
            del self._seen[gone]
        self._seen[new] = _Seen(client)
        while True:
            mine = [sid for sid, seen in self._seen.items() if seen.client == client and sid != new]
            if len(mine) >= self._limits.max_sessions_per_client:
                await self._evict(mine, f"client {client} has {len(mine) + 1} sessions open")
            elif len(live) > self._limits.max_sessions and len(self._seen) > 1:
                await self._evict([sid for sid in self._seen if sid != new], f"{len(live)} sessions open")
            else:
                return

    def _sessions(self) -> dict[str, Any]:
        return self._manager._server_instances  # the SDK keeps no public view of its open sessions

    async def _evict(self, candidates: list[str], why: str) -> None:
        victim = min(candidates, key=lambda sid: (self._seen[sid].busy > 0, self._seen[sid].last_used))
        del self._seen[victim]
        transport = self._sessions().get(victim)
        log.info("evicting an HTTP session to admit a new one", reason=why, session=victim[:8])
        if transport is not None:
            await self._manager._discard_session(victim, transport)  # forgets it first, then terminates


def _header(scope_or_message: Scope | Message, name: bytes) -> str | None:
    for key, value in scope_or_message.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def build_app(
    server: AggregatorServer,
    *,
    host: str,
    port: int,
    token: str | None,
    allowed_hosts: Sequence[str] = (),
    limits: HttpLimits | None = None,
) -> ASGIApp:
    """The Starlette app at `/mcp` with session limits, wrapped in the bearer check when a token is set."""
    check_bind(host, token)
    limits = limits or HttpLimits()
    app: ASGIApp = server.lowlevel.streamable_http_app(
        streamable_http_path="/mcp",
        host=host,
        transport_security=transport_security(host, port, allowed_hosts),
        session_idle_timeout=limits.session_idle_seconds,
        max_sessions=limits.max_sessions + 64,  # a backstop: SessionLimits evicts before this is reached
    )
    app = SessionLimits(app, server.lowlevel.session_manager, limits)
    if token:
        app = BearerAuth(app, token)
    return app


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines: slow headers or bodies cannot hold a connection.

    uvicorn times out only idle keep-alive connections; a client that sends its
    headers or body a byte at a time keeps the connection (and a descriptor) for
    ever. Here the request line and headers must arrive within `header_timeout`
    of the first byte (or of the connection), the body within `body_timeout` of
    the headers; past that the connection is closed.
    """

    header_timeout = 10.0  # replaced per server by `timed_protocol`
    body_timeout = 30.0
    _timer: asyncio.TimerHandle | None = None
    _phase: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._set_phase("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        self._set_phase("headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_phase(None)
        super().connection_lost(exc)

    def _set_phase(self, phase: str | None) -> None:
        if phase == self._phase:
            return  # a deadline runs from the start of its phase: more bytes do not extend it
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        if phase is not None:
            timeout = self.header_timeout if phase == "headers" else self.body_timeout
            self._timer = self.loop.call_later(timeout, self._too_slow, phase)

    def _too_slow(self, phase: str) -> None:
        self._timer = None
        if not self.transport.is_closing():
            log.info("closing a slow HTTP connection", waiting_for=phase, client=self.client)
            self.transport.close()


def timed_protocol(limits: HttpLimits) -> type[TimedH11Protocol]:
    return type(
        "TimedH11Protocol",
        (TimedH11Protocol,),
        {"header_timeout": limits.header_timeout, "body_timeout": limits.body_timeout},
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything starts, so a taken port is one clear error (exit 2), not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as exc:
        raise HttpConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def serve_http(
    app: ASGIApp, sock: socket.socket, *, log_level: str = "warning", limits: HttpLimits | None = None
) -> None:
    """Run uvicorn on `sock` in the current event loop; on cancellation, shut it down gracefully."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        log_config=None,
        http=timed_protocol(limits or HttpLimits()),
    )
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
