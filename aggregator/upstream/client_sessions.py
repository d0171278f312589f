"""One upstream session per downstream client, for upstreams that cannot tell clients apart.

An upstream's request to its client (sampling, elicitation, roots) carries no
trace of the call that caused it, so one upstream session shared by several
clients cannot say whose it is. Given its own session, a client owns everything
that session sends: requests, log messages, resource updates and tasks
(docs/isolation.md). HTTP and SSE upstreams get one per client by default (one
more MCP session); stdio upstreams with `sessions: per-client` (one more process).

Each session has its own owner task, as the SDK requires (entered and exited in
one task), in the pool's task group. It starts on the client's first request,
and ends when the client disconnects, when the upstream stops, or when its
transport ends (the next request opens a new one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession

from aggregator.faults import Fault, SignInNeeded
from aggregator.log import get_logger, redact_text
from aggregator.upstream.oauth_signin import SignInRequired, describe_auth_error
from aggregator.upstream.start_errors import leaf_exceptions
from aggregator.upstream.transports import TransportHandle

log = get_logger(__name__)

LOST_SETTLE_SECONDS = 1.0  # how long a lost session's end is awaited to learn why it ended

Opener = Callable[[Any], AbstractAsyncContextManager[tuple[ClientSession, TransportHandle]]]
"""Opens (transport, handshake) the session of one client; closing it ends that session."""


@dataclass(eq=False)
class _ClientRun:
    client: Any
    done: anyio.Event = field(default_factory=anyio.Event)  # the start settled (ready or failed)
    wake: anyio.Event = field(default_factory=anyio.Event)  # tear down now
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    session: ClientSession | None = None
    handle: TransportHandle | None = None
    error: str | None = None
    sign_in: bool = False  # it failed for want of an OAuth sign-in
    ended: bool = False
    finished: anyio.Event = field(default_factory=anyio.Event)  # its owner task is done


class ClientSessions:
    """The per-client sessions of one upstream, by client (the SDK's downstream `Connection`)."""

    def __init__(self, upstream: str, task_group: anyio.abc.TaskGroup, opener: Opener, connect_timeout: float) -> None:
        self.upstream = upstream
        self._tg = task_group
        self._open = opener
        self._connect_timeout = connect_timeout
        self._runs: dict[int, _ClientRun] = {}  # by id(client): the client object need not be hashable
        self.levels: dict[int, str] = {}  # by id(client): the logging level the client asked for
        self._closed = False
        self.live = 0  # owner tasks still running (a closed session may still be tearing down)

    async def session(self, client: Any) -> tuple[ClientSession, TransportHandle]:
        """The client's session, opened on first need; concurrent requests of one client share one start."""
        if self._closed:
            raise Fault("upstream_unavailable", f"upstream {self.upstream!r} is shutting down")
        run = self._runs.get(id(client))
        if run is None or run.ended or run.client is not client:
            run = self._runs[id(client)] = _ClientRun(client)
            self._tg.start_soon(self._own, run, name=f"upstream-{self.upstream}-client")
        await run.done.wait()
        if run.session is None or run.handle is None:
            message = f"upstream {self.upstream!r} could not start a session: {run.error}"
            raise SignInNeeded(self.upstream, message) if run.sign_in else Fault("upstream_unavailable", message)
        return run.session, run.handle

    def get(self, client: Any) -> ClientSession | None:
        """The client's session if it is open now."""
        run = self._runs.get(id(client))
        return run.session if run is not None and run.client is client else None

    def ready(self) -> list[ClientSession]:
        """The sessions open now."""
        return [run.session for run in list(self._runs.values()) if run.session is not None]

    async def lost(self, client: Any, handle: TransportHandle) -> str | None:
        """The session's transport ended during a request: the client's next request opens a new one.

        Returns the sign-in-needed message if that is why it ended (its token refused, no refresh).
        """
        run = self._runs.get(id(client))
        if run is None or run.handle is not handle:
            return None
        self._end(run)
        with anyio.move_on_after(LOST_SETTLE_SECONDS):
            await run.finished.wait()
        return run.error if run.sign_in else None

    def close(self, client: Any) -> None:
        """The client disconnected: end its session (and its process, for stdio)."""
        self.levels.pop(id(client), None)
        run = self._runs.get(id(client))
        if run is not None and run.client is client:
            self._end(run)

    def close_all(self) -> None:
        """The upstream stops: end every client's session; none opens after this."""
        self._closed = True
        for run in list(self._runs.values()):
            self._end(run)

    def _end(self, run: _ClientRun) -> None:
        if self._runs.get(id(run.client)) is run:
            del self._runs[id(run.client)]
        run.wake.set()
        if not run.done.is_set():
            run.scope.cancel()  # a start under way is abandoned

    async def _own(self, run: _ClientRun) -> None:
        """Open, park until woken or the transport ends, close: all in this one task."""
        run.scope.deadline = anyio.current_time() + self._connect_timeout
        self.live += 1
        try:
            with run.scope:
                async with self._open(run.client) as (session, handle):
                    run.scope.deadline = math.inf
                    run.session, run.handle = session, handle
                    run.done.set()
                    log.info("client session ready", upstream=self.upstream, sessions=len(self._runs))
                    async with anyio.create_task_group() as tg:

                        async def watch() -> None:
                            await handle.closed.wait()
                            run.wake.set()

                        tg.start_soon(watch)
                        await run.wake.wait()
                        tg.cancel_scope.cancel()
            if run.scope.cancelled_caught and not run.done.is_set():
                run.error = f"no handshake within {self._connect_timeout:g}s"
        except Exception as exc:
            first = next(iter(leaf_exceptions(exc)), exc)
            run.sign_in = isinstance(first, SignInRequired)
            run.error = redact_text(describe_auth_error(first) or f"{type(first).__name__}: {first}")[:500]
            log.warning("client session failed", upstream=self.upstream, error=run.error)
        finally:
            self.live -= 1
            run.session = None
            run.ended = True
            run.done.set()
            run.finished.set()
            if self._runs.get(id(run.client)) is run:
                del self._runs[id(run.client)]
