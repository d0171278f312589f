"""All upstreams: lookup, parallel start, and a shutdown that leaves no child behind.

The pool owns one task group; every upstream's owner task, catalog refresh and
eager start lives in it, so leaving `UpstreamPool.running()` ends them all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from aggregator.catalog.model import Catalog
from aggregator.catalog.store import CatalogStore
from aggregator.config import AggregatorConfig
from aggregator.config.watch import watch_config
from aggregator.faults import Fault
from aggregator.log import get_logger
from aggregator.upstream.connection import ProgressFn, State, UpstreamConnection

log = get_logger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0


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


class UpstreamPool:
    """Implements `aggregator.catalog.source.CatalogSource` over real connections."""

    def __init__(self, config: AggregatorConfig, task_group: anyio.abc.TaskGroup) -> None:
        self.config = config
        self._store = CatalogStore()
        self._connections = {
            name: UpstreamConnection(upstream, self._store, task_group) for name, upstream in config.upstreams.items()
        }
        self._by_folded = {name.casefold(): name for name in self._connections}
        self._tg = task_group
        self._busy: dict[UpstreamConnection, int] = {}  # calls in flight, so a replaced upstream can finish them
        self._retiring: set[UpstreamConnection] = set()
        self._reconfigure_listeners: list[Callable[[ConfigDiff], None]] = []
        self._closing = False

    @classmethod
    @asynccontextmanager
    async def running(cls, config: AggregatorConfig, *, watch: Path | None = None) -> AsyncIterator[UpstreamPool]:
        """A pool whose upstreams are all stopped (process groups included) on exit.

        With `watch`, edits of that config file (and SIGHUP) are applied while it runs (`apply_config`).
        """
        async with anyio.create_task_group() as tg:
            pool = cls(config, tg)
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
        return await self.connection(name).ensure_catalog()

    # ------------------------------------------------------------ the rest

    def connection(self, name: str) -> UpstreamConnection:
        try:
            return self._connections[name]
        except KeyError:
            known = ", ".join(self._connections) or "none configured"
            raise Fault("unknown_server", f"no upstream named {name!r} (known: {known})") from None

    async def call_tool(
        self, server: str, tool: str, arguments: Mapping[str, Any], progress: ProgressFn | None = None
    ) -> dict[str, Any]:
        conn = self.connection(server)
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            return await conn.call_tool(tool, arguments, progress)
        finally:
            self._busy[conn] -= 1
            if not self._busy[conn]:
                del self._busy[conn]

    async def start_all(
        self, names: list[str] | None = None, on_done: Callable[[str], None] | None = None
    ) -> dict[str, Fault | None]:
        """Start upstreams concurrently; each name maps to None (ready) or the Fault it raised.

        `on_done(name)` is called as each one settles (a CLI progress line).
        """
        outcome: dict[str, Fault | None] = {}

        async def start(name: str) -> None:
            try:
                await self.ensure_catalog(name)
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
        )

    def statuses(self) -> list[UpstreamStatus]:
        return [self.status(name) for name in self._connections]

    def _start_eager(self, names: Iterable[str] | None = None) -> None:
        for name in self._connections if names is None else names:
            if self._connections[name].config.start == "eager":
                self._tg.start_soon(self._start_quietly, name, name=f"eager-{name}")

    async def _start_quietly(self, name: str) -> None:
        try:
            await self.ensure_catalog(name)
        except Fault as fault:
            log.warning("eager start failed", upstream=name, reason=fault.message)

    async def _shutdown(self, tg: anyio.abc.TaskGroup) -> None:
        """Ask every owner task to stop; cancel what has not stopped after a grace period."""
        self._closing = True  # a config reload from here on would start what we are stopping
        everyone = [*self._connections.values(), *self._retiring]
        for conn in everyone:
            conn.request_stop()
        with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS, shield=True):
            while any(conn.state in (State.READY, State.STARTING) for conn in everyone):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()

    # ------------------------------------------------------------ reconfiguration (hot reload)

    def on_reconfigure(self, listener: Callable[[ConfigDiff], None]) -> None:
        """Call `listener` with each applied `ConfigDiff` (the server updates exposure and search)."""
        self._reconfigure_listeners.append(listener)

    def apply_config(self, config: AggregatorConfig) -> ConfigDiff:
        """Make the running pool match `config`.

        New upstreams are added; removed ones stop (process group included) once their calls in
        flight are done; changed ones are replaced by a fresh connection that starts on the next
        need (the old one finishes its calls, then stops); unchanged ones are not touched.
        """
        if self._closing:
            return ConfigDiff([], [], [])
        old = self.config.upstreams
        diff = ConfigDiff(
            added=sorted(set(config.upstreams) - set(old)),
            removed=sorted(set(old) - set(config.upstreams)),
            changed=sorted(n for n in set(old) & set(config.upstreams) if old[n] != config.upstreams[n]),
        )
        self.config = config
        for name in [*diff.removed, *diff.changed]:
            self._retire(self._connections.pop(name))
        for name in [*diff.added, *diff.changed]:
            self._connections[name] = UpstreamConnection(config.upstreams[name], self._store, self._tg)
        self._connections = {name: self._connections[name] for name in config.upstreams}  # name order
        self._by_folded = {name.casefold(): name for name in self._connections}
        self._start_eager([*diff.added, *diff.changed])
        if diff:
            log.info("upstreams reconfigured", added=diff.added, removed=diff.removed, changed=diff.changed)
        for listener in list(self._reconfigure_listeners):
            listener(diff)
        return diff

    def _retire(self, conn: UpstreamConnection) -> None:
        """Take `conn` out of service now; stop it once its calls in flight are done (or time out)."""
        conn.detach_store()
        self._store.drop(conn.name)
        self._retiring.add(conn)

        async def stop_when_idle() -> None:
            with anyio.move_on_after(conn.config.timeouts.call):
                while self._busy.get(conn):
                    await anyio.sleep(0.05)
            conn.request_stop()
            self._retiring.discard(conn)

        self._tg.start_soon(stop_when_idle, name=f"retire-{conn.name}")


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """Upstream names added, removed and changed by a config reload."""

    added: list[str]
    removed: list[str]
    changed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)
