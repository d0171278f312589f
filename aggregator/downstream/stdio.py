"""The downstream stdio transport: MCP over our own stdin/stdout, cancellable and bounded.

The SDK's `stdio_server` reads stdin in a worker thread, which a cancellation
cannot interrupt: on SIGTERM the server would hang until the client closed
stdin, and the upstreams would live on. Here stdin and stdout are
non-blocking descriptors awaited with `anyio.wait_readable`/`wait_writable`, so
a signal ends serving at once and the pool can stop every upstream. A
descriptor the event loop cannot poll (a regular file, `/dev/null`) is read or
written in a worker thread instead: such reads and writes never block for long.

While serving, fd 0 reads from the null device and fd 1 goes to stderr (the
wire uses private duplicates): a stray `print()` or a child that inherits our
descriptors can never corrupt the protocol stream.

What the client sends is checked line by line (`client_messages`): a line that is not a
valid request is answered with the JSON-RPC error it deserves, an oversized one
is skipped, and the session goes on. At most `max_in_flight` requests are with
the server at once and as many more wait in a backlog; past that, stdin is not
read (beyond the few chunks `PipeReader` reads ahead) until an answer has been written to
stdout, so a client that stops reading its answers stops us reading its requests instead of
growing our memory. When stdin ends, requests still
running get `drain_seconds` to finish; whatever is left is cancelled and
answered with an error, and every answer is flushed before we return.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import selectors
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.abc
import anyio.to_thread
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from aggregator.downstream.client_messages import (
    SHUTTING_DOWN,
    Oversized,
    PlainRequest,
    Refusal,
    SkippingLineSplitter,
    parse_client_line,
    parse_read_line,
    plain_fields,
    refuse_oversized,
)
from aggregator.log import get_logger
from aggregator.pipe_reader import READ_CHUNK, PipeReader, eager_line, write_some
from aggregator.wire import MAX_MESSAGE_BYTES, encode, error_line

log = get_logger(__name__)

FLUSH_SECONDS = 5.0
LONG_LIVED = frozenset({"subscriptions/listen"})  # open for the whole session: not waited for at EOF


@dataclass(frozen=True, slots=True)
class StdioLimits:
    """Per-session bounds (settings `AGGREGATOR_MAX_IN_FLIGHT`, `AGGREGATOR_DRAIN_SECONDS`)."""

    max_in_flight: int = 64
    drain_seconds: float = 10.0


def plug_standard_fds() -> None:
    """Open the null device on fds 0-2 if they were closed when we started (`aggregator serve <&-`).

    Otherwise the next file or socket opened lands on fd 0 or 1 and would be
    taken for the client's pipe (uvloop even aborts on it).
    """
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, flags)  # the lowest free descriptor: `fd`, lower ones are plugged
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def _pollable(fd: int, events: int) -> bool:
    """Whether the event loop can wait on `fd`: pipes, sockets, ttys; not files or /dev/null."""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, events)
    except (OSError, ValueError):
        return False
    return True


def _dup_private(fd: int) -> int:
    """A close-on-exec duplicate of `fd` above the standard descriptors."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class InFlight:
    """Requests handed to the server and not yet answered on stdout: the per-session bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0  # requests read but waiting for room (the backlog)
        self._methods: dict[Any, str] = {}
        self._changed = anyio.Event()
        self._waiting = 0  # tasks in `_wait`
        self.closed = False  # stdout is gone: nobody waits for room any more

    def __len__(self) -> int:
        return len(self._methods)

    def __contains__(self, request_id: Any) -> bool:
        return request_id in self._methods

    def add(self, request_id: Any, method: str) -> None:
        self._methods[request_id] = method

    def discard(self, request_id: Any) -> None:
        if self._methods.pop(request_id, None) is not None:
            self._wake()

    def has_room(self) -> bool:
        return len(self._methods) < self.limit

    def enqueue(self) -> None:
        self.queued += 1

    def dequeue(self) -> None:
        self.queued -= 1
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiting:  # else nobody is told: the event stays (one per call saved)
            self._changed.set()
            self._changed = anyio.Event()

    async def _wait(self) -> None:
        """Until the next change (counted: `_wake` need not ask the event, which builds its statistics)."""
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1

    def draining(self) -> int:
        """Requests that a shutdown waits for: queued and running ones, long-lived subscriptions excepted."""
        return self.queued + sum(method not in LONG_LIVED for method in self._methods.values())

    async def room(self) -> None:
        while not self.has_room() and not self.closed:
            await self._wait()

    async def drained(self) -> None:
        while self.draining() and not self.closed:
            await self._wait()


class Lane(Protocol):
    """One client's raw calls (`proxy/raw.py`): requests answered as bytes, without the SDK's runner."""

    def accepts(self, message: types.JSONRPCRequest, *, duplicate: bool) -> bool: ...

    def takes(self, message: PlainRequest) -> bool: ...

    def start(self, message: PlainRequest | types.JSONRPCRequest, task_group: anyio.abc.TaskGroup) -> None: ...

    def cancel(self, params: dict[str, Any] | None) -> bool: ...


LaneFactory = Callable[["Outbox", Callable[[Any], None]], Lane]
"""Makes a client's lane from its outbox and the callback that frees an answered request's slot."""


class Outbox:
    """What goes to the client: the writer task's queue, and a way around it for the raw lanes' answers.

    An answer is written at once by the task that has it when the writer task is parked waiting
    for its next item and nothing is queued (so nothing written later overtakes what came
    first); otherwise it is queued like everything else. The lock keeps a write that a full pipe
    cut in two whole.
    """

    def __init__(self, wire: Wire, queue: MemoryObjectSendStream[SessionMessage | bytes]) -> None:
        self.wire = wire
        self.queue = queue
        self.lock = asyncio.Lock()  # not anyio's: its uncontended acquire still looks up the backend
        self.gone: Callable[[OSError], None] = lambda exc: None  # the writer's reaction to a closed stdout

    async def send(self, line: bytes) -> None:
        """Write `line` now if nothing is ahead of it, else queue it; raises `anyio.BrokenResourceError`
        when the client is gone."""
        stats = self.queue.statistics()
        if stats.tasks_waiting_receive and not stats.current_buffer_used and not self.lock.locked():
            await self.write(line)
        else:
            await self.queue.send(line)

    def send_nowait(self, line: bytes) -> None:
        """Queue `line` without waiting (raises `anyio.WouldBlock` when the queue is full)."""
        self.queue.send_nowait(line)

    async def write(self, data: bytes) -> None:
        """Write `data` whole: at once if nothing else is being written (`write_some`), the rest under the lock."""
        try:
            if self.wire.poll_out and not self.lock.locked():
                written = write_some(self.wire.fd_out, data)
                if written == len(data):
                    return
                data = data[written:]
            async with self.lock:
                await _write_all(self.wire, data)
        except OSError as exc:
            self.gone(exc)
            raise anyio.BrokenResourceError from exc


@dataclass(slots=True)
class Wire:
    """One client's descriptors, and whether the event loop can wait on each."""

    fd_in: int
    fd_out: int
    poll_in: bool
    poll_out: bool


@asynccontextmanager
async def stdio_streams(
    limits: StdioLimits | None = None, lanes: LaneFactory | None = None
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """(read, write) streams for `Server.run` over this process's stdin/stdout."""
    limits = limits or StdioLimits()
    if sys.platform == "win32":  # pragma: no cover - fallback
        async with stdio_server() as streams:
            yield streams  # type: ignore[misc]
        return
    wire = Wire(_dup_private(0), _dup_private(1), _pollable(0, selectors.EVENT_READ), False)
    wire.poll_out = _pollable(1, selectors.EVENT_WRITE)
    blocking = os.get_blocking(0), os.get_blocking(1)  # shared with whoever started us: restore on exit
    saved_in, saved_out = _dup_private(0), _dup_private(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    try:
        async with wire_streams(wire, limits, lanes=lanes) as streams:
            yield streams
    finally:
        for fd, saved, was_blocking in ((0, saved_in, blocking[0]), (1, saved_out, blocking[1])):
            with suppress(OSError):
                os.set_blocking(saved, was_blocking)
                os.dup2(saved, fd)
                os.close(saved)
        for fd in (wire.fd_in, wire.fd_out):
            with suppress(OSError):
                os.close(fd)


@asynccontextmanager
async def wire_streams(
    wire: Wire, limits: StdioLimits, early: bytes = b"", lanes: LaneFactory | None = None
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """(read, write) streams for `Server.run` over one client's descriptors: our stdio, or an accepted socket.

    The descriptors are made non-blocking where pollable and left open: whoever opened them closes them.
    `early` is what was already read from `fd_in` (a socket's first bytes, read to learn its kind).
    `lanes`: the raw path's lane for this client (None: every request goes to the server).
    """
    if wire.poll_in:
        os.set_blocking(wire.fd_in, False)
    if wire.poll_out:
        os.set_blocking(wire.fd_out, False)
    to_server, read = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write, from_server = anyio.create_memory_object_stream[SessionMessage | bytes](64)
    in_flight = InFlight(limits.max_in_flight)
    writer_done = anyio.Event()
    async with anyio.create_task_group() as tg:
        reader = anyio.CancelScope()
        outbox = Outbox(wire, write)
        lane = lanes(outbox, in_flight.discard) if lanes is not None else None
        tg.start_soon(_read_messages, wire, to_server, write.clone(), in_flight, limits, reader, early, lane)
        tg.start_soon(_write_messages, outbox, from_server, in_flight, writer_done, reader)
        try:
            yield read, cast(MemoryObjectSendStream[SessionMessage], write)
        finally:
            # The server has stopped: stop reading, then let the writer flush what it was given.
            reader.cancel()
            write.close()
            with anyio.move_on_after(FLUSH_SECONDS, shield=True):
                await writer_done.wait()
            tg.cancel_scope.cancel()


class _ThreadReads:
    """Reads of a descriptor the event loop cannot poll (a regular file, /dev/null), in a worker thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive(self) -> bytes:
        """The next bytes; b"" at EOF or on a read error."""
        try:
            return await anyio.to_thread.run_sync(os.read, self._fd, READ_CHUNK, abandon_on_cancel=True)
        except OSError:
            return b""

    def close(self) -> None:
        pass


def _chunks_of(wire: Wire, eager: Callable[[bytes], bool] | None = None) -> PipeReader | _ThreadReads:
    """What reads the client's bytes: a reader that stays registered with the loop where it can poll."""
    return PipeReader(wire.fd_in, eager=eager) if wire.poll_in else _ThreadReads(wire.fd_in)


async def _read_messages(
    wire: Wire,
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    replies: MemoryObjectSendStream[SessionMessage | bytes],
    in_flight: InFlight,
    limits: StdioLimits,
    scope: anyio.CancelScope,
    early: bytes = b"",
    lane: Lane | None = None,
) -> None:
    """Newline-delimited JSON-RPC from stdin until EOF, then drain; refusals are answered here."""
    splitter = SkippingLineSplitter()
    with scope:
        async with sink, replies, anyio.create_task_group() as tg:
            inbound = _Inbound(sink, replies, in_flight, lane, tg)
            chunks = _chunks_of(
                wire, eager_line(splitter, MAX_MESSAGE_BYTES, inbound.start_now) if lane is not None else None
            )
            tg.start_soon(inbound.forward)
            try:
                while not in_flight.closed:
                    chunk, early = early or await chunks.receive(), b""
                    if not chunk:
                        break
                    for item in splitter.feed(chunk):
                        await inbound.route(item)
                if not in_flight.closed:
                    await inbound.drain(limits.drain_seconds)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # stdout is gone: the session is over
            finally:
                chunks.close()
                tg.cancel_scope.cancel()


class _Inbound:
    """Routes what the client sends: requests to the server within the in-flight bound, the rest at once.

    A request that finds the session full waits in a backlog of the same size,
    served in order by `forward`; only when that is full too does reading stop.
    Meanwhile notifications and responses (a client's answer to a sampling or
    elicitation request that a running tool call waits for) still go through, so
    a full session cannot deadlock on its own client's answers.

    With a `lane`, a request it accepts runs there (in `task_group`) instead of in the
    server, within the same bound, and a `notifications/cancelled` for it is the lane's.
    """

    def __init__(
        self,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        replies: MemoryObjectSendStream[SessionMessage | bytes],
        in_flight: InFlight,
        lane: Lane | None = None,
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> None:
        self.sink, self.replies, self.in_flight = sink, replies, in_flight
        self.lane, self.task_group = lane, task_group
        self.backlog, self._backlog_out = anyio.create_memory_object_stream[types.JSONRPCRequest](in_flight.limit)
        self._held: types.JSONRPCRequest | None = None  # taken from the backlog, waiting for room
        self._forwarding = anyio.CancelScope()
        # the read callback's reading of the line it left to `route` (the next one `route` gets): read once
        self._early: tuple[bytes, PlainRequest | None] | None = None

    async def route(self, item: bytes | Oversized) -> None:
        if isinstance(item, Oversized):
            parsed: SessionMessage | Refusal = refuse_oversized(item)
        elif not item.strip():
            return
        else:
            parsed = self._parse(item)
        if isinstance(parsed, Refusal):
            log.warning("refused a client message", reason=parsed.reason, answered=parsed.reply is not None)
            if parsed.reply is not None:
                await self.replies.send(parsed.reply)
            return
        message = parsed.message
        if not isinstance(message, types.JSONRPCRequest):
            if not (self.lane is not None and _cancels(message) and self.lane.cancel(message.params)):  # type: ignore[union-attr]
                await self.sink.send(parsed)
        elif self.in_flight.queued == 0 and self.in_flight.has_room():
            await self._submit(message)
        else:
            self.in_flight.enqueue()
            await self.backlog.send(message)

    def start_now(self, line: bytes) -> bool:
        """Start `line` on the lane at once if it is a plain request the lane takes and the session has
        room with nothing queued; False: nothing done, `route` reads it as usual."""
        lane, in_flight = self.lane, self.in_flight
        if lane is None or self.task_group is None or in_flight.queued or not in_flight.has_room() or in_flight.closed:
            return False
        request = plain_fields(line)  # no request model: the lane reads the fields (`model()` if it leaves it)
        if request is None or request.id in in_flight or not lane.takes(request):
            self._early = (line, request)
            return False
        in_flight.add(request.id, request.method)
        lane.start(request, self.task_group)
        return True

    def _parse(self, line: bytes) -> SessionMessage | Refusal:
        """`parse_client_line`, or what `start_now` already read of this very line."""
        early, self._early = self._early, None
        if early is None or early[0] != line:
            return parse_client_line(line)
        return parse_read_line(line, early[1])

    async def _submit(self, message: types.JSONRPCRequest) -> None:
        duplicate = message.id in self.in_flight  # the client reused the id of a request in flight
        self.in_flight.add(message.id, message.method)
        if self.lane is not None and self.task_group is not None and self.lane.accepts(message, duplicate=duplicate):
            self.lane.start(message, self.task_group)
            return
        metadata = _settle_metadata(self.in_flight, message.id, self.lane)
        await self.sink.send(SessionMessage(message, metadata=metadata))

    async def forward(self) -> None:
        """Hand backlogged requests to the server, in order, as room frees up."""
        with self._forwarding:
            async for message in self._backlog_out:
                self._held = message
                await self.in_flight.room()
                self._held = None
                self.in_flight.dequeue()
                await self._submit(message)

    async def drain(self, seconds: float) -> None:
        """At EOF: let queued and running requests finish for up to `seconds`; answer what never started."""
        self.backlog.close()
        with anyio.move_on_after(seconds):
            await self.in_flight.drained()
        if not self.in_flight.draining():
            return
        log.warning("stdin closed; cancelling requests still running", requests=self.in_flight.draining())
        self._forwarding.cancel()  # from here on nothing queued reaches the server: it is answered below
        left = [self._held] if self._held is not None else []
        with suppress(anyio.WouldBlock, anyio.EndOfStream):
            while True:
                left.append(self._backlog_out.receive_nowait())
        self._held = None
        for message in left:
            reason = "stdin closed before this request could start"
            await self.replies.send(error_line(message.id, SHUTTING_DOWN, reason))


def _settle_metadata(in_flight: InFlight, request_id: Any, lane: Lane | None) -> ServerMessageMetadata:
    """Frees the request's slot if the server settles it without an answer (the client cancelled it).

    The lane rides along as the request's context: the server binds it to the client's connection.
    """

    async def unanswered() -> None:
        in_flight.discard(request_id)

    return ServerMessageMetadata(on_request_unanswered=unanswered, request_context=lane)


def _cancels(message: Any) -> bool:
    return isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled"


async def _write_messages(
    outbox: Outbox,
    source: MemoryObjectReceiveStream[SessionMessage | bytes],
    in_flight: InFlight,
    done: anyio.Event,
    reader: anyio.CancelScope,
) -> None:
    def gone(exc: OSError) -> None:  # the client went away: end the session
        if not in_flight.closed:
            log.info("stdout closed; ending the session", error=str(exc))
        in_flight.close()
        reader.cancel()

    outbox.gone = gone
    try:
        async with source:
            async for item in source:
                try:
                    await outbox.write(item if isinstance(item, bytes) else encode(item))
                except anyio.BrokenResourceError:
                    return
                if isinstance(item, SessionMessage) and isinstance(
                    item.message, types.JSONRPCResponse | types.JSONRPCError
                ):
                    in_flight.discard(item.message.id)
    finally:
        done.set()


async def _write_all(wire: Wire, data: bytes) -> None:
    if not wire.poll_out:
        await anyio.to_thread.run_sync(_write_blocking, wire.fd_out, data)
        return
    view = memoryview(data)
    while view:
        try:
            written = os.write(wire.fd_out, view)
        except BlockingIOError:
            await anyio.wait_writable(wire.fd_out)
            continue
        view = view[written:]


def _write_blocking(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
