"""Per-upstream catalogs and the events that announce their changes.

The store is the one place catalogs live. Upstream connections put a fresh
catalog in when they list one and take it out when they stop; the search index,
direct exposure and introspection listen to the changes instead of polling.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.catalog.model import Catalog

CatalogListener = Callable[[str, Catalog | None], None]
"""Called with (server, new catalog) on load or change, (server, None) when dropped."""


class CatalogStore:
    def __init__(self) -> None:
        self._catalogs: dict[str, Catalog] = {}
        self._listeners: list[CatalogListener] = []

    def get(self, server: str) -> Catalog | None:
        return self._catalogs.get(server)

    def loaded(self) -> dict[str, Catalog]:
        """A snapshot of every loaded catalog, by server name (sorted)."""
        return {name: self._catalogs[name] for name in sorted(self._catalogs)}

    def put(self, catalog: Catalog) -> None:
        self._catalogs[catalog.server] = catalog
        self._notify(catalog.server, catalog)

    def drop(self, server: str) -> None:
        if self._catalogs.pop(server, None) is not None:
            self._notify(server, None)

    def subscribe(self, listener: CatalogListener) -> Callable[[], None]:
        """Register a listener; it is called synchronously. Returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, server: str, catalog: Catalog | None) -> None:
        for listener in list(self._listeners):
            listener(server, catalog)
