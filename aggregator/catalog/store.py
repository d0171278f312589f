"""Per-upstream catalogs and the events that announce their changes.

The store is the one place catalogs live, and the one place that knows which
catalog of an upstream is current: the live one its running connection
listed, or else its snapshot (an earlier listing read from disk at start-up,
or the last live listing once the upstream stopped or crashed). Upstream
connections put a fresh catalog in when they list one and drop it when they
stop; the search index, direct exposure and introspection listen to the
changes instead of polling.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from aggregator.catalog.model import Catalog

CatalogListener = Callable[[str, Catalog | None], None]
"""Called with (server, new current catalog) on load or change, (server, None) when none is left."""


class CatalogStore:
    def __init__(self, snapshot_servers: Collection[str] = ()) -> None:
        """`snapshot_servers`: the upstreams whose live catalogs are kept as snapshots when they stop."""
        self._catalogs: dict[str, Catalog] = {}  # the current catalog of each upstream
        self._snapshots: dict[str, Catalog] = {}  # the latest snapshot of each upstream (origin "snapshot")
        self._snapshot_servers = frozenset(snapshot_servers)
        self._listeners: list[CatalogListener] = []

    def get(self, server: str) -> Catalog | None:
        """The current catalog: live, else a snapshot, else None."""
        return self._catalogs.get(server)

    def live(self, server: str) -> Catalog | None:
        """The catalog the running upstream listed, or None (a snapshot does not count)."""
        catalog = self._catalogs.get(server)
        return catalog if catalog is not None and not catalog.is_snapshot else None

    def snapshot(self, server: str) -> Catalog | None:
        """The latest snapshot of `server` (also kept while its live catalog is current)."""
        return self._snapshots.get(server)

    def loaded(self) -> dict[str, Catalog]:
        """Every current catalog, live or snapshot, by server name (sorted)."""
        return {name: self._catalogs[name] for name in sorted(self._catalogs)}

    def put(self, catalog: Catalog) -> None:
        """A live listing: it becomes current and, for snapshot servers, the latest snapshot."""
        server = catalog.server
        self._catalogs[server] = catalog
        if server in self._snapshot_servers:
            self._snapshots[server] = catalog.as_snapshot()
        self._notify(server, catalog)

    def seed(self, catalog: Catalog) -> None:
        """A snapshot read from disk: current unless a live catalog is already there."""
        snapshot = catalog.as_snapshot()
        self._snapshots[snapshot.server] = snapshot
        if self.live(snapshot.server) is None:
            self._catalogs[snapshot.server] = snapshot
            self._notify(snapshot.server, snapshot)

    def drop(self, server: str) -> None:
        """The live catalog is gone (stop, crash): fall back to the snapshot, if any."""
        current = self._catalogs.get(server)
        if current is None or current.is_snapshot:
            return
        fallback = self._snapshots.get(server)
        if fallback is not None:
            self._catalogs[server] = fallback
        else:
            del self._catalogs[server]
        self._notify(server, fallback)

    def forget(self, server: str) -> None:
        """Drop everything known about `server`, its snapshot included (its definition changed)."""
        self._snapshots.pop(server, None)
        if self._catalogs.pop(server, None) is not None:
            self._notify(server, None)

    def subscribe(self, listener: CatalogListener) -> Callable[[], None]:
        """Register a listener; it is called synchronously. Returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, server: str, catalog: Catalog | None) -> None:
        for listener in list(self._listeners):
            listener(server, catalog)
