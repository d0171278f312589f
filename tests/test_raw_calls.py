"""RawCalls (upstream/raw_calls.py) on a real pipe: each waiter gets its own answer, whatever the upstream does.

The test plays a hostile upstream: it reads the request lines off the pipe and feeds the reader's
`claim` answers out of order, twice, for ids nobody asked, garbage, progress; deadlines are a time
per request under one timer per upstream (restarted by progress), and every way a request ends leaves nothing behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from aggregator.upstream.guard_client import PipeSend
from aggregator.upstream.raw_calls import DeadlinePassed, LineWriter, RawCalls

pytestmark = pytest.mark.anyio


class Upstream:
    """The far end of the pipe: the lines our side wrote, and answers fed back through `claim`."""

    def __init__(self, fd: int, calls: RawCalls) -> None:
        self.fd, self.calls = fd, calls
        self._pending = b""

    async def lines(self, count: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with anyio.fail_after(5):
            while len(out) < count:
                try:
                    self._pending += os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    await anyio.sleep(0.005)
                    continue
                *done, self._pending = self._pending.split(b"\n")
                out += [json.loads(line) for line in done]
        return out

    async def answer(self, request_id: Any, result: Any = None, **extra: Any) -> bool:
        message = {"jsonrpc": "2.0", "id": request_id, "result": result if result is not None else {"n": 1}, **extra}
        return await self.calls.claim(json.dumps(message).encode())

    async def progress(self, token: str, value: Any = 1) -> bool:
        params = {"progressToken": token, "progress": value}
        return await self.calls.claim(
            json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}).encode()
        )


@asynccontextmanager
async def upstream() -> AsyncIterator[tuple[RawCalls, Upstream, anyio.abc.TaskGroup]]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        async with anyio.create_task_group() as tg:
            calls = RawCalls(LineWriter(PipeSend(write)), tg.start_soon)
            yield calls, Upstream(read, calls), tg
            tg.cancel_scope.cancel()
    finally:
        os.close(read)
        os.close(write)


async def test_answers_out_of_order_each_reach_their_own_waiter() -> None:
    got: dict[int, Any] = {}
    async with upstream() as (calls, peer, tg):

        async def one(i: int) -> None:
            got[i] = await calls.request("tools/call", {"name": "echo", "arguments": {"i": i}}, budget=5)

        for i in range(5):
            tg.start_soon(one, i)
        requests = await peer.lines(5)
        for request in reversed(requests):
            assert await peer.answer(request["id"], {"i": request["params"]["arguments"]["i"]})
        await peer.answer(requests[0]["id"], {"i": "again"})  # a second answer: dropped
        await peer.answer("agg-999", {"i": "nobody"})  # an id never sent: dropped
        assert not await peer.answer(7, {"i": "sdk"})  # an integer id is the SDK session's
        assert not await calls.claim(b'not json "agg-1"')  # garbage naming our id: not a JSON-RPC answer
        with anyio.fail_after(5):
            while len(got) < 5:
                await anyio.sleep(0.005)
    assert got == {i: {"i": i} for i in range(5)}
    assert not calls._pending


async def test_the_deadline_passes_and_the_upstream_is_told() -> None:
    async with upstream() as (calls, peer, _):
        started = anyio.current_time()
        with pytest.raises(DeadlinePassed):
            await calls.request("tools/call", {"name": "slow"}, budget=0.1)
        assert 0.09 <= anyio.current_time() - started < 2
        request, cancel = await peer.lines(2)
        assert request["params"]["_meta"]["progressToken"] == request["id"]  # progress can restart it
        assert cancel == {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request["id"], "reason": "caller cancelled"},
        }
        assert not calls._pending
        # the late answer is not claimed: the SDK session, which never sent that id, drops it
        assert not await peer.answer(request["id"])


async def test_progress_restarts_the_deadline_and_reaches_the_caller() -> None:
    reports: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append(value)

    async with upstream() as (calls, peer, tg):
        result: list[Any] = []

        async def call() -> None:
            result.append(await calls.request("tools/call", {"name": "slow"}, progress, budget=0.3))

        tg.start_soon(call)
        (request,) = await peer.lines(1)
        for step in range(1, 5):  # 0.6 s in all, twice the budget, never 0.3 s without progress
            await anyio.sleep(0.15)
            assert await peer.progress(request["id"], step)
        assert await peer.progress(request["id"], "not a number")  # ours, but neither relayed nor a restart
        assert await peer.answer(request["id"], {"done": True})
        with anyio.fail_after(5):
            while not result:
                await anyio.sleep(0.005)
    assert result == [{"done": True}]
    assert reports == [1, 2, 3, 4]


async def test_a_cancelled_caller_tells_the_upstream_and_drops_the_late_answer() -> None:
    async with upstream() as (calls, peer, _):
        with anyio.move_on_after(0.05):
            await calls.request("tools/call", {"name": "slow"}, budget=5)
        request, cancel = await peer.lines(2)
        assert cancel["params"]["requestId"] == request["id"]
        assert not calls._pending
        assert not await peer.answer(request["id"])


async def test_the_end_of_the_connection_fails_every_waiter() -> None:
    outcomes: list[Any] = []
    async with upstream() as (calls, peer, tg):

        async def one() -> None:
            try:
                await calls.request("tools/call", {"name": "slow"}, budget=5)
            except MCPError as exc:
                outcomes.append(exc.error.code)

        for _ in range(3):
            tg.start_soon(one)
        await peer.lines(3)
        calls.close()
        with anyio.fail_after(5):
            while len(outcomes) < 3:
                await anyio.sleep(0.005)
        with pytest.raises(MCPError):  # and any request after it, at once
            await calls.request("tools/call", {"name": "x"}, budget=5)
    assert outcomes == [CONNECTION_CLOSED] * 3
    assert not calls._pending


EVENTS = st.lists(
    st.tuples(st.sampled_from(["answer", "progress", "garbage", "unknown"]), st.integers(0, 3)), max_size=25
)


@settings(max_examples=40, deadline=None)
@given(events=EVENTS)
def test_whatever_the_upstream_sends_each_waiter_ends_with_its_own_first_answer(events: list[tuple[str, int]]) -> None:
    """Four requests; the upstream answers, reports progress, repeats itself, cuts lines short and
    answers ids nobody sent, in any order; then the connection ends. Each request ends with its own
    first answer (a cut-short one is an error, as the SDK reads it); those never answered fail as the
    connection's end fails them; nothing is left pending."""

    async def main() -> None:
        outcome: dict[int, Any] = {}
        async with upstream() as (calls, peer, tg):

            async def one(i: int) -> None:
                try:
                    outcome[i] = await calls.request("tools/call", {"name": "t", "arguments": {"i": i}}, budget=30)
                except MCPError as exc:
                    outcome[i] = "closed" if exc.error.code == CONNECTION_CLOSED else "unreadable"

            for i in range(4):
                tg.start_soon(one, i)
            ids = {r["params"]["arguments"]["i"]: r["id"] for r in await peer.lines(4)}
            first: dict[int, Any] = {}  # what settles each request: its first answer, readable or not
            for n, (kind, i) in enumerate(events):
                if kind == "answer":
                    first.setdefault(i, {"i": i, "n": n})
                    await peer.answer(ids[i], {"i": i, "n": n})
                elif kind == "progress":
                    await peer.progress(ids[i])
                elif kind == "garbage":  # a line cut short: an unreadable answer, as the SDK reads it
                    first.setdefault(i, "unreadable")
                    await calls.claim(f'{{"jsonrpc": "2.0", "id": "{ids[i]}", "result": '.encode())
                else:
                    await peer.answer(f"agg-{100 + i}")
            calls.close()
            with anyio.fail_after(5):
                while len(outcome) < 4:
                    await anyio.sleep(0.01)
        for i in range(4):
            assert outcome[i] == first.get(i, "closed")
        assert not calls._pending

    anyio.run(main, backend="asyncio")


async def test_an_answer_is_settled_at_once_only_when_nothing_is_before_it() -> None:
    """`settle_now` (the read callback's way): a plain answer settles at once; after a line the SDK
    session may not have dispatched yet, it is refused untouched and goes the ordered way."""
    to_session, from_reader = anyio.create_memory_object_stream[Any](4)
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        async with to_session, from_reader, anyio.create_task_group() as tg:
            calls = RawCalls(LineWriter(PipeSend(write)), tg.start_soon, to_session)
            got: list[Any] = []

            async def one() -> None:
                got.append(await calls.request("tools/call", {"name": "t"}, budget=5))

            for _ in range(2):
                tg.start_soon(one)
            first, second = await Upstream(read, calls).lines(2)
            answer = {"jsonrpc": "2.0", "id": first["id"], "result": {"n": 1}}
            assert not calls.settle_now(json.dumps({**answer, "id": 5}).encode())  # the SDK's id
            assert not calls.settle_now(b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {}}')
            assert calls.settle_now(json.dumps(answer).encode())
            calls.forwarded()  # a log line went to the session, not yet dispatched
            late = json.dumps({**answer, "id": second["id"]}).encode()
            assert not calls.settle_now(late)
            assert second["id"] in calls._pending and not calls._pending[second["id"]].future.done()
            assert await calls.claim(late)  # the ordered way: behind the log line, through the session
            marker = await from_reader.receive()
            marker.apply()
            with anyio.fail_after(5):
                while len(got) < 2:
                    await anyio.sleep(0.005)
            assert got == [{"n": 1}, {"n": 1}]
    finally:
        os.close(read)
        os.close(write)


async def test_lines_bigger_than_the_pipe_are_never_interleaved() -> None:
    """Two writers, each a line larger than a pipe holds: the first goes partly at once and the rest
    under the lock; the second waits for it. The reader gets each line whole."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    stream = PipeSend(write)
    writer = LineWriter(stream, fd=lambda: stream._fd)
    lines = [bytes([65 + i]) * 300_000 + b"\n" for i in range(2)]
    got = bytearray()
    try:
        async with anyio.create_task_group() as tg:
            for line in lines:
                tg.start_soon(writer.send, line)
            with anyio.fail_after(10):
                while len(got) < sum(map(len, lines)):
                    try:
                        got += os.read(read, 1 << 16)
                    except BlockingIOError:
                        await anyio.sleep(0.001)
        assert sorted(bytes(got).splitlines(keepends=True)) == lines
    finally:
        os.close(read)
        await stream.aclose()


async def test_the_deadline_holds_when_the_upstream_never_reads_its_stdin() -> None:
    """A full pipe nobody reads: the request cannot even be written; its deadline still ends it
    (as a timeout, not a lost connection), and the connection is not marked broken."""
    broken: list[bool] = []
    read, write = os.pipe()
    os.set_blocking(read, False)
    stream = PipeSend(write)
    try:
        async with anyio.create_task_group() as tg:
            calls = RawCalls(LineWriter(stream, lambda: broken.append(True), lambda: stream._fd), tg.start_soon)
            big = {"name": "t", "arguments": {"blob": "x" * 200_000}}  # more than a pipe holds
            started = anyio.current_time()
            with anyio.fail_after(10), pytest.raises(DeadlinePassed):  # fail_after: a regression hangs here
                await calls.request("tools/call", big, budget=0.2)
            assert anyio.current_time() - started < 3
            assert not broken and not calls._pending and not calls.closed
    finally:
        os.close(read)
        await stream.aclose()


@settings(max_examples=8, deadline=None)
@given(
    plans=st.lists(
        st.tuples(st.sampled_from([0.05, 0.1, 0.2, 0.3]), st.sampled_from(["answer", "silent", "progress"])),
        min_size=1,
        max_size=6,
    )
)
def test_one_timer_keeps_every_requests_own_deadline(plans: list[tuple[float, str]]) -> None:
    """Requests of mixed budgets at once under the upstream's one deadline timer: a silent one fails
    at its own budget (not at an earlier request's, not a later one's), one kept alive by progress
    outlives its budget, an answered one is never failed, and nothing is left armed or pending."""

    async def main() -> None:
        outcome: dict[int, tuple[str, float]] = {}
        async with upstream() as (calls, peer, tg):
            started = anyio.current_time()

            async def one(i: int, budget: float) -> None:
                try:
                    await calls.request("tools/call", {"name": "t", "arguments": {"i": i}}, budget=budget)
                    outcome[i] = ("answered", anyio.current_time() - started)
                except DeadlinePassed:
                    outcome[i] = ("timeout", anyio.current_time() - started)

            for i, (budget, kind) in enumerate(plans):  # only the silent ones' budgets are short
                tg.start_soon(one, i, {"silent": budget, "answer": 2.0, "progress": 0.2}[kind])
            requests = {r["params"]["arguments"]["i"]: r["id"] for r in await peer.lines(len(plans))}
            for i, (_, kind) in enumerate(plans):
                if kind == "answer":
                    assert await peer.answer(requests[i])
            for _ in range(10):  # 0.5 s of progress every 0.05 s: longer than its budget of 0.2
                await anyio.sleep(0.05)
                for i, (_, kind) in enumerate(plans):
                    if kind == "progress":
                        await peer.progress(requests[i], 1)
            for i, (_, kind) in enumerate(plans):
                if kind == "progress":
                    await peer.answer(requests[i])
            with anyio.fail_after(5):
                while len(outcome) < len(plans):
                    await anyio.sleep(0.01)
            assert not calls._pending
        for i, (budget, kind) in enumerate(plans):
            ended, after = outcome[i]
            if kind == "silent":
                assert ended == "timeout" and budget - 0.01 <= after < budget + 1.0, (plans, outcome)
            else:
                assert ended == "answered", (plans, outcome)
                assert kind == "answer" or after >= 0.45, (plans, outcome)  # progress kept it past 0.2
        calls.close()
        assert calls._timer is None  # closing disarms the timer: nothing left on the loop

    anyio.run(main, backend="asyncio")
