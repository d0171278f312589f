"""PipeReader (aggregator/pipe_reader.py): a pipe read by a callback that stays registered with the loop.

Real pipes and a real writer process: bytes arrive whole and in order whatever the chunking, the end
is the end, a consumer slower than the writer holds the writer back (bounded memory) and loses
nothing, and closing the reader lets the descriptor's owner close it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.pipe_reader import MAX_BUFFERED, PipeReader, whole_line
from aggregator.upstream import transports
from aggregator.upstream.guard_client import open_guarded_process

pytestmark = pytest.mark.anyio


async def _all(reader: PipeReader | transports._StreamChunks) -> bytes:
    out = []
    while chunk := await reader.receive():
        out.append(chunk)
    return b"".join(out)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.binary(min_size=1, max_size=300), max_size=12))
def test_every_byte_in_order_then_the_end(pieces: list[bytes]) -> None:
    async def main() -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        reader = PipeReader(read, chunk=64)
        try:
            for piece in pieces:
                os.write(write, piece)
                await anyio.sleep(0)
            os.close(write)
            assert await _all(reader) == b"".join(pieces)
            assert await reader.receive() == b""  # the end stays the end
        finally:
            reader.close()
            os.close(read)

    anyio.run(main, backend="asyncio")


async def test_a_slow_consumer_holds_the_writer_back_and_loses_nothing() -> None:
    """A writer far faster than the consumer: the reader stops reading at MAX_BUFFERED chunks, the
    pipe fills, the writer blocks; every byte still arrives."""
    total = 4 << 20
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdout.buffer.write(bytes(range(256)) * ({total} // 256))"],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    reader = PipeReader(fd, chunk=4096)
    try:
        got = bytearray()
        await anyio.sleep(0.2)  # the writer runs ahead
        assert len(reader._chunks) <= MAX_BUFFERED
        assert child.poll() is None  # held back by its full pipe
        while chunk := await reader.receive():
            got += chunk
            assert len(reader._chunks) <= MAX_BUFFERED
        assert got == bytes(range(256)) * (total // 256)
    finally:
        reader.close()
        child.stdout.close()
        child.wait(10)


@contextmanager
def reading() -> Iterator[tuple[PipeReader, int]]:
    """A pipe read by a PipeReader: (the reader, the write end); everything closed after."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    reader = PipeReader(read)
    try:
        yield reader, write
    finally:
        reader.close()
        for fd in (read, write):
            with suppress(OSError):
                os.close(fd)


async def test_cancelled_while_waiting_then_read_again() -> None:
    with reading() as (reader, write):
        with anyio.move_on_after(0.05):
            await reader.receive()
        os.write(write, b"late\n")
        with anyio.fail_after(5):
            assert await reader.receive() == b"late\n"


async def test_close_wakes_a_waiting_consumer_and_lets_the_owner_close_the_descriptor() -> None:
    got: list[bytes] = []
    with reading() as (reader, _):

        async def consume() -> None:
            got.append(await reader.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.02)
            reader.close()
    assert got == [b""]
    # the descriptor number is reused by the next pipe: a stale registration would fire on it
    with reading() as (second, write):
        os.write(write, b"fresh")
        with anyio.fail_after(5):
            assert await second.receive() == b"fresh"


async def test_a_read_error_ends_the_stream() -> None:
    """A descriptor that fails to read (here a write end, EBADF for reading) is the end, not a crash."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    reader = PipeReader(write)
    try:
        loop = asyncio.get_running_loop()
        loop.call_soon(reader._readable)  # as the loop calls it when the descriptor is ready
        with anyio.fail_after(5):
            assert await reader.receive() == b""
    finally:
        reader.close()
        os.close(read)
        os.close(write)


async def test_the_upstream_stdout_of_the_guard_is_read_by_a_pipe_reader() -> None:
    """The upstream transport's fast reader relies on the guard's pipe ends giving their descriptor (`fileno()`):
    were that lost, the transport would silently fall back to anyio's per-read registration."""
    process = await open_guarded_process(
        [sys.executable, "-c", "print('hi')"], env=dict(os.environ), cwd=None, stderr=2
    )
    try:
        chunks = transports._chunks_of(process.stdout)
        assert isinstance(chunks, PipeReader)
        try:
            with anyio.fail_after(10):
                assert await _all(chunks) == b"hi\n"
        finally:
            chunks.close()
    finally:
        await process.aclose()


async def test_guard_pipe_ends_give_their_descriptor_only_while_open() -> None:
    """`fileno()` of the guard's pipe ends: the open descriptor, then None once closed (the raw
    path's writer and reader fall back to the stream then, never to a stale or reused number)."""
    process = await open_guarded_process([sys.executable, "-c", "pass"], env=dict(os.environ), cwd=None, stderr=2)
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None
    try:
        for end in (stdin, stdout):
            fd = transports._guard_fd(end)
            assert isinstance(fd, int) and fd == end.fileno()  # type: ignore[attr-defined]
            os.fstat(fd)  # a live descriptor
    finally:
        await process.aclose()
    assert transports._guard_fd(stdin) is None and transports._guard_fd(stdout) is None
    assert transports._guard_fd(object()) is None  # not a guard pipe end: no descriptor


async def test_eager_takes_a_chunk_only_while_the_consumer_waits_and_a_failure_loses_nothing() -> None:
    taken: list[bytes] = []

    def eager(data: bytes) -> bool:
        if data == b"boom":
            raise RuntimeError("a bug in the eager reader")
        if data.startswith(b"take"):
            taken.append(data)
            return True
        return False

    read, write = os.pipe()
    os.set_blocking(read, False)
    reader = PipeReader(read, eager=eager)
    try:
        os.write(write, b"take-before")  # read while nobody waits: kept for the consumer
        await anyio.sleep(0.02)
        with anyio.fail_after(5):
            assert await reader.receive() == b"take-before"
        got: list[bytes] = []

        async def consume() -> None:
            got.append(await reader.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.02)
            os.write(write, b"take-1")  # the consumer waits with nothing buffered: taken in the callback
            await anyio.sleep(0.05)
            assert taken == [b"take-1"] and got == []
            os.write(write, b"boom")  # the eager reader fails: the consumer still gets the chunk
        assert got == [b"boom"]
    finally:
        reader.close()
        os.close(read)
        os.close(write)


def test_whole_line_is_exactly_one_line_within_the_limit() -> None:
    assert whole_line(b'{"id": 1}\n', 100) == b'{"id": 1}'
    assert whole_line(b"\n", 100) == b""
    for chunk in (b"", b"no newline", b"a\nb\n", b"a\nb", b"x" * 100 + b"\n"):
        assert whole_line(chunk, 100) is None, chunk
