"""ONE upstream: its owner task, states, single-flight start, calls, backoff, stop.

The SDK requires a session and its transport to be entered and exited in the
same task, which must stay alive while the connection is used. So each started
upstream has one *owner task* (`_own`), spawned in the pool's task group, that
opens the transport, shakes hands, lists the catalog, and then parks until the
upstream dies or the pool stops. Requests come from any task through the
session the owner published.

States: configured → starting → ready; a crash or failed start → backoff
(100 ms doubling to 30 s) → started again on the next need. Calls inside the
backoff window fail at once with `upstream_unavailable`.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from aggregator import __version__
from aggregator.catalog.model import Catalog
from aggregator.catalog.store import CatalogStore
from aggregator.config import UpstreamConfig
from aggregator.faults import Fault, SignInNeeded
from aggregator.log import get_logger, redact_text
from aggregator.sdk import ProgressFn, raw_notify, raw_request
from aggregator.upstream.catalog_listing import catalog_contents, list_catalog
from aggregator.upstream.client_sessions import LOST_SETTLE_SECONDS, ClientSessions
from aggregator.upstream.oauth_providers import Authenticator, uses_oauth
from aggregator.upstream.oauth_signin import SignInRequired
from aggregator.upstream.raw_calls import DeadlinePassed, RawCalls, SettleInOrder
from aggregator.upstream.session import Downstream, NoDownstream, Params, UpstreamSession, Via, offered_names
from aggregator.upstream.start_errors import describe_start_error, leaf_exceptions
from aggregator.upstream.transports import TOO_LARGE, StderrTail, TransportHandle, open_transport

log = get_logger(__name__)

BACKOFF_FIRST = 0.1
BACKOFF_MAX = 30.0
STDERR_SETTLE_SECONDS = 0.2  # how long a failure waits for the dead upstream's stderr to be read to its end
REFRESH_MIN_INTERVAL = 1.0  # between two listings caused by list_changed ...
REFRESH_MAX_INTERVAL = 30.0  # ... doubling up to this while the listings find nothing new

_NO_DOWNSTREAM = NoDownstream()


class State(StrEnum):
    CONFIGURED = "configured"
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    STOPPED = "stopped"


@dataclass(eq=False)
class _Run:
    """One start of an upstream, owned by one owner task."""

    done: anyio.Event = field(default_factory=anyio.Event)  # the start settled (ready or failed)
    wake: anyio.Event = field(default_factory=anyio.Event)  # tear down now
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # the whole run; its deadline bounds the start
    session: ClientSession | None = None
    handle: TransportHandle | None = None
    failed: bool = False
    relist: bool = False  # a list_changed arrived before the run was ready
    finished: anyio.Event = field(default_factory=anyio.Event)  # the owner task is done, its reason recorded


class UpstreamConnection:
    def __init__(
        self,
        config: UpstreamConfig,
        store: CatalogStore,
        task_group: anyio.abc.TaskGroup,
        downstream: Callable[[], Downstream] = lambda: _NO_DOWNSTREAM,
        authenticator: Authenticator | None = None,
    ) -> None:
        self.config = config
        self._authenticator = authenticator or Authenticator()
        self.name = config.name
        self._store = store
        self._tg = task_group
        self.state = State.CONFIGURED
        self.last_error: str | None = None
        self.needs_sign_in = False  # the last start failed for want of an OAuth sign-in
        self.handshake_seconds: float | None = None
        self.server_info: types.Implementation | None = None
        self.server_capabilities: types.ServerCapabilities | None = None
        self.instructions: str | None = None
        self.offered: tuple[str, ...] = ()  # what was declared at the last initialize (`session.offered_names`)
        self.log_level: str | None = None  # the level clients asked for; sent on every (re)start
        self._downstream = downstream
        # requests in flight, by a local key: who asked, and the client whose own session carries it (None: the
        # shared session). Relays look there for their client; a reload waits until it is empty.
        self._origins: dict[int, tuple[Any, Any]] = {}
        self.clients = ClientSessions(config.name, task_group, self._open_client_session, config.timeouts.connect)
        self._next_origin = 0
        self.stderr = StderrTail(config.name)
        self._run: _Run | None = None  # the latest start; older runs may still be tearing down
        self._failures = 0
        self._retry_at = 0.0
        self._refreshing = False
        self._refresh_again = False
        self._refresh_interval = REFRESH_MIN_INTERVAL
        self._next_refresh = 0.0  # anyio clock: no re-listing before this
        self._stopping = False

    # ------------------------------------------------------------ status

    @property
    def catalog(self) -> Catalog | None:
        """The live catalog (None while not running, even when a snapshot is current)."""
        return self._store.live(self.name)

    def in_backoff(self) -> bool:
        return self.state is State.BACKOFF and time.monotonic() < self._retry_at

    def backoff_remaining(self) -> float:
        return max(0.0, self._retry_at - time.monotonic())

    # ------------------------------------------------------------ start

    async def ensure_ready(self) -> ClientSession:
        """The live session, starting the upstream if needed; concurrent callers share one start."""
        run = self._run
        if self.state is State.READY and run is not None and run.session is not None:
            return run.session
        if self._stopping:
            raise Fault("upstream_unavailable", f"upstream {self.name!r} is shutting down")
        if self.in_backoff():
            raise Fault(
                "upstream_unavailable",
                f"upstream {self.name!r} failed ({self.last_error}); retrying in {self.backoff_remaining():.1f}s",
            )
        if self.state is not State.STARTING or run is None:
            run = self._run = _Run()
            self.state = State.STARTING
            self._tg.start_soon(self._own, run, name=f"upstream-{self.name}")
        await run.done.wait()
        if self.state is State.READY and run.session is not None:
            return run.session
        message = f"upstream {self.name!r} could not start: {self.last_error}"
        raise SignInNeeded(self.name, message) if self.needs_sign_in else Fault("upstream_unavailable", message)

    async def ensure_catalog(self) -> Catalog:
        await self.ensure_ready()
        catalog = self.catalog
        if catalog is None:  # died between ready and now
            raise Fault("upstream_unavailable", f"upstream {self.name!r} has no catalog: {self.last_error}")
        return catalog

    async def _own(self, run: _Run) -> None:
        """The owner task: open, handshake, list, park; tear down in this same task.

        Everything runs inside `run.scope`, whose deadline (the connect timeout)
        bounds the whole start, transport included, and is lifted once ready.
        """
        started = time.monotonic()
        self.needs_sign_in = False
        try:
            run.scope.deadline = anyio.current_time() + self.config.timeouts.connect
            with run.scope:
                async with AsyncExitStack() as stack:
                    handle = run.handle = await stack.enter_async_context(
                        open_transport(self.config, self.stderr, self._authenticator.auth_for(self.config))
                    )
                    session = await stack.enter_async_context(self._new_session(run, handle))
                    init = await session.initialize()
                    self.server_info = init.server_info
                    self.server_capabilities = init.capabilities
                    self.instructions = init.instructions
                    await self._apply_log_level(session)
                    catalog = await self._list_catalog(session)
                    run.scope.deadline = math.inf
                    if self._stopping:
                        return
                    self._store.put(catalog)
                    self._next_refresh = anyio.current_time() + self._refresh_interval
                    self.handshake_seconds = time.monotonic() - started
                    run.session = session
                    self.state = State.READY
                    self.last_error = None
                    run.done.set()
                    log.info("upstream ready", upstream=self.name, seconds=round(self.handshake_seconds, 3))
                    if run.relist:
                        self._tg.start_soon(self._refresh, name=f"refresh-{self.name}")
                    await self._park(run, handle)
            if run.scope.cancelled_caught and not run.done.is_set() and not self._stopping:
                reason = f"no handshake within {self.config.timeouts.connect:g}s"
                self._failed(run, self._exit_reason(reason, exited=False))
        except Exception as exc:
            # A sign-in is not a crash: once the user has signed in, the next need starts it at once.
            at_once = any(isinstance(leaf, SignInRequired) for leaf in leaf_exceptions(exc))
            self.needs_sign_in = at_once
            what = describe_start_error(exc, self.config)
            self._failed(run, self._exit_reason(what, exited=not what.startswith("no handshake")), backoff=not at_once)
        finally:
            run.session = None
            run.done.set()
            run.finished.set()
            if self._run is run:
                if self._stopping:
                    self.state = State.STOPPED
                    self._store.drop(self.name)
                elif self.state in (State.READY, State.STARTING):  # ended without a recorded reason
                    self._failed(run, "connection ended")

    def _new_session(self, run: _Run | None, handle: TransportHandle, client: Any = None) -> ClientSession:
        """The session over `handle`: the shared one (`run`), or the own session of `client`."""

        async def on_message(message: Any) -> None:
            if isinstance(message, SettleInOrder):  # a raw answer, behind the lines that came before it
                message.apply()
            elif run is not None:
                await self._handle_message(run, message)  # a client's own session never re-lists the catalog

        async def on_request(method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
            return await self._relay_request(method, params, client)

        async def on_notification(method: str, params: Mapping[str, Any] | None) -> None:
            await self._relay_notification(method, params, client)

        return UpstreamSession(
            handle.read,
            handle.write,
            message_handler=on_message,
            client_info=types.Implementation(name="aggregator", version=__version__),
            capabilities=lambda: self._declare(client),
            on_request=on_request,
            on_notification=on_notification,
        )

    @asynccontextmanager
    async def _open_client_session(self, client: Any) -> AsyncIterator[tuple[ClientSession, TransportHandle]]:
        """A new session of this upstream for `client` alone (its own process for stdio)."""
        async with AsyncExitStack() as stack:
            handle = await stack.enter_async_context(
                open_transport(self.config, self.stderr, self._authenticator.auth_for(self.config))
            )
            session = await stack.enter_async_context(self._new_session(None, handle, client))
            await session.initialize()
            await self._apply_log_level(session, self.clients.levels.get(id(client)))
            yield session, handle

    def _declare(self, client: Any = None) -> types.ClientCapabilities:
        """The capabilities to declare at initialize: those of `client` for its own session, else the
        union of the clients'. The shared session's are kept, to record with the catalog it lists."""
        capabilities = self._downstream().client_capabilities(client)
        if client is None:
            self.offered = offered_names(capabilities)
        return capabilities

    def _in_flight(self, client: Any) -> list[Any]:
        """The requests in flight on the session of `client` (None: the shared session)."""
        return [origin for origin, via in list(self._origins.values()) if via is client]

    @property
    def raw_requests(self) -> int:
        """Requests the running shared session sent on the raw leg (`raw_calls.py`); 0 when not running."""
        run = self._run
        raw = run.handle.raw if run is not None and run.handle is not None else None
        return raw.sent if raw is not None else 0

    @property
    def busy(self) -> int:
        """Requests in flight (of every kind, starting ones included)."""
        return len(self._origins)

    async def _relay_request(self, method: str, params: Mapping[str, Any] | None, client: Any = None) -> dict[str, Any]:
        """A server→client request of this upstream, answered by the client it belongs to.

        On a client's own session that client; on the shared one, the relay decides
        from the requests in flight. Bounded by the call timeout, as calls are; the
        upstream cancelling its request cancels this relay and, through it, the
        client's request.
        """
        budget = self.config.timeouts.call
        origins = tuple(self._in_flight(client))
        try:
            with anyio.fail_after(budget):
                return await self._downstream().relay_request(self.name, method, params, Via(origins, client))
        except MCPError:
            raise
        except TimeoutError:
            raise MCPError(types.REQUEST_TIMEOUT, f"{method}: the client did not answer within {budget:g}s") from None
        except Exception as exc:  # the client went away, or its stream did
            log.info("relay failed", upstream=self.name, method=method, error=str(exc)[:200])
            raise MCPError(types.INTERNAL_ERROR, f"{method}: the client could not be reached") from None

    async def _relay_notification(self, method: str, params: Mapping[str, Any] | None, client: Any = None) -> None:
        try:
            via = Via(tuple(self._in_flight(client)), client)
            await self._downstream().relay_notification(self.name, method, params, via)
        except Exception as exc:  # a client gone away must not disturb the upstream
            log.debug("notification not relayed", upstream=self.name, method=method, error=str(exc)[:200])

    async def _apply_log_level(self, session: ClientSession, level: str | None = None) -> None:
        """Send `level` (else the level clients asked for) if the upstream logs at all."""
        level = level or self.log_level
        caps = session.server_capabilities
        if level is None or caps is None or caps.logging is None:
            return
        try:
            await raw_request(session, "logging/setLevel", {"level": level})
        except MCPError as exc:
            log.warning("logging/setLevel refused", upstream=self.name, error=exc.message[:200])

    async def set_log_level(self, level: str, client: Any = None) -> None:
        """Remember `level` for later starts and send it now if the upstream runs and logs.

        From a client that has (or will have) sessions of its own here, only those change:
        another client's log verbosity is not this client's to set.
        """
        if client is not None and self.config.per_client_sessions:
            self.clients.levels[id(client)] = level
            own = self.clients.get(client)
            if own is not None:
                await self._apply_log_level(own, level)
            return
        self.log_level = level
        run = self._run
        shared = [run.session] if self.state is State.READY and run is not None and run.session is not None else []
        for session in [*shared, *self.clients.ready()]:
            await self._apply_log_level(session)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None, client: Any = None) -> None:
        """Send a notification if the upstream runs (a stopped one learns everything at its next start);
        from `client`, on its own session too."""
        run = self._run
        own = self.clients.get(client) if client is not None else None
        shared = run.session if self.state is State.READY and run is not None else None
        for session in (shared, own):
            if session is not None:
                await raw_notify(session, method, dict(params) if params else None)

    async def _park(self, run: _Run, handle: TransportHandle) -> None:
        """Wait until the upstream's stdout ends (stdio) or someone wakes us (crash seen, stop)."""
        async with anyio.create_task_group() as tg:

            async def watch_transport() -> None:
                await handle.closed.wait()
                if not self._stopping:
                    self._failed(run, self._exit_reason(_closed_reason(handle)))
                run.wake.set()

            tg.start_soon(watch_transport)
            await run.wake.wait()
            tg.cancel_scope.cancel()

    def _failed(self, run: _Run, reason: str, *, backoff: bool = True) -> None:
        """Record a crash or failed start of `run` and enter backoff (once per run; none if not `backoff`)."""
        run.wake.set()
        if self._stopping or self._run is not run or run.failed:
            return
        run.failed = True
        run.session = None
        self._failures += 1 if backoff else 0
        delay = min(BACKOFF_FIRST * 2 ** (self._failures - 1), BACKOFF_MAX) if backoff else 0.0
        self._retry_at = time.monotonic() + delay
        self.state = State.BACKOFF
        self.last_error = redact_text(reason)
        self._store.drop(self.name)
        log.warning("upstream failed", upstream=self.name, reason=reason, retry_in=delay)

    def _exit_reason(self, what: str, *, exited: bool = True) -> str:
        if exited:  # its last words may still be on their way through the stderr reader
            self.stderr.wait_drained(STDERR_SETTLE_SECONDS)
        tail = self.stderr.text(5)
        return f"{what}" + (f"; stderr: {tail}" if tail else "")

    # ------------------------------------------------------------ catalog

    async def _list_catalog(self, session: ClientSession) -> Catalog:
        return await list_catalog(session, self.config, self.server_info, self.instructions, self.offered)

    async def _handle_message(self, run: _Run, message: Any) -> None:
        if isinstance(
            message,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            if run.session is None:  # still starting: the first listing may already be stale
                run.relist = True
            else:
                self._tg.start_soon(self._refresh, name=f"refresh-{self.name}")
        elif isinstance(message, Exception):
            log.warning("upstream transport error", upstream=self.name, error=str(message)[:300])

    async def _refresh(self) -> None:
        """Re-list after a list_changed: coalesced and rate-limited.

        Notifications arriving while a listing is pending or running fold into one
        more listing. Listings are at least `_refresh_interval` apart; the interval
        doubles (up to REFRESH_MAX_INTERVAL) while listings find nothing new and
        drops back when one does, so an upstream that answers every `tools/list`
        with a `list_changed` costs one listing every half minute, not a core.
        """
        if self._refreshing:
            self._refresh_again = True
            return
        self._refreshing = True
        try:
            while True:
                await anyio.sleep_until(self._next_refresh)
                self._refresh_again = False
                run = self._run
                session = run.session if run is not None else None
                if run is None or session is None:
                    return
                try:
                    with anyio.fail_after(self.config.timeouts.call):
                        catalog = await self._list_catalog(session)
                except Exception as exc:
                    log.warning("catalog refresh failed", upstream=self.name, error=str(exc)[:300])
                    return
                if run.session is session and self._run is run:
                    self._settle_refresh(catalog)
                if not self._refresh_again:
                    return
        finally:
            self._refreshing = False

    def _settle_refresh(self, catalog: Catalog) -> None:
        """Publish a re-listed catalog if it changed, and set when the next listing may run."""
        old = self.catalog
        if old is None or catalog_contents(old) != catalog_contents(catalog):
            self._store.put(catalog)
            self._refresh_interval = REFRESH_MIN_INTERVAL
        else:
            self._refresh_interval = min(self._refresh_interval * 2, REFRESH_MAX_INTERVAL)
        self._next_refresh = anyio.current_time() + self._refresh_interval

    # ------------------------------------------------------------ calls

    async def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        progress: ProgressFn | None = None,
        *,
        extra: Mapping[str, Any] | None = None,
        origin: Any = None,
    ) -> dict[str, Any]:
        """Forward one call and return the upstream's raw result, untouched.

        `extra` holds further request params passed through as they came (`_meta`
        keys, a `task`). Any JSON-RPC error of the upstream becomes `upstream_error`.
        """
        params = {**(extra or {}), "name": tool, "arguments": dict(arguments)}
        try:
            return await self.request("tools/call", params, progress, origin=origin, what=f"{self.name}/{tool}")
        except MCPError as exc:
            raise self._call_fault(self._run, exc) from None

    async def request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        progress: ProgressFn | None = None,
        *,
        origin: Any = None,
        what: str | None = None,
    ) -> dict[str, Any]:
        """Forward one request, starting the upstream if needed; the raw result, untouched.

        The deadline restarts whenever the upstream reports progress (the SDK's own
        timeout is a fixed budget, so we keep ours). Cancelling the caller cancels
        the upstream request (`notifications/cancelled`). The upstream's own
        JSON-RPC error is raised as the `MCPError` it sent; a lost connection or
        a timeout is a `Fault`. `origin` (the client's request) is remembered while
        the request is in flight, so the upstream's own requests find their client;
        with per-client sessions (docs/isolation.md) it goes on that client's own session.
        """
        key = self._next_origin = self._next_origin + 1
        client = self._downstream().client_of(origin) if self.config.per_client_sessions else None
        self._origins[key] = (origin, client)  # from here on: a reload lets it finish
        try:
            return await self._request(method, params, progress, client, what)
        finally:
            del self._origins[key]

    async def _request(
        self, method: str, params: Mapping[str, Any] | None, progress: ProgressFn | None, client: Any, what: str | None
    ) -> dict[str, Any]:
        """`request` on the shared session, or on the own session of `client` when it has one."""
        session = await self.ensure_ready()
        run = self._run
        handle = run.handle if run is not None else None
        if client is not None:
            session, handle = await self.clients.session(client)
        budget = self.config.timeouts.call
        plain = dict(params) if params else None
        try:
            raw = self._raw_leg(handle, client, params)
            if raw is not None:  # its deadline is a timer of its own: no cancel scope per request
                result = await raw.request(method, plain, progress, budget)
            else:
                result = await _sdk_request(session, method, plain, progress, budget)
        except DeadlinePassed:
            raise _timeout(what or f"{self.name} {method}", budget) from None
        except MCPError as exc:
            lost = exc.code == CONNECTION_CLOSED or (handle is not None and handle.closed.is_set())
            if lost and client is not None and handle is not None:
                # the client's own session: the shared one is fine
                if (needed := await self.clients.lost(client, handle)) is not None:
                    raise SignInNeeded(self.name, f"upstream {self.name!r}: {needed}") from None
                raise Fault(
                    "upstream_error",
                    f"upstream {self.name!r}: the client's own session ended during the request "
                    "(the next request opens a new one)",
                ) from None
            if lost:
                await self._settle_sign_in(run)
                raise self._call_fault(run, exc) from None
            raise
        self._failures = 0
        return result

    async def _settle_sign_in(self, run: _Run | None) -> None:
        """The shared session of an OAuth upstream ended during a call: let its owner task record why, so a
        token refused or signed out (`auth logout`) answers this call with the sign-in needed, not a lost
        connection and a backoff."""
        if run is None or not uses_oauth(self.config):
            return
        with anyio.move_on_after(LOST_SETTLE_SECONDS):
            await run.finished.wait()
        if self.needs_sign_in and self._run is run:
            raise SignInNeeded(self.name, f"upstream {self.name!r}: {self.last_error}")

    def _raw_leg(self, handle: TransportHandle | None, client: Any, params: Params) -> RawCalls | None:
        """The raw requests of the shared stdio session, when this request may bypass the SDK session.

        Not with `call_path: full`, not on a client's own session (it is the SDK's), and not for a
        task-augmented request (its answers and notifications belong to the task machinery).
        """
        if self.config.call_path != "raw" or client is not None or handle is None or (params and "task" in params):
            return None
        return handle.raw

    # ------------------------------------------------------------ the raw route (proxy/raw.py)

    def raw_leg(self) -> RawLeg | None:
        """The running shared session's raw leg, when a tool call may go straight to it (`UpstreamPool.tool_route`):
        ready (nothing to start or wait for), `call_path: raw` on stdio, one session for every client."""
        run = self._run
        if self.state is not State.READY or self._stopping or run is None or run.session is None or run.handle is None:
            return None
        raw = run.handle.raw
        if raw is None or raw.closed or self.config.call_path != "raw" or self.config.per_client_sessions:
            return None
        return RawLeg(run, raw)

    def leg_current(self, leg: RawLeg) -> bool:
        """Whether `leg` is still the running session's (no restart, crash or stop since `raw_leg`)."""
        run = leg.run
        return self._run is run and self.state is State.READY and run.session is not None and not leg.raw.closed

    async def call_on(
        self, leg: RawLeg, params: dict[str, Any], progress: ProgressFn | None, origin: Any, what: str
    ) -> dict[str, Any]:
        """`call_tool` on a leg `raw_leg` gave (nothing started, no session looked up): the same record of
        `origin` for relays, deadline, cancellation and faults as `request` on the raw leg."""
        key = self._next_origin = self._next_origin + 1
        self._origins[key] = (origin, None)
        budget = self.config.timeouts.call
        try:
            result: dict[str, Any] = await leg.raw.request("tools/call", params, progress, budget)
        except DeadlinePassed:
            raise _timeout(what, budget) from None
        except MCPError as exc:  # a stdio upstream never needs a sign-in: `_settle_sign_in` has nothing to do
            raise self._call_fault(leg.run, exc) from None
        finally:
            del self._origins[key]
        self._failures = 0
        return result

    def _call_fault(self, run: _Run | None, exc: MCPError) -> Fault:
        """The fault for a failed call. A JSON-RPC error is the upstream's answer, and the
        connection stays; only a transport that has ended means the upstream is lost."""
        handle = run.handle if run is not None else None
        lost = handle.closed.is_set() if handle is not None else exc.code == CONNECTION_CLOSED
        if not lost:
            message = " ".join(str(exc.message).split())[:1000]
            if TOO_LARGE.search(message):
                return Fault("response_too_large", f"upstream {self.name!r}: {message}")
            return Fault("upstream_error", f"upstream {self.name!r} answered with error {exc.code}: {message}")
        if run is not None:
            reason = _closed_reason(handle) if handle is not None else "connection closed"
            self._failed(run, self._exit_reason(f"{reason} during a call"))
        if handle is not None and handle.overflow:
            return Fault("response_too_large", f"upstream {self.name!r} sent a message over {handle.limit} bytes")
        if self._stopping:  # `_failed` records nothing for an upstream being stopped
            return Fault("upstream_error", f"upstream {self.name!r} was stopped during the call (a reload or shutdown)")
        return Fault("upstream_error", f"upstream {self.name!r}: {self.last_error or 'connection closed'}")

    # ------------------------------------------------------------ stop

    def request_stop(self) -> None:
        """Ask the owner task to tear down; the pool's task group waits for it."""
        self._stopping = True
        self.clients.close_all()
        if self._run is not None:
            self._run.wake.set()
            if not self._run.done.is_set():
                self._run.scope.cancel()  # a start in progress is abandoned, not awaited
        if self.state is not State.READY and self.state is not State.STARTING:
            self.state = State.STOPPED

    def detach_store(self) -> None:
        """A replacement serves this name now: keep this connection's catalogs to itself from here on."""
        self._store = CatalogStore()


async def _sdk_request(
    session: ClientSession, method: str, params: dict[str, Any] | None, progress: ProgressFn | None, budget: float
) -> dict[str, Any]:
    """A request on an SDK session within `budget` seconds, restarted by each progress report;
    `DeadlinePassed` past it (the SDK tells the upstream, as for any cancelled request)."""
    with anyio.CancelScope(deadline=anyio.current_time() + budget) as scope:

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            scope.deadline = anyio.current_time() + budget
            if progress is not None:
                await progress(value, total, message)

        result: dict[str, Any] = await raw_request(session, method, params, on_progress)
    if scope.cancelled_caught:
        raise DeadlinePassed
    return result


@dataclass(frozen=True, slots=True, eq=False)
class RawLeg:
    """One run's raw leg (`UpstreamConnection.raw_leg`): valid while `UpstreamConnection.leg_current`."""

    run: _Run
    raw: RawCalls


def _timeout(what: str, budget: float) -> Fault:
    return Fault("timeout", f"{what} did not answer within {budget:g}s (no progress either)")


def _closed_reason(handle: TransportHandle) -> str:
    if handle.overflow:
        return f"sent a message over {handle.limit} bytes"
    return "exited" if handle.pid is not None else "connection lost"
