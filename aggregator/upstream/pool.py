"""All upstreams: lookup, parallel start, and a shutdown that leaves no child behind.

The pool owns one task group; every upstream's owner task, catalog refresh and
eager start lives in it, so leaving `UpstreamPool.running()` ends them all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from aggregator.catalog.model import Catalog
from aggregator.catalog.store import CatalogStore
from aggregator.config import AggregatorConfig
from aggregator.faults import Fault
from aggregator.log import get_logger, register_secrets
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


def secret_values(config: AggregatorConfig) -> list[str]:
    """Every configured value that may be a secret: upstream env and header values."""
    return [
        value
        for upstream in config.upstreams.values()
        for value in (*upstream.env.values(), *upstream.headers.values())
    ]


class UpstreamPool:
    """Implements `aggregator.catalog.source.CatalogSource` over real connections."""

    def __init__(self, config: AggregatorConfig, task_group: anyio.abc.TaskGroup) -> None:
        self.config = config
        register_secrets(secret_values(config))
        self._store = CatalogStore()
        self._connections = {
            name: UpstreamConnection(upstream, self._store, task_group) for name, upstream in config.upstreams.items()
        }
        self._by_folded = {name.casefold(): name for name in self._connections}
        self._tg = task_group

    @classmethod
    @asynccontextmanager
    async def running(cls, config: AggregatorConfig) -> AsyncIterator[UpstreamPool]:
        """A pool whose upstreams are all stopped (process groups included) on exit."""
        async with anyio.create_task_group() as tg:
            pool = cls(config, tg)
            try:
                pool._start_eager()
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
        return await self.connection(server).call_tool(tool, arguments, progress)

    async def start_all(self, names: list[str] | None = None) -> dict[str, Fault | None]:
        """Start upstreams concurrently; each name maps to None (ready) or the Fault it raised."""
        outcome: dict[str, Fault | None] = {}

        async def start(name: str) -> None:
            try:
                await self.ensure_catalog(name)
                outcome[name] = None
            except Fault as fault:
                outcome[name] = fault

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

    def _start_eager(self) -> None:
        for name, conn in self._connections.items():
            if conn.config.start == "eager":
                self._tg.start_soon(self._start_quietly, name, name=f"eager-{name}")

    async def _start_quietly(self, name: str) -> None:
        try:
            await self.ensure_catalog(name)
        except Fault as fault:
            log.warning("eager start failed", upstream=name, reason=fault.message)

    async def _shutdown(self, tg: anyio.abc.TaskGroup) -> None:
        """Ask every owner task to stop; cancel what has not stopped after a grace period."""
        for conn in self._connections.values():
            conn.request_stop()
        with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS, shield=True):
            while any(conn.state in (State.READY, State.STARTING) for conn in self._connections.values()):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
