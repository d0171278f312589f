"""The pool's catalog snapshots: seeded into the store at start, each live listing written back.

At construction (and for each upstream a reload adds or changes) the store is seeded from every
valid snapshot, so search, list, describe and introspection answer before anything starts. Each
live listing is written back to disk in a worker thread, off the path of the load and of any call;
writes of one upstream are coalesced (only the latest listing is written).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from aggregator.catalog.model import Catalog
from aggregator.catalog.snapshot import SnapshotDir, fingerprint
from aggregator.catalog.store import CatalogStore
from aggregator.config import ToolFilter, UpstreamConfig


class SnapshotKeeper:
    """Seeds `store` from the snapshots in `snapshots` and writes live listings back.

    `fingerprints` (upstream name -> digest of its definition) is the pool's own dict, which a
    reload updates: only the upstreams in it keep a snapshot.
    """

    def __init__(
        self,
        snapshots: SnapshotDir | None,
        fingerprints: dict[str, str],
        store: CatalogStore,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self.snapshots = snapshots
        self._fingerprints = fingerprints
        self._store = store
        self._tg = task_group
        self.notes: dict[str, str] = {}  # why an upstream's snapshot was not used (bad file, stale)
        self._unwritten: dict[str, Catalog] = {}  # the latest live listing not yet written, per upstream
        self._writers: set[str] = set()  # upstreams whose writer task runs
        self.writes: dict[str, Path | None] = {}  # the outcome of each upstream's last write

    def seed(self, upstreams: Mapping[str, UpstreamConfig], fingerprints: Mapping[str, str]) -> None:
        """Put every valid snapshot of these upstreams in the store (marked as a snapshot, with its age)."""
        if self.snapshots is None:
            return
        for name, digest in fingerprints.items():
            upstream = upstreams[name]
            outcome = self.snapshots.read(name, digest, upstream.snapshot_max_age, _hidden_by(upstream.tools))
            if outcome.catalog is not None:
                self._store.seed(outcome.catalog)
            elif outcome.problem or outcome.stale:
                self.notes[name] = outcome.problem or outcome.stale or ""

    def on_disk(self, upstream: UpstreamConfig) -> Catalog | None:
        """The valid snapshot on disk for this definition of an upstream (read only, nothing seeded)."""
        if self.snapshots is None or not upstream.snapshots:
            return None
        hide = _hidden_by(upstream.tools)
        return self.snapshots.read(upstream.name, fingerprint(upstream), upstream.snapshot_max_age, hide).catalog

    def on_catalog(self, server: str, catalog: Catalog | None) -> None:
        """A live listing arrived: have it written to its snapshot file in the background."""
        if catalog is None or catalog.is_snapshot or server not in self._fingerprints:
            return
        self._unwritten[server] = catalog
        if server not in self._writers:
            self._writers.add(server)
            self._tg.start_soon(self._write, server, name=f"snapshot-{server}")

    async def _write(self, server: str) -> None:
        """Write the latest listing of `server` until none is left (a burst of listings writes twice at most)."""
        assert self.snapshots is not None
        try:
            while (catalog := self._unwritten.pop(server, None)) is not None:
                path = await anyio.to_thread.run_sync(self.snapshots.write, catalog, self._fingerprints[server])
                self.writes[server] = path
                if path is not None:
                    self.notes.pop(server, None)
        finally:
            self._writers.discard(server)

    @property
    def writing(self) -> bool:
        """True while a snapshot write is under way."""
        return bool(self._writers)

    async def flush(self) -> None:
        """Wait until every snapshot write under way has finished."""
        while self._writers:
            await anyio.sleep(0.01)


def _hidden_by(tools: ToolFilter) -> Callable[[str], bool]:
    return lambda name: not tools.allows(name)
