"""The downstream stdio transport: MCP over our own stdin/stdout, cancellable.

The SDK's `stdio_server` reads stdin in a worker thread, which a cancellation
cannot interrupt: on SIGTERM the server would hang until the client closed
stdin, and the upstreams would live on. Here stdin and stdout are
non-blocking descriptors awaited with `anyio.wait_readable`/`wait_writable`, so
a signal ends serving at once and the pool can stop every upstream.

While serving, fd 0 reads from the null device and fd 1 goes to stderr (the
wire uses private duplicates): a stray `print()` or a child that inherits our
descriptors can never corrupt the protocol stream.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from aggregator.log import get_logger
from aggregator.wire import LineSplitter, MessageTooLarge, encode, parse_line

log = get_logger(__name__)

READ_CHUNK = 1 << 16


def _pollable(fd: int) -> bool:
    """Pipes, sockets and ttys can be awaited; regular files (`< file`) cannot."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """(read, write) streams for `Server.run` over this process's stdin/stdout."""
    if sys.platform == "win32" or not (_pollable(0) and _pollable(1)):  # pragma: no cover - fallback
        async with stdio_server() as streams:
            yield streams  # type: ignore[misc]
        return
    blocking = os.get_blocking(0), os.get_blocking(1)  # shared with whoever started us: restore on exit
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    os.set_blocking(wire_in, False)
    os.set_blocking(wire_out, False)
    to_server, read = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    write, from_server = anyio.create_memory_object_stream[SessionMessage](64)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_messages, wire_in, to_server)
            tg.start_soon(_write_messages, wire_out, from_server)
            try:
                yield read, write
            finally:
                tg.cancel_scope.cancel()
    finally:
        for fd, saved, was_blocking in ((0, saved_in, blocking[0]), (1, saved_out, blocking[1])):
            with suppress(OSError):
                os.set_blocking(saved, was_blocking)
                os.dup2(saved, fd)
                os.close(saved)
        for fd in (wire_in, wire_out):
            with suppress(OSError):
                os.close(fd)


async def _read_messages(fd: int, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    """Newline-delimited JSON-RPC from `fd` until EOF; a bad line is passed on as an exception."""
    splitter = LineSplitter()
    async with sink:
        while True:
            await anyio.wait_readable(fd)
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not chunk:
                return
            try:
                lines = splitter.feed(chunk)
            except MessageTooLarge as exc:
                log.error("client message too large; closing", error=str(exc))
                return
            for line in lines:
                if line.strip():
                    await sink.send(parse_line(line, "client"))


async def _write_messages(fd: int, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    async with source:
        async for message in source:
            try:
                await _write_all(fd, encode(message))
            except OSError as exc:  # the client went away
                log.info("stdout closed", error=str(exc))
                return


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await anyio.wait_writable(fd)
            continue
        view = view[written:]
