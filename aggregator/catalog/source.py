"""What the tool families need from the upstream side, as a protocol.

`aggregator.upstream.pool.UpstreamPool` implements it; unit tests may use a
small in-memory implementation. Keeping tools on this narrow surface keeps the
arrows pointing one way: tools → catalog/pool, never back.
"""

from __future__ import annotations

from typing import Protocol

from aggregator.catalog.model import Catalog
from aggregator.catalog.store import CatalogStore


class CatalogSource(Protocol):
    @property
    def store(self) -> CatalogStore:
        """Current catalogs (live or from snapshots), and change events."""
        ...

    def upstream_names(self) -> list[str]:
        """Every configured upstream, sorted."""
        ...

    def resolve(self, name: str) -> str | None:
        """The configured upstream whose name equals `name` ignoring case, else None."""
        ...

    def metadata(self, name: str) -> tuple[str, list[str]]:
        """The operator's (description, capabilities) for a configured upstream."""
        ...

    def in_backoff(self, name: str) -> bool:
        """True while the upstream is inside its crash backoff window."""
        ...

    async def ensure_catalog(self, name: str) -> Catalog:
        """The upstream's current catalog: live, or a snapshot (`is_snapshot`), else started (single flight).

        Raises `aggregator.faults.Fault` (`upstream_unavailable`, `timeout`, `unknown_server`).
        """
        ...
