"""Transports to a remote upstream: streamable HTTP and SSE (the SDK's), over a capped httpx2 client.

Apart from `transports.py` so that a `serve` with stdio upstreams only never imports httpx2 (issue 24,
memory): `open_transport` imports this module for the first remote upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from aggregator.config import UpstreamConfig
from aggregator.safetext import SurrogateEscapes
from aggregator.sdk import HTTP_TIMEOUT_SECONDS, SSE_READ_TIMEOUT_SECONDS
from aggregator.upstream.transports import TransportHandle


@asynccontextmanager
async def open_remote(config: UpstreamConfig, auth: httpx2.Auth | None) -> AsyncIterator[TransportHandle]:
    """Open the configured HTTP or SSE transport (`auth`: the upstream's OAuth provider, or None)."""
    closed = anyio.Event()
    limit = config.max_message_bytes
    overflow = _Overflow()
    assert config.url is not None
    if config.transport == "http":  # SSE events: the SDK's own cap; JSON bodies: ours
        client = capped_http_client(
            limit, headers=dict(config.headers) or None, timeout=_http_timeout(config), auth=auth
        )
        client.event_hooks = {"response": [_session_lost_hook(closed)]}
        async with (
            client,
            streamable_http_client(config.url, http_client=client, max_sse_event_size=limit) as streams,
            _relayed(streams, closed, limit, overflow) as handle,  # type: ignore[arg-type]
        ):
            yield handle
    else:
        async with (
            sse_client(
                config.url,
                headers=dict(config.headers) or None,
                timeout=config.timeouts.connect,
                sse_read_timeout=max(300.0, config.timeouts.call * 2),
                auth=auth,
                httpx_client_factory=lambda headers=None, timeout=None, auth=None: capped_http_client(
                    limit, headers=headers, timeout=timeout, auth=auth, overflow=overflow
                ),
            ) as streams,
            _relayed(streams, closed, limit, overflow) as handle,
        ):  # type: ignore[arg-type]
            yield handle


@dataclass
class _Overflow:
    """Set by the HTTP byte cap when it ends an SSE stream: the connection was lost to a huge message."""

    seen: bool = False


class ResponseTooLarge(httpx2.StreamError):
    """An HTTP body (or one SSE event) over max_message_bytes; the SDK answers the request with it."""


class _CappedStream(httpx2.AsyncByteStream):
    """Counts the bytes of one message as they arrive: the whole body, or each SSE event."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, overflow: _Overflow | None) -> None:
        self._inner = inner
        self._limit = limit
        self._overflow = overflow  # None: a whole body is one message; else each SSE event is
        self._per_event = overflow is not None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        tail = b""  # the end of the previous chunk: a boundary may straddle two chunks
        async for chunk in self._inner:
            seen = tail + chunk
            if self._per_event and (cut := max(seen.rfind(b"\n\n"), seen.rfind(b"\n\r\n"))) >= 0:
                size = len(seen) - cut  # bytes after the last event boundary
            else:
                size += len(chunk)
            tail = chunk[-3:]
            if size > self._limit:
                if self._overflow is not None:
                    self._overflow.seen = True
                raise ResponseTooLarge(f"a message exceeded the {self._limit} byte limit (max_message_bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ScrubbedStream(httpx2.AsyncByteStream):
    """Lone surrogate escapes replaced (`SurrogateEscapes`): the SDK's parser refuses them outright."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        escapes = SurrogateEscapes()
        async for chunk in self._inner:
            if scrubbed := escapes.feed(chunk):
                yield scrubbed
        if rest := escapes.flush():
            yield rest

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    """Caps JSON bodies; SSE streams too when given an `_Overflow` (else the SDK caps their events)."""

    def __init__(self, limit: int, overflow: _Overflow | None) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit
        self._overflow = overflow

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            response.stream = _CappedStream(response.stream, self._limit, None)
        elif self._overflow is not None:
            response.stream = _CappedStream(response.stream, self._limit, self._overflow)
        response.stream = _ScrubbedStream(response.stream)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_http_client(
    limit: int,
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
    overflow: _Overflow | None = None,
) -> httpx2.AsyncClient:
    """The SDK's HTTP client, refusing any message over `limit` bytes as it streams in."""
    if timeout is None:  # the SDK's defaults, as create_mcp_http_client has them
        timeout = httpx2.Timeout(HTTP_TIMEOUT_SECONDS, read=SSE_READ_TIMEOUT_SECONDS)
    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, transport=_CappedTransport(limit, overflow))


def _http_timeout(config: UpstreamConfig) -> httpx2.Timeout:
    return httpx2.Timeout(config.timeouts.connect, read=max(300.0, config.timeouts.call * 2))


def _session_lost_hook(closed: anyio.Event) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A 404 to a request carrying our session id: the server restarted and forgot us (spec: start anew)."""

    async def hook(response: httpx2.Response) -> None:
        if response.status_code == 404 and "mcp-session-id" in response.request.headers:
            closed.set()

    return hook


@asynccontextmanager
async def _relayed(
    streams: tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]],
    closed: anyio.Event,
    limit: int,
    overflow: _Overflow,
) -> AsyncIterator[TransportHandle]:
    """Pass the SDK's read stream through, so the end of an HTTP/SSE connection is noticed."""
    read, write = streams
    to_session, session_read = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    handle = TransportHandle(session_read, write, closed=closed, limit=limit)

    async def relay() -> None:
        try:
            async for item in read:
                await to_session.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            handle.overflow = overflow.seen
            closed.set()  # before the session sees the end: its failed calls then count as a lost connection
            await to_session.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay)
        try:
            yield handle
        finally:
            tg.cancel_scope.cancel()
            await session_read.aclose()
