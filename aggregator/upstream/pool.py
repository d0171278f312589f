"""All upstreams: lookup, parallel start, snapshots, and a shutdown that leaves no child behind.

The pool owns one task group; every upstream's owner task, catalog refresh,
eager start and snapshot write lives in it, so leaving `UpstreamPool.running()`
ends them all.

Snapshots (given a data dir): the store is seeded from them before anything
starts, and each live listing is written back (`pool_snapshots.SnapshotKeeper`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc

from aggregator.catalog.model import Catalog, ToolEntry, age_text
from aggregator.catalog.snapshot import SnapshotDir, fingerprint
from aggregator.catalog.store import CatalogStore
from aggregator.config import AggregatorConfig, UpstreamConfig
from aggregator.config.watch import watch_config
from aggregator.faults import Fault
from aggregator.log import get_logger, register_secrets
from aggregator.sdk import ProgressFn
from aggregator.suggest import closest
from aggregator.upstream.connection import RawLeg, State, UpstreamConnection
from aggregator.upstream.oauth_offers import SignInOffers
from aggregator.upstream.oauth_providers import Authenticator
from aggregator.upstream.oauth_tokens import TokenStore
from aggregator.upstream.pool_snapshots import SnapshotKeeper
from aggregator.upstream.session import Downstream, NoDownstream, offered_names

log = get_logger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """One row of `list-upstreams` / `catalog_list_servers`."""

    name: str
    transport: str
    state: str
    description: str
    capabilities: list[str]
    tool_count: int | None
    catalog_age: float | None  # seconds since the catalog was listed
    handshake_seconds: float | None
    last_error: str | None
    stderr_tail: list[str]
    snapshot_tool_count: int | None = None  # the snapshot kept for this upstream (None: none)
    snapshot_age: float | None = None  # seconds since the snapshot's listing
    snapshot_note: str | None = None  # why no snapshot is used (corrupt, definition changed, too old)
    instructions: str | None = None  # what the upstream said at its handshake (null until started)


def secret_values(config: AggregatorConfig) -> list[str]:
    """Every configured value that may be a secret: upstream env and header values, OAuth client secrets."""
    return [
        value
        for upstream in config.upstreams.values()
        for value in (
            *upstream.env.values(),
            *upstream.headers.values(),
            upstream.client_secret,
            upstream.client_private_key,
            upstream.idp_id_token,
        )
        if value is not None
    ]


class UpstreamPool:
    """Implements `aggregator.catalog.source.CatalogSource` over real connections."""

    def __init__(
        self,
        config: AggregatorConfig,
        task_group: anyio.abc.TaskGroup,
        data_dir: Path | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        """`data_dir`: where catalog snapshots (and OAuth tokens) live; None keeps none on disk.

        `authenticator`: how remote upstreams sign in; by default from the data dir's token
        store, and never interactively (a needed sign-in fails at once, naming the command).
        """
        self.config = config
        self.authenticator = authenticator or Authenticator(
            TokenStore.in_data_dir(data_dir) if data_dir else TokenStore(None)
        )
        register_secrets(secret_values(config))
        self.snapshots = SnapshotDir(data_dir) if data_dir is not None else None
        self._fingerprints = {
            name: fingerprint(upstream)
            for name, upstream in config.upstreams.items()
            if self.snapshots is not None and upstream.snapshots
        }
        self._store = CatalogStore(snapshot_servers=self._fingerprints)
        self.downstream: Downstream = NoDownstream()  # the server installs itself here
        self.on_call_result: Callable[[str, Any], None] = lambda server, result: None
        self._connections = {
            name: UpstreamConnection(upstream, self._store, task_group, lambda: self.downstream, self.authenticator)
            for name, upstream in config.upstreams.items()
        }
        self._by_folded = {name.casefold(): name for name in self._connections}
        self._tg = task_group
        self.sign_ins = SignInOffers(self.authenticator, task_group, lambda name: self.start_all([name]))
        self._busy: dict[UpstreamConnection, int] = {}  # calls in flight, so a replaced upstream can finish them
        self._retiring: set[UpstreamConnection] = set()
        self._reconfigure_listeners: list[Callable[[ConfigDiff], None]] = []
        self._config_checks: list[Callable[[AggregatorConfig], None]] = []
        self._closing = False
        self._snapshot_keeper = SnapshotKeeper(self.snapshots, self._fingerprints, self._store, task_group)
        self.snapshot_writes = self._snapshot_keeper.writes  # the outcome of each upstream's last write
        self._snapshot_keeper.seed(config.upstreams, self._fingerprints)
        self._store.subscribe(self._snapshot_keeper.on_catalog)

    @classmethod
    @asynccontextmanager
    async def running(
        cls,
        config: AggregatorConfig,
        data_dir: Path | None = None,
        *,
        watch: Path | None = None,
        authenticator: Authenticator | None = None,
    ) -> AsyncIterator[UpstreamPool]:
        """A pool whose upstreams are all stopped (process groups included) on exit.

        `data_dir`: where catalog snapshots live (None: none). With `watch`, edits of that config
        file (and SIGHUP) are applied while it runs (`apply_config`).
        """
        async with anyio.create_task_group() as tg:
            pool = cls(config, tg, data_dir, authenticator)
            try:
                pool._start_eager()
                if watch is not None:
                    tg.start_soon(watch_config, watch, pool.apply_config, name="config-watch")
                yield pool
            finally:
                await pool._shutdown(tg)

    # ------------------------------------------------------------ CatalogSource

    @property
    def store(self) -> CatalogStore:
        return self._store

    def upstream_names(self) -> list[str]:
        return list(self._connections)

    def resolve(self, name: str) -> str | None:
        return self._by_folded.get(name.casefold())

    def metadata(self, name: str) -> tuple[str, list[str]]:
        upstream = self._connections[name].config
        return upstream.description, list(upstream.capabilities)

    def in_backoff(self, name: str) -> bool:
        return self.connection(name).in_backoff()

    async def ensure_catalog(self, name: str) -> Catalog:
        """The current catalog (a snapshot will do); starts the upstream only when there is none.

        A snapshot listed under fewer client capabilities than the clients offer now does not do
        (`snapshot_falls_short`): the upstream starts and lists what it lists to them.
        """
        current = self._store.get(name)
        if current is not None and current.is_snapshot and not self.snapshot_falls_short(name):
            return current
        return await self.connection(name).ensure_catalog()

    def snapshot_falls_short(self, name: str) -> bool:
        """True if the current catalog of `name` is a snapshot listed under fewer capabilities than offered now.

        An upstream may list more tools to a client that can answer sampling, elicitation or
        roots (server-everything: 13 to none, 17 to all three); a snapshot that does not record
        what it was listed under counts as listed under none.
        """
        current = self._store.get(name)
        if current is None or not current.is_snapshot:
            return False
        wanted = offered_names(self.downstream.client_capabilities())
        return not set(wanted) <= set(current.offered or ())

    def instructions(self, name: str) -> str | None:
        """What the upstream said at its handshake: the running session's, else its snapshot's."""
        said = self.connection(name).instructions
        if said is None and (current := self._store.get(name)) is not None:
            said = current.instructions
        return said

    async def ensure_live_catalog(self, name: str) -> Catalog:
        """The catalog the running upstream lists, starting it if needed (replaces a snapshot)."""
        return await self.connection(name).ensure_catalog()

    # ------------------------------------------------------------ the rest

    def connection(self, name: str) -> UpstreamConnection:
        try:
            return self._connections[name]
        except KeyError:
            known = ", ".join(self._connections) or "none configured"
            guess = closest(str(name), self._connections)
            hint = f"; did you mean {guess!r}?" if guess else ""
            raise Fault("unknown_server", f"no upstream named {name!r}{hint} (known: {known})") from None

    async def call_tool(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any],
        progress: ProgressFn | None = None,
        *,
        extra: Mapping[str, Any] | None = None,
        origin: Any = None,
    ) -> dict[str, Any]:
        """Forward a call; an upstream not running yet is started first and must still offer `tool`.

        A tool found in a snapshot may be gone from the live catalog: that answers
        `unknown_tool` instead of reaching the upstream.
        """
        conn = self.connection(server)
        self._enter(conn)
        try:
            if self._store.live(server) is None:
                snapshot = self._store.get(server)
                require_tool(await conn.ensure_catalog(), tool, snapshot)
            result = await conn.call_tool(tool, arguments, progress, extra=extra, origin=origin)
        finally:
            self._leave(conn)
        self.on_call_result(server, result)
        return result

    def _enter(self, conn: UpstreamConnection) -> None:
        """A call to `conn` begins: counted, so a reload lets it finish before stopping `conn`."""
        self._busy[conn] = self._busy.get(conn, 0) + 1

    def _leave(self, conn: UpstreamConnection) -> None:
        self._busy[conn] -= 1
        if not self._busy[conn]:
            del self._busy[conn]

    def tool_route(self, server: str, tool: str) -> ToolRoute | None:
        """The way straight to the raw leg of `server` for a call of its exposed tool `tool`, or None (the
        call goes through `call_tool`): `server` runs (its live catalog lists `tool`) and its raw leg is up."""
        conn = self._connections.get(server)
        catalog = self._store.live(server)
        if conn is None or catalog is None:
            return None
        entry = catalog.tool(tool)
        leg = conn.raw_leg()
        if entry is None or entry.hidden or leg is None:
            return None
        return ToolRoute(self, conn, leg, catalog, entry.name)

    def _current(self, route: ToolRoute) -> bool:
        conn = route.conn
        return (
            self._connections.get(conn.name) is conn
            and self._store.live(conn.name) is route.catalog
            and conn.leg_current(route.leg)
        )

    def client_gone(self, client: Any) -> None:
        """A downstream client disconnected: end the upstream sessions it had of its own (docs/isolation.md),
        and the sign-ins offered to it."""
        self.sign_ins.client_gone(client)
        for conn in [*self._connections.values(), *self._retiring]:
            conn.clients.close(client)

    def unlisted(self, *, direct: bool) -> list[str]:
        """Upstreams never listed (no live catalog, no snapshot) and not inside a backoff window.

        `direct`: those with `expose: direct` (True) or the others (False).
        """
        return [
            name
            for name, conn in self._connections.items()
            if self._store.get(name) is None and (conn.config.expose == "direct") == direct and not conn.in_backoff()
        ]

    def snapshot_only(self) -> list[str]:
        """Upstreams known only from a snapshot (not running), outside a backoff window."""
        return [
            name
            for name, conn in self._connections.items()
            if self._store.get(name) is not None and self._store.live(name) is None and not conn.in_backoff()
        ]

    async def find_starting(self, lookup: Callable[[], T | None]) -> T | None:
        """`lookup()`, and while it finds nothing, start the next upstreams that may own it and look again.

        Where no loaded catalog or snapshot names the owner of a prompt, a URI or a
        template, the candidates start in rounds, each round concurrently (single
        flight, backoff as for calls): direct upstreams never listed, the other
        upstreams never listed, then those known only from a (perhaps stale)
        snapshot. None when no upstream owns it.
        """
        found = lookup()
        rounds = (lambda: self.unlisted(direct=True), lambda: self.unlisted(direct=False), self.snapshot_only)
        for names in rounds:
            if found is not None:
                break
            pending = names()
            if pending:
                await self.start_all(pending)
                found = lookup()
        return found

    def ready_connections(self) -> list[UpstreamConnection]:
        """The connections that are ready now."""
        return [conn for conn in self._connections.values() if conn.state is State.READY]

    async def set_log_level(self, level: str, client: Any = None) -> None:
        """`logging/setLevel` for every upstream: sent to the running ones, kept for later starts
        (from `client`: for its own upstream sessions, where it has them)."""

        async def one(conn: UpstreamConnection) -> None:
            await conn.set_log_level(level, client)

        async with anyio.create_task_group() as tg:
            for conn in self._connections.values():
                tg.start_soon(one, conn)

    async def notify_running(self, method: str, params: Mapping[str, Any] | None = None, client: Any = None) -> None:
        """A client notification (roots changed) for every running upstream (and `client`'s own sessions)."""
        for conn in self.ready_connections():
            try:
                await conn.notify(method, params, client)
            except Exception as exc:
                log.debug("notification not delivered", upstream=conn.name, method=method, error=str(exc)[:200])

    async def start_all(
        self, names: list[str] | None = None, on_done: Callable[[str], None] | None = None
    ) -> dict[str, Fault | None]:
        """Start upstreams concurrently; each name maps to None (ready) or the Fault it raised.

        `on_done(name)` is called as each one settles (a CLI progress line).
        """
        outcome: dict[str, Fault | None] = {}

        async def start(name: str) -> None:
            try:
                await self.ensure_live_catalog(name)
                outcome[name] = None
            except Fault as fault:
                outcome[name] = fault
            if on_done is not None:
                on_done(name)

        async with anyio.create_task_group() as tg:
            for name in names if names is not None else self.upstream_names():
                tg.start_soon(start, name)
        return {name: outcome[name] for name in sorted(outcome)}

    def status(self, name: str) -> UpstreamStatus:
        conn = self.connection(name)
        catalog = conn.catalog
        upstream = conn.config
        state = conn.state.value
        if conn.state is State.BACKOFF and not conn.in_backoff():
            state = "failed"  # the window passed: the next need retries
        snapshot = self._store.snapshot(name)
        return UpstreamStatus(
            name=name,
            transport=upstream.transport,
            state=state,
            description=upstream.description,
            capabilities=list(upstream.capabilities),
            tool_count=len(catalog.exposed_tools) if catalog else None,
            catalog_age=(time.time() - catalog.loaded_at) if catalog else None,
            handshake_seconds=conn.handshake_seconds,
            last_error=conn.last_error,
            stderr_tail=conn.stderr.lines()[-10:],
            snapshot_tool_count=len(snapshot.exposed_tools) if snapshot else None,
            snapshot_age=snapshot.age() if snapshot else None,
            snapshot_note=self._snapshot_keeper.notes.get(name),
            instructions=self.instructions(name),
        )

    def statuses(self) -> list[UpstreamStatus]:
        return [self.status(name) for name in self._connections]

    def _start_eager(self, names: Iterable[str] | None = None) -> None:
        for name in self._connections if names is None else names:
            if self._connections[name].config.start == "eager":
                self._tg.start_soon(self._start_quietly, name, name=f"eager-{name}")

    async def _start_quietly(self, name: str) -> None:
        try:
            await self.ensure_live_catalog(name)  # eager means started, even with a snapshot at hand
        except Fault as fault:
            if not self._closing:  # a start abandoned by a shutdown is no failure
                log.warning("eager start failed", upstream=name, reason=fault.message)

    async def _shutdown(self, tg: anyio.abc.TaskGroup) -> None:
        """Ask every owner task to stop; cancel what has not stopped after a grace period.

        Snapshot writes under way are finished first (within the same grace period).
        """
        self._closing = True  # a config reload from here on would start what we are stopping
        everyone = [*self._connections.values(), *self._retiring]
        for conn in everyone:
            conn.request_stop()
        with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS, shield=True):
            while self._snapshot_keeper.writing or any(_running(conn) for conn in everyone):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()

    # ------------------------------------------------------------ reconfiguration (hot reload)

    def on_reconfigure(self, listener: Callable[[ConfigDiff], None]) -> None:
        """Call `listener` with each applied `ConfigDiff` (the server updates exposure and search)."""
        self._reconfigure_listeners.append(listener)

    def check_config(self, check: Callable[[AggregatorConfig], None]) -> None:
        """Run `check` on every config before it is applied; it raises `ConfigError` to refuse one."""
        self._config_checks.append(check)

    def apply_config(self, config: AggregatorConfig) -> ConfigDiff:
        """Make the running pool match `config`; a `check_config` check may refuse it (`ConfigError`).

        New upstreams are added; removed ones stop (process group included) once their calls in
        flight are done; changed ones are replaced by a fresh connection that starts on the next
        need (the old one finishes its calls, then stops); unchanged ones are not touched.
        """
        if self._closing:
            return ConfigDiff([], [], [])
        for check in self._config_checks:
            check(config)
        old = self.config.upstreams
        diff = ConfigDiff(
            added=sorted(set(config.upstreams) - set(old)),
            removed=sorted(set(old) - set(config.upstreams)),
            changed=sorted(n for n in set(old) & set(config.upstreams) if old[n] != config.upstreams[n]),
        )
        self.config = config
        register_secrets(secret_values(config))
        for name in [*diff.removed, *diff.changed]:
            self._fingerprints.pop(name, None)
            self._retire(self._connections.pop(name))
        fresh = [*diff.added, *diff.changed]
        for name in fresh:
            self._connections[name] = UpstreamConnection(
                config.upstreams[name], self._store, self._tg, lambda: self.downstream, self.authenticator
            )
            if self.snapshots is not None and config.upstreams[name].snapshots:
                self._fingerprints[name] = fingerprint(config.upstreams[name])
        self._snapshot_keeper.seed(
            config.upstreams, {name: self._fingerprints[name] for name in fresh if name in self._fingerprints}
        )
        self._connections = {name: self._connections[name] for name in config.upstreams}  # name order
        self._by_folded = {name.casefold(): name for name in self._connections}
        self._start_eager([*diff.added, *diff.changed])
        if diff:
            log.info("upstreams reconfigured", added=diff.added, removed=diff.removed, changed=diff.changed)
        for listener in list(self._reconfigure_listeners):
            listener(diff)
        return diff

    def _retire(self, conn: UpstreamConnection) -> None:
        """Take `conn` out of service now; stop it once its requests in flight (any kind) are done (or time out)."""
        conn.detach_store()
        self._store.forget(conn.name)  # removed, or its definition changed: its snapshot no longer holds
        self._retiring.add(conn)

        async def stop_when_idle() -> None:
            with anyio.move_on_after(conn.config.timeouts.call):
                while self._busy.get(conn) or conn.busy:
                    await anyio.sleep(0.05)
            conn.request_stop()
            self._retiring.discard(conn)

        self._tg.start_soon(stop_when_idle, name=f"retire-{conn.name}")

    # ------------------------------------------------------------ snapshots

    def snapshot_on_disk(self, upstream: UpstreamConfig) -> Catalog | None:
        """The valid snapshot on disk for this definition of an upstream (read only, nothing seeded)."""
        return self._snapshot_keeper.on_disk(upstream)

    async def flush_snapshots(self) -> None:
        """Wait until every snapshot write under way has finished."""
        await self._snapshot_keeper.flush()


@dataclass(frozen=True, slots=True, eq=False)
class ToolRoute:
    """A tool call's way from the raw lane (`proxy/raw.py`) straight to a running upstream's raw leg.

    `UpstreamPool.call_tool` → `UpstreamConnection.call_tool` → `request` → `_request` look up, on every
    call, what does not change from one call to the next while the upstream runs: the connection, its
    catalog and the tool in it, its session and raw leg. A route holds them; `current()` says (by identity,
    a few attribute reads) whether they still hold: no reload replaced the connection, no listing replaced
    the catalog, no crash, restart or stop ended the leg. The call keeps what the layers do around the
    request: the pool's busy count (a reload waits for it), the origin of the call (relays find its
    client), the deadline, cancellation, the fault taxonomy and `on_call_result`.
    """

    pool: UpstreamPool
    conn: UpstreamConnection
    leg: RawLeg
    catalog: Catalog
    tool: str

    def current(self) -> bool:
        return self.pool._current(self)

    async def call(
        self, arguments: Mapping[str, Any], progress: ProgressFn | None, extra: Mapping[str, Any] | None, origin: Any
    ) -> dict[str, Any]:
        """`UpstreamPool.call_tool(server, tool, ...)` for a route `current()` a moment ago."""
        pool, conn = self.pool, self.conn
        params = {**(extra or {}), "name": self.tool, "arguments": arguments}
        pool._enter(conn)
        try:
            result = await conn.call_on(self.leg, params, progress, origin, f"{conn.name}/{self.tool}")
        finally:
            pool._leave(conn)
        pool.on_call_result(conn.name, result)
        return result


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """Upstream names added, removed and changed by a config reload."""

    added: list[str]
    removed: list[str]
    changed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def require_tool(catalog: Catalog, tool: str, snapshot: Catalog | None = None) -> ToolEntry:
    """The tool `catalog` exposes as `tool`, else `unknown_tool` naming similar tools and a snapshot that had it."""
    entry = catalog.tool(tool)
    if entry is not None and not entry.hidden:
        return entry
    if snapshot is not None and snapshot.is_snapshot and snapshot.tool(tool) is not None:
        raise Fault(
            "unknown_tool",
            f"{catalog.server} no longer has tool {tool!r} (a snapshot from {age_text(snapshot.age())} ago listed it, "
            "the running server does not); search again with catalog_search_tools",
        )
    names = [t.name for t in catalog.exposed_tools]
    near = [name for name in names if tool.lower() in name.lower()][:5]
    guess = closest(tool, names)
    hint = f"; did you mean {guess!r}?" if guess else f"; similar: {', '.join(near)}" if near else ""
    hint += f"; see catalog_list_tools(server={catalog.server!r})"
    raise Fault("unknown_tool", f"{catalog.server} has no tool {tool!r}{hint}")


def _running(conn: UpstreamConnection) -> bool:
    """True while the upstream or one of its per-client sessions still runs."""
    return conn.state in (State.READY, State.STARTING) or conn.clients.live > 0
