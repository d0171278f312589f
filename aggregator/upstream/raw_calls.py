"""The raw leg to a stdio upstream: a request written as bytes, its answer claimed by id.

The SDK's client session costs about a third of a proxied call (a pydantic model and a
dispatcher round per message, anyio bookkeeping). A request sent here is one JSON line with
an id of ours, ``"agg-N"`` (a string: the SDK's own ids are integers, so the two never
collide). The upstream's reader offers every line to `claim` before the SDK session sees it:
an answer to one of our ids resolves its waiter's future, a progress notification with our
token restarts its deadline (a time per request, one timer per upstream, no cancel scope) and reaches the
caller's progress function. The rest goes to the
SDK session as before: the handshake, listings, the upstream's own requests and notifications.

What the SDK does for its requests is done here too: an answer that the fast parser refuses
(too deep, invalid Unicode, not JSON-RPC) is read as `parse_upstream_line` reads it for the
SDK, so the caller gets the same error; a caller cancelled (the client cancelled, or its
deadline passed) sends `notifications/cancelled` with our id; the end of the connection fails
every waiter with the SDK's own `Connection closed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import CONNECTION_CLOSED

from aggregator.log import get_logger
from aggregator.pipe_reader import write_some
from aggregator.sdk import ProgressFn
from aggregator.upstream.server_messages import MAX_RESULT_NESTING, parse_upstream_line
from aggregator.wire import json_line

log = get_logger(__name__)

ID_PREFIX = "agg-"
_MARK = b'"agg-'  # every line that concerns a raw request names one of our ids
CANCEL_WRITE_SECONDS = 2.0  # as the SDK's courtesy cancel: never wait long on a stuck pipe
DEADLINE_SLACK = 0.001  # a deadline this close counts as passed (a timer may fire that early)


class DeadlinePassed(Exception):
    """A raw request got neither its answer nor progress within its budget (the upstream was told)."""


class _Pending:
    """One raw request in flight: a future its waiter awaits, and its deadline as a time on the loop's clock.

    No cancel scope, no event, no timer of its own: settling resolves the future; progress moves the
    deadline; the upstream's one deadline timer (`RawCalls._expire_due`) settles it once it passes.
    """

    __slots__ = ("_budget", "_loop", "deadline", "future", "outcome", "progress")

    def __init__(self, loop: asyncio.AbstractEventLoop, progress: ProgressFn | None, budget: float | None) -> None:
        self._loop = loop
        self.progress = progress
        self.future: asyncio.Future[None] = loop.create_future()
        self.outcome: dict[str, Any] | MCPError | DeadlinePassed | None = None
        self._budget = budget
        self.deadline = loop.time() + budget if budget is not None else None

    def settle(self, outcome: dict[str, Any] | MCPError | DeadlinePassed) -> None:
        if not self.future.done():
            self.outcome = outcome
            self.future.set_result(None)
        self.deadline = None

    def restart(self) -> None:
        """Progress: the budget starts again from now (later than before: the armed timer finds it not due)."""
        if self.deadline is not None and self._budget is not None:
            self.deadline = self._loop.time() + self._budget


_Settled = tuple[_Pending, "dict[str, Any] | MCPError"]


class SettleInOrder(Exception):  # not an error: a marker on the session's stream
    """A raw answer's settling, sent down the SDK session's read stream behind the lines before it.

    The session hands stream exceptions to its message handler (`UpstreamConnection`), in order;
    the handler calls `apply`.
    """

    def __init__(self, apply: Callable[[], None]) -> None:
        super().__init__("a raw answer settled in order")
        self.apply = apply


class LineWriter:
    """The upstream's stdin, shared by the session's writer task and raw requests: a line at a time.

    A raw request writes its line itself (no hop through the writer task); the lock keeps a line
    that a full pipe cut in two from being interleaved with another. `on_broken` is told when the
    pipe is gone.
    """

    def __init__(
        self,
        stream: anyio.abc.ByteSendStream,
        on_broken: Callable[[], None] = lambda: None,
        fd: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._stream = stream
        self._lock = asyncio.Lock()  # not anyio's: its uncontended acquire still looks up the backend
        self._on_broken = on_broken
        self._fd = fd  # the stream's descriptor while it is open (None: unknown or closed)

    async def send(self, line: bytes, timeout: float | None = None) -> None:
        """Write `line`; a closed or broken pipe raises `anyio.BrokenResourceError` (after `on_broken`).

        With no other line being written, as much as the pipe takes goes at once (`write_some`);
        the rest, if any, through the stream under the lock, within `timeout` seconds (TimeoutError:
        a full pipe that its upstream does not read, or another writer stuck on it).
        """
        try:
            if not self._lock.locked() and (fd := self._fd()) is not None:
                written = write_some(fd, line)
                if written == len(line):
                    return
                line = line[written:]
            with anyio.fail_after(timeout):
                async with self._lock:
                    await self._stream.send(line)
        except TimeoutError:  # an OSError too, but the pipe is not broken
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            self._on_broken()
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        with suppress(Exception):
            await self._stream.aclose()


class RawCalls:
    """Requests to one stdio upstream that bypass the SDK session; `claim` is fed by its reader.

    `send`: the upstream's stdin; `spawn`: starts a task (progress is delivered in one);
    `session`: the SDK session's read stream, for settling in order (`_settle_in_order`).
    """

    def __init__(
        self,
        send: LineWriter,
        spawn: Callable[..., Any],
        session: MemoryObjectSendStream[SessionMessage | Exception] | None = None,
    ) -> None:
        self._send = send
        self._spawn = spawn  # starts a task beside the reader (the transport's task group)
        self._session = session
        self._forwarded = 0  # lines the reader handed to the SDK session ...
        self._caught_up = 0  # ... of which the session has surely dispatched this many
        self._pending: dict[str, _Pending] = {}
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None  # one for every request: at the earliest deadline
        self._timer_at = 0.0
        self._next = 0
        self.closed = False
        self.sent = 0  # requests written so far (tests and `doctor`-style checks read it)

    async def request(
        self,
        method: str,
        params: dict[str, Any] | None,
        progress: ProgressFn | None = None,
        budget: float | None = None,
    ) -> Any:
        """Send `method` and return the upstream's raw result; its JSON-RPC error raised as `MCPError`.

        `budget`: seconds to wait for the answer, restarted by each progress report; past it the
        upstream is told (`notifications/cancelled`) and `DeadlinePassed` is raised.
        """
        if self.closed:
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        self._next += 1
        request_id = f"{ID_PREFIX}{self._next}"
        line = _request_line(request_id, method, params, progress is not None or budget is not None)
        pending = self._pending[request_id] = _Pending(self._loop, progress, budget)
        if pending.deadline is not None and (self._timer is None or pending.deadline < self._timer_at):
            self._arm(pending.deadline)
        written = False
        try:
            try:
                await self._send.send(line, budget)
            except anyio.BrokenResourceError:
                raise MCPError(CONNECTION_CLOSED, "Connection closed") from None
            except TimeoutError:  # the deadline passed before the request was even written
                raise DeadlinePassed from None
            written = True
            self.sent += 1
            await pending.future
        except asyncio.CancelledError:
            if written and not self.closed:
                await self._cancel(request_id)
            raise
        finally:
            del self._pending[request_id]
        if isinstance(pending.outcome, DeadlinePassed):
            if not self.closed:
                await self._cancel(request_id)
            raise pending.outcome
        if isinstance(pending.outcome, MCPError):
            raise pending.outcome
        return pending.outcome

    def _arm(self, when: float) -> None:
        """The deadline timer, (re)set to fire at `when` (the earliest deadline it must see)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._expire_due), when

    def _expire_due(self) -> None:
        """Every request past its deadline fails with `DeadlinePassed`; the timer is set for the next one.

        A request whose deadline progress moved on is not due yet. A timer that fires a hair early
        (loop clocks of millisecond grain) counts a deadline within `DEADLINE_SLACK` as passed.
        """
        self._timer = None
        due = self._loop.time() + DEADLINE_SLACK
        later: float | None = None
        for pending in list(self._pending.values()):
            deadline = pending.deadline
            if deadline is None:
                continue
            if deadline <= due:
                pending.settle(DeadlinePassed())
            elif later is None or deadline < later:
                later = deadline
        if later is not None and not self.closed:
            self._arm(later)

    async def _cancel(self, request_id: str) -> None:
        """The courtesy `notifications/cancelled` the SDK sends for a request its caller abandoned."""
        params = {"requestId": request_id, "reason": "caller cancelled"}
        line = json_line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(CANCEL_WRITE_SECONDS),
            suppress(anyio.ClosedResourceError, anyio.BrokenResourceError),
        ):
            await self._send.send(line)

    async def claim(self, line: bytes) -> bool:
        """Take `line` if it answers (or reports progress on) one of our requests; False: not ours."""
        if not self._pending or _MARK not in line:
            return False
        data = _fast_parse(line)
        if data is None:  # what the SDK's reader would make of it, for the same outcome
            claimed, settled = self._claim_parsed(parse_upstream_line(line))
        elif "method" not in data:
            claimed, settled = self._claim_answer(data, line)
        elif data["method"] == "notifications/progress":
            return self._claim_progress(data.get("params"))
        else:
            return False
        if settled is not None:
            await self._settle_in_order(*settled)
        return claimed

    def settle_now(self, line: bytes) -> bool:
        """`claim` for an answer, at once: from the reader's callback (`pipe_reader.PipeReader`), without
        waking the reader task. Only when the SDK session has dispatched every line before it (else the
        settling must go behind them, `_settle_in_order`); False: not taken, nothing changed."""
        if not self._pending or _MARK not in line or (self._session is not None and self._caught_up != self._forwarded):
            return False
        data = _fast_parse(line)
        if data is None or "method" in data:
            return False
        claimed, settled = self._claim_answer(data, line)
        if settled is not None:
            settled[0].settle(settled[1])
        return claimed

    def forwarded(self) -> None:
        """The reader handed a line to the SDK session (see `_settle_in_order`)."""
        self._forwarded += 1

    async def _settle_in_order(self, pending: _Pending, outcome: dict[str, Any] | MCPError) -> None:
        """Settle `pending` once the SDK session has dispatched every line that came before its answer.

        A log message or other notification sent just before the answer must find the request still
        in flight (`proxy/relay.py` routes it to the request's client), as on the SDK's own path. So
        when the session may be behind, the settling goes through its stream, after those lines.
        """
        if self._caught_up == self._forwarded or self._session is None:
            pending.settle(outcome)
            return
        mark = self._forwarded

        def settle() -> None:
            self._caught_up = max(self._caught_up, mark)
            pending.settle(outcome)

        try:
            await self._session.send(SettleInOrder(settle))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pending.settle(outcome)

    def _claim_answer(self, data: dict[str, Any], line: bytes) -> tuple[bool, _Settled | None]:
        request_id = data.get("id")
        if not isinstance(request_id, str) or not request_id.startswith(ID_PREFIX):
            return False, None
        pending = self._pending.get(request_id)
        result, error = data.get("result"), data.get("error")
        if pending is None:
            log.debug("late answer to a raw request dropped", id=request_id)
        elif isinstance(result, dict) and error is None:
            return True, (pending, result)
        elif result is None and isinstance(error, dict) and _is_error(error):
            return True, (pending, MCPError(error["code"], error["message"], error.get("data")))
        else:  # malformed: as the SDK's reader salvages it
            return self._claim_parsed(parse_upstream_line(line))
        return True, None

    def _claim_parsed(self, parsed: SessionMessage | Exception) -> tuple[bool, _Settled | None]:
        message = parsed.message if isinstance(parsed, SessionMessage) else None
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return False, None
        pending = self._pending.get(message.id) if isinstance(message.id, str) else None
        if pending is None:
            return isinstance(message.id, str) and message.id.startswith(ID_PREFIX), None
        if isinstance(message, types.JSONRPCResponse):
            return True, (pending, dict(message.result))
        return True, (pending, MCPError(message.error.code, message.error.message, message.error.data))

    def _claim_progress(self, params: Any) -> bool:
        """Progress on one of our requests: its deadline restarts; the caller's progress function is
        called in a task of its own, as the SDK calls it (it may wait on its client; the reader must not)."""
        token = params.get("progressToken") if isinstance(params, dict) else None
        pending = self._pending.get(token) if isinstance(token, str) else None
        if pending is None or params is None:
            return False
        value = params.get("progress")
        if not isinstance(value, int | float) or isinstance(value, bool):
            return True
        pending.restart()  # progress restarts the deadline at once, before it is relayed
        if pending.progress is not None:
            total, message = params.get("total"), params.get("message")
            self._spawn(
                _deliver_progress,
                pending.progress,
                float(value),
                float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
                message if isinstance(message, str) else None,
            )
        return True

    def close(self) -> None:
        """The connection ended: every waiter fails as the SDK fails its requests."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for pending in self._pending.values():
            pending.settle(MCPError(CONNECTION_CLOSED, "Connection closed"))


async def _deliver_progress(progress: ProgressFn, value: float, total: float | None, message: str | None) -> None:
    try:
        await progress(value, total, message)
    except Exception as exc:  # a client gone away must not disturb the upstream
        log.debug("progress not delivered", error=str(exc)[:200])


def _fast_parse(line: bytes) -> dict[str, Any] | None:
    """`line` as a JSON object, or None where the SDK's parser might disagree (then it decides).

    pydantic-core refuses lone surrogates and invalid UTF-8 as the SDK's parser does; a line
    with more brackets than the nesting an answer may have might be too deep for a client.
    """
    if line.count(b"[") + line.count(b"{") > MAX_RESULT_NESTING:
        return None
    try:
        data = pydantic_core.from_json(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _is_error(error: Any) -> bool:
    return (
        isinstance(error, dict)
        and isinstance(error.get("code"), int)
        and not isinstance(error.get("code"), bool)
        and isinstance(error.get("message"), str)
    )


def _request_line(request_id: str, method: str, params: dict[str, Any] | None, with_progress: bool) -> bytes:
    """The request as a line; our id doubles as the progress token (as the SDK's does)."""
    out = dict(params) if params else {}
    meta = out.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if with_progress:
        meta["progressToken"] = request_id
    if meta:
        out["_meta"] = meta
    else:
        out.pop("_meta", None)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if out:
        message["params"] = out
    try:
        return json_line(message)
    except (ValueError, TypeError) as exc:  # as `_write_stdin` answers a request it cannot serialise
        log.warning("a raw request could not be serialised", error=str(exc)[:200])
        raise MCPError(types.INTERNAL_ERROR, "the request could not be serialised as JSON") from None
