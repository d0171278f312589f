"""The downstream socket transport: one MCP session per connection accepted on a Unix socket.

This is how `aggregator connect` clients reach the per-user service. Every
connection is served exactly like stdio (`stdio.wire_streams`: the same framing,
refusals, in-flight bound and drain at EOF) by its own run of the low-level
server, so each client is its own MCP session while the upstream pool, catalogs
and indexes behind the server are shared. The socket file is 0600 in a 0700
directory, and a peer whose uid is not ours (SO_PEERCRED) is refused on top.
"""

from __future__ import annotations

import array
import fcntl
import os
import selectors
import socket
import struct
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio

from aggregator.downstream.stdio import READ_CHUNK, StdioLimits, Wire, _pollable, wire_streams
from aggregator.log import get_logger

log = get_logger(__name__)

ACCEPT_BACKOFF = 0.1  # seconds to wait after accept fails (out of descriptors) before trying again
HANDOFF = b"\0"  # `connect`'s first byte when it passes the client's stdin and stdout (SCM_RIGHTS) with it
FD_SIZE = array.array("i").itemsize


def listen_unix(path: Path, backlog: int = 128) -> socket.socket:
    """A non-blocking listener at `path`, mode 0600; a stale file there is replaced.

    The caller must own the path (the service holds its pid lock): a live socket
    would be taken over.
    """
    with suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)  # created 0600: no moment when another user could connect
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end (Linux), or None where the system cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux: the 0700 directory is the guard
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except OSError:
        return None
    return int(uid)


async def accept(listener: socket.socket) -> socket.socket:
    """The next connection of this user; others are closed unread."""
    while True:
        await anyio.wait_readable(listener)
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            continue
        except OSError as exc:  # EMFILE and the like: wait instead of spinning
            log.warning("accept failed", error=str(exc))
            await anyio.sleep(ACCEPT_BACKOFF)
            continue
        uid = peer_uid(conn)
        if uid is not None and uid != os.getuid():
            log.warning("refused a connection from another user", uid=uid)
            conn.close()
            continue
        return conn


class Attached:
    """How many clients are attached now and in all; `changed` is set at every attach and detach."""

    def __init__(self) -> None:
        self.now = 0
        self.total = 0
        self.changed = anyio.Event()

    def _bump(self, delta: int) -> None:
        self.now += delta
        self.total += max(delta, 0)
        self.changed.set()
        self.changed = anyio.Event()


async def serve_connections(server: Any, listener: socket.socket, limits: StdioLimits, attached: Attached) -> None:
    """Accept for ever; each connection becomes an MCP session of `server` (an `AggregatorServer`)."""
    async with anyio.create_task_group() as tg:
        while True:
            conn = await accept(listener)
            tg.start_soon(_session, server, conn, limits, attached)


async def _session(server: Any, conn: socket.socket, limits: StdioLimits, attached: Attached) -> None:
    attached._bump(1)
    log.info("client attached", clients=attached.now)
    fds: list[int] = []
    try:
        early, fds = await _first_bytes(conn)
        if fds and (early[:1] != HANDOFF or len(fds) != 2):
            log.warning("refused a connection that passed descriptors without a hand-off", count=len(fds))
        elif fds:  # `connect` passed the client's own stdin and stdout: serve them, no hop in between
            wire = Wire(fds[0], fds[1], _pollable(fds[0], selectors.EVENT_READ), False)
            wire.poll_out = _pollable(fds[1], selectors.EVENT_WRITE)
            blocking = [os.get_blocking(fd) for fd in fds]  # shared with the client's side (a terminal...)
            try:
                await _serve(server, wire, limits, early[1:], lifeline=conn)
            finally:
                for fd, was in zip(fds, blocking, strict=True):
                    with suppress(OSError):
                        os.set_blocking(fd, was)
        else:  # `connect --relay` or any plain client: the socket carries the messages
            fds = [fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)]  # the writer's own end
            await _serve(server, Wire(conn.fileno(), fds[0], True, True), limits, early)
    except Exception:  # one client's session must never end the others'
        log.exception("client session failed")
    finally:
        for fd in fds:
            with suppress(OSError):
                os.close(fd)
        conn.close()
        attached._bump(-1)
        log.info("client detached", clients=attached.now)


async def _first_bytes(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The connection's first bytes, and the descriptors sent with them (a hand-off), close-on-exec."""
    conn.setblocking(False)
    while True:
        await anyio.wait_readable(conn)
        try:
            data, ancillary, _flags, _address = conn.recvmsg(
                READ_CHUNK,
                socket.CMSG_SPACE(2 * FD_SIZE),
                getattr(socket, "MSG_CMSG_CLOEXEC", 0),  # not on macOS
            )
        except BlockingIOError:
            continue
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % FD_SIZE
                fds += array.array("i", payload[:whole]).tolist()
        return data, fds


async def _serve(
    server: Any, wire: Wire, limits: StdioLimits, early: bytes, lifeline: socket.socket | None = None
) -> None:
    """One MCP session on `wire`; with a `lifeline` (the hand-off's socket), also ended when `connect` is gone."""
    async with anyio.create_task_group() as tg:
        if lifeline is not None:
            tg.start_soon(_end_with, lifeline, tg.cancel_scope)
        async with wire_streams(wire, limits, early, lanes=server.raw.lane) as (read, write):
            await server.lowlevel.run(read, write, server.lowlevel.create_initialization_options())
        tg.cancel_scope.cancel()


async def _end_with(lifeline: socket.socket, scope: anyio.CancelScope) -> None:
    """`connect` sends nothing after a hand-off: its socket becoming readable means it exited."""
    await anyio.wait_readable(lifeline)
    log.info("connect exited; ending its session")
    scope.cancel()
