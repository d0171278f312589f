"""Transports to one upstream: stdio (our own), streamable HTTP and SSE (the SDK's, in
`http_transports.py`, imported for the first remote upstream: httpx2 stays out of a stdio-only `serve`).

stdio is ours rather than the SDK's `stdio_client` because a proxy needs three
things the SDK does not give: the child's pid (to end its whole process group,
grandchildren of `npx`/`uvx`/`sh -c` included, DESIGN §3), its stderr captured
(the tail is shown in diagnostics, never mixed into our stdout), and a signal
when the child's stdout ends (the SDK tells nobody when an upstream dies).
"""

from __future__ import annotations

import collections
import errno
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from aggregator.config import UpstreamConfig
from aggregator.log import get_logger, redact_text
from aggregator.pipe_reader import PipeReader, eager_line
from aggregator.upstream.guard_client import PipeReceive, PipeSend, open_guarded_process
from aggregator.upstream.raw_calls import LineWriter, RawCalls
from aggregator.upstream.server_messages import parse_upstream_line
from aggregator.wire import LineSplitter, MessageTooLarge, encode, error_answer

if TYPE_CHECKING:
    import httpx2

log = get_logger(__name__)

STDERR_TAIL_LINES = 40
EXIT_POLL_SECONDS = 0.25
EXIT_GRACE_SECONDS = 1.0  # after stdin closes, before SIGTERM to the group
TERM_GRACE_SECONDS = 1.0  # after SIGTERM, before SIGKILL
# How the SDK (SSE events) and we (HTTP bodies) word a message over max_message_bytes.
TOO_LARGE = re.compile(r"exceeded the \d+ byte limit")


class StderrTail:
    """Keeps the last lines an upstream wrote to stderr, read by a daemon thread."""

    def __init__(self, upstream: str, max_lines: int = STDERR_TAIL_LINES) -> None:
        self.upstream = upstream
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._drained = threading.Event()  # the stderr pipe reached EOF
        self._drained.set()  # nothing to wait for until `feed`

    def feed(self, fd: int) -> None:
        """Start a daemon thread draining `fd` (it owns and closes it)."""
        self._drained.clear()
        thread = threading.Thread(target=self._drain, args=(fd,), name=f"stderr-{self.upstream}", daemon=True)
        thread.start()

    def wait_drained(self, timeout: float) -> None:
        """Give the reader thread up to `timeout` s to reach EOF, so a dead upstream's last words are in the tail.

        The thread can lag behind the exit that the event loop already saw; a grandchild
        holding the pipe open makes this wait the whole (short) timeout.
        """
        self._drained.wait(timeout)

    def _drain(self, fd: int) -> None:
        try:
            self._drain_pipe(fd)
        finally:
            self._drained.set()

    def _drain_pipe(self, fd: int) -> None:
        with open(fd, "rb", buffering=0, closefd=True) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._add(line)
                if len(pending) > 65536:  # a very long line without newline
                    self._add(pending)
                    pending = b""
            if pending:
                self._add(pending)

    def _add(self, raw: bytes) -> None:
        line = redact_text(raw.decode("utf-8", "replace").rstrip("\r"))  # kept masked: tails reach clients
        with self._lock:
            self._lines.append(line)
        log.debug("upstream stderr", upstream=self.upstream, line=line[:500])

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def text(self, max_lines: int = 10) -> str:
        return "\n".join(self.lines()[-max_lines:])


@dataclass
class TransportHandle:
    """What an open transport gives the connection besides its message streams."""

    read: MemoryObjectReceiveStream[SessionMessage | Exception]
    write: MemoryObjectSendStream[SessionMessage]
    closed: anyio.Event = field(default_factory=anyio.Event)  # set when the peer is gone
    pid: int | None = None
    overflow: bool = False  # the peer sent a message over `limit`
    limit: int = 0  # max_message_bytes of this upstream
    raw: RawCalls | None = None  # stdio: requests that bypass the SDK session (`raw_calls.py`)


@asynccontextmanager
async def open_transport(
    config: UpstreamConfig, stderr: StderrTail, auth: httpx2.Auth | None = None
) -> AsyncIterator[TransportHandle]:
    """Open the configured transport; closing it ends the upstream (and its process group).

    `auth` (HTTP and SSE): the upstream's OAuth provider (`upstream/oauth_providers.py`), or None.
    """
    if config.transport == "stdio":
        async with _stdio(config, stderr) as handle:
            yield handle
        return
    from aggregator.upstream.http_transports import open_remote  # httpx2 only with a remote upstream

    async with open_remote(config, auth) as handle:
        yield handle


# ---------------------------------------------------------------- stdio


@asynccontextmanager
async def _stdio(config: UpstreamConfig, stderr: StderrTail) -> AsyncIterator[TransportHandle]:
    assert config.command is not None
    env = get_default_environment() | dict(config.env)
    argv = [_resolve_command(config.command, env, config.cwd), *config.args]
    err_read, err_write = os.pipe()
    try:  # under the shared guard (guard.py): no process of the upstream outlives us
        process = await open_guarded_process(argv, env=env, cwd=config.cwd, stderr=err_write)
    except BaseException:
        os.close(err_read)
        os.close(err_write)
        raise
    os.close(err_write)
    stderr.feed(err_read)
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](64)
    assert process.stdin is not None
    handle = TransportHandle(read, write, pid=process.pid, limit=config.max_message_bytes)
    pipe = process.stdin if isinstance(process.stdin, PipeSend) else None  # asked once: an ABC's check is slow
    stdin = LineWriter(process.stdin, lambda: _closed(handle), pipe.fileno if pipe is not None else lambda: None)
    try:
        async with anyio.create_task_group() as tg:
            handle.raw = RawCalls(stdin, tg.start_soon, to_session)
            tg.start_soon(_read_stdout, process, to_session, handle)
            tg.start_soon(_write_stdin, stdin, from_session, to_session)
            tg.start_soon(_watch_exit, process, to_session, handle)
            try:
                yield handle
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop_process(process)
            _closed(handle)
            for stream in (to_session, read, write, from_session):
                await stream.aclose()


def _resolve_command(command: str, env: Mapping[str, str], cwd: str | None) -> str:
    """The executable as the child would find it; raises what spawning it directly would raise.

    Under the guard a missing command would only show as exit code 127, so it is
    looked up here first (PATH of the child's environment, paths relative to cwd).
    """
    if cwd is not None and not os.path.isdir(cwd):
        raise NotADirectoryError(errno.ENOTDIR, "working directory not found", cwd)
    if os.sep in command:
        path = os.path.join(cwd or ".", command)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "command not found", command)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, "command not executable", command)
        return command
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "command not found", command)
    return command


async def _read_stdout(
    process: anyio.abc.Process,
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
    handle: TransportHandle,
) -> None:
    assert process.stdout is not None
    splitter = LineSplitter(handle.limit)
    raw = handle.raw
    chunks = _chunks_of(process.stdout, eager_line(splitter, handle.limit, raw.settle_now) if raw is not None else None)
    try:
        while chunk := await chunks.receive():
            for line in splitter.feed(chunk):
                if line.strip() and not (raw is not None and await raw.claim(line)):
                    await to_session.send(parse_upstream_line(line))
                    if raw is not None:
                        raw.forwarded()
    except MessageTooLarge as exc:
        handle.overflow = True
        log.warning("upstream message too large; dropping the connection", error=str(exc))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass
    finally:
        chunks.close()
        _closed(handle)
        await to_session.aclose()  # the session sees the end and fails pending requests


class _StreamChunks:
    """An anyio byte stream read as `PipeReader` is: b"" at its end."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self._stream = stream

    async def receive(self) -> bytes:
        try:
            return await self._stream.receive()
        except anyio.EndOfStream:
            return b""

    def close(self) -> None:
        pass


def _chunks_of(
    stdout: anyio.abc.ByteReceiveStream, eager: Callable[[bytes], bool] | None = None
) -> PipeReader | _StreamChunks:
    """The upstream's stdout read by a reader that stays registered with the event loop (the guard's
    pipe); any other stream (off Linux) as anyio reads it."""
    fd = _guard_fd(stdout)
    return PipeReader(fd, eager=eager) if fd is not None else _StreamChunks(stdout)


def _guard_fd(stream: object) -> int | None:
    """The descriptor of one of the guard's pipe ends while it is open, else None (any other stream)."""
    return stream.fileno() if isinstance(stream, PipeReceive | PipeSend) else None


def _closed(handle: TransportHandle) -> None:
    """The peer is gone: the connection notices, and raw requests fail as the session's do."""
    handle.closed.set()
    if handle.raw is not None:
        handle.raw.close()


async def _watch_exit(
    process: anyio.abc.Process, to_session: MemoryObjectSendStream[SessionMessage | Exception], handle: TransportHandle
) -> None:
    """End the connection when the child exits, even if a grandchild keeps its stdout open.

    Polls `returncode` (on asyncio, `wait()` also waits for pipe EOF, which such a
    grandchild never gives), then lets the reader drain what is already buffered.
    """
    closed = handle.closed
    while process.returncode is None and not closed.is_set():
        await anyio.sleep(EXIT_POLL_SECONDS)
    if closed.is_set():
        return
    with anyio.move_on_after(0.5):
        await closed.wait()
    _closed(handle)
    await to_session.aclose()


async def _write_stdin(
    stdin: LineWriter,
    from_session: MemoryObjectReceiveStream[SessionMessage],
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    """The session's messages to the upstream's stdin (raw requests write their own lines to `stdin`)."""
    try:
        async for message in from_session:
            line = encode(message)
            if line:
                await stdin.send(line)
            elif isinstance(message.message, types.JSONRPCRequest):  # never sent: its caller is answered now
                answer = error_answer(message.message.id, "the request could not be serialised as JSON")
                await to_session.send(SessionMessage(answer))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass  # `stdin` has marked the connection closed


async def _stop_process(process: anyio.abc.Process) -> None:
    """stdin EOF, then SIGTERM, then SIGKILL, always to the whole process group.

    The group is signalled even when the leader exits on its own: a launcher's
    grandchildren stay in the group and would otherwise be orphaned.
    """
    pgid = process.pid  # start_new_session: the leader's pid is the group id
    if process.stdin is not None:
        with suppress(Exception):
            await process.stdin.aclose()
    if not await _exited_within(process, EXIT_GRACE_SECONDS):
        _signal_group(pgid, signal.SIGTERM)
        if not await _exited_within(process, TERM_GRACE_SECONDS):
            _signal_group(pgid, signal.SIGKILL)
    # Whatever else is left in the group (grandchildren) goes too.
    _signal_group(pgid, signal.SIGTERM)
    _signal_group(pgid, signal.SIGKILL)
    with anyio.move_on_after(2):
        await process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with suppress(Exception):
                await stream.aclose()


async def _exited_within(process: anyio.abc.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.02)
    return process.returncode is not None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    if sys.platform == "win32":  # pragma: no cover
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_group_now(pid: int) -> None:
    """Last-resort synchronous kill, used when the event loop is going away."""
    _signal_group(pid, signal.SIGKILL)
