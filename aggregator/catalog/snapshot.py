"""Catalog snapshots on disk: `<data dir>/catalogs/<upstream>.<fingerprint>.json` (DESIGN §3).

A snapshot is the last catalog an upstream listed (tools, prompts, resources,
resource templates, its serverInfo and `instructions`), the time of that
listing, and a fingerprint of the upstream's definition. A restarted
aggregator serves search, list, describe and introspection from it without
spawning anything; a live listing replaces it.

Rules that keep bad input from losing anything:
- the file is versioned JSON; a corrupt, truncated, foreign-version, misnamed
  or unreadable file is ignored with one warning (and rewritten by the next
  live listing);
- the fingerprint covers transport, command, args, url, cwd and the *names* of
  env vars and headers, never their values, and only as a SHA-256 digest: a
  changed definition invalidates the snapshot. The file name carries the first 16 hex digits of
  the fingerprint, so two configs that give one name to different servers keep a snapshot each
  instead of overwriting each other's; a write removes that upstream's files unused for
  `DEFAULT_MAX_AGE` (and the old unkeyed `<upstream>.json`);
- writes go to a temporary file in the same directory, are fsynced, then
  `os.replace`d over the old file: two processes writing the same snapshot
  leave one whole file or the other, never a torn one;
- an unwritable data dir logs one warning per process and nothing else.

Entries are stored in wire form and cleaned again on read with the same
cleaners a live listing uses, so a snapshot can never smuggle in an entry a
live listing would have dropped. The allow/deny filter is applied on read
(`hide`), so changing it does not invalidate a snapshot.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.catalog.model import (
    Catalog,
    MalformedEntry,
    PromptEntry,
    ResourceEntry,
    ResourceTemplateEntry,
    clean_prompt,
    clean_resource,
    clean_resource_template,
    clean_tool,
    sorted_unique,
)
from aggregator.files import read_regular_file, write_atomically
from aggregator.log import get_logger
from aggregator.safetext import scrub

if TYPE_CHECKING:
    from aggregator.config import UpstreamConfig

log = get_logger(__name__)

FORMAT = "aggregator-catalog-snapshot"
VERSION = 1
DEFAULT_MAX_AGE = 30 * 24 * 3600.0
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
SUBDIR = "catalogs"


class SnapshotError(ValueError):
    """A snapshot file that cannot be used; the message says why."""


# ---------------------------------------------------------------- fingerprint


def fingerprint(upstream: UpstreamConfig) -> str:
    """A digest of what defines an upstream: values of env vars and headers are left out.

    Env and header *values* are secrets or machine details; their names say
    enough about the definition. Metadata (description, filters, timeouts,
    exposure) does not change what the upstream lists, so it is not part of it.
    """
    definition = {
        "transport": upstream.transport,
        "command": upstream.command,
        "args": list(upstream.args),
        "url": upstream.url,
        "cwd": upstream.cwd,
        "env": sorted(upstream.env),
        "headers": sorted(name.lower() for name in upstream.headers),
    }
    text = json.dumps(definition, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# ---------------------------------------------------------------- encoding


def encode(catalog: Catalog, digest: str) -> dict[str, Any]:
    """The JSON document of a snapshot of `catalog`."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "server": catalog.server,
        "fingerprint": digest,
        "listed_at": catalog.loaded_at,
        "server_info": dict(catalog.server_info) if catalog.server_info is not None else None,
        "instructions": catalog.instructions,
        "offered": list(catalog.offered) if catalog.offered is not None else None,
        "tools": [dict(tool.wire) for tool in catalog.tools],
        "prompts": [_prompt_wire(p) for p in catalog.prompts],
        "resources": [_resource_wire(r) for r in catalog.resources],
        "resource_templates": [_template_wire(t) for t in catalog.resource_templates],
    }


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if value is not None}


def _prompt_wire(prompt: PromptEntry) -> dict[str, Any]:
    args = [{"name": a.name, "description": a.description, "required": a.required} for a in prompt.arguments]
    return _without_none(
        {"name": prompt.name, "title": prompt.title, "description": prompt.description, "arguments": args}
    )


def _resource_wire(resource: ResourceEntry) -> dict[str, Any]:
    return _without_none(
        {
            "name": resource.name,
            "uri": resource.uri,
            "title": resource.title,
            "description": resource.description,
            "mimeType": resource.mime_type,
        }
    )


def _template_wire(template: ResourceTemplateEntry) -> dict[str, Any]:
    return _without_none(
        {
            "name": template.name,
            "uriTemplate": template.uri_template,
            "title": template.title,
            "description": template.description,
            "mimeType": template.mime_type,
        }
    )


def decode(data: Any, server: str, hide: Callable[[str], bool]) -> tuple[Catalog, str]:
    """(catalog marked as a snapshot, its fingerprint) from a snapshot document, or `SnapshotError`."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError("not a catalog snapshot")
    if data.get("version") != VERSION:
        raise SnapshotError(f"format version {data.get('version')!r}, this aggregator reads {VERSION}")
    if data.get("server") != server:
        raise SnapshotError(f"it holds the catalog of {data.get('server')!r}")
    digest = data.get("fingerprint")
    listed_at = data.get("listed_at")
    if not isinstance(digest, str):
        raise SnapshotError("no fingerprint")
    if isinstance(listed_at, bool) or not isinstance(listed_at, int | float) or not 0 <= listed_at < 1e11:
        raise SnapshotError("no valid listing time")
    server_info = data.get("server_info")
    instructions = data.get("instructions")
    if server_info is not None and not isinstance(server_info, dict):
        raise SnapshotError("server_info is not an object")
    if instructions is not None and not isinstance(instructions, str):
        raise SnapshotError("instructions is not a string")
    offered = data.get("offered")  # absent in snapshots written before it was recorded
    if offered is not None and not (isinstance(offered, list) and all(isinstance(o, str) for o in offered)):
        raise SnapshotError("offered is not a list of strings")
    try:
        catalog = Catalog(
            server=server,
            tools=sorted_unique(clean_tool(server, raw, hidden=hide(raw["name"])) for raw in _list(data, "tools")),
            prompts=sorted_unique(clean_prompt(server, raw) for raw in _list(data, "prompts")),
            resources=sorted_unique(clean_resource(server, raw) for raw in _list(data, "resources")),
            resource_templates=sorted_unique(
                clean_resource_template(server, raw) for raw in _list(data, "resource_templates")
            ),
            loaded_at=float(listed_at),
            server_info=server_info,
            instructions=instructions,
            offered=tuple(offered) if offered is not None else None,
            origin="snapshot",
        )
    except (MalformedEntry, KeyError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"a malformed entry: {exc}") from None
    return catalog, digest


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise SnapshotError(f"{key} is not a list")
    return value


# ---------------------------------------------------------------- the directory


@dataclass(frozen=True, slots=True)
class Outcome:
    """What reading one snapshot gave: a catalog, or why there is none (`missing` is not a problem)."""

    catalog: Catalog | None
    problem: str | None = None  # corrupt, foreign, unreadable: warned once
    stale: str | None = None  # valid but not usable: definition changed, too old, disabled


class SnapshotDir:
    """The `catalogs/` directory under the data dir: read, validate and write snapshots."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / SUBDIR
        self._warned_unwritable = False
        self._warn_lock = threading.Lock()  # writes run in worker threads

    def path(self, server: str, digest: str) -> Path:
        return self.directory / f"{server}.{digest.rpartition(':')[2][:16]}.json"

    def _others(self, server: str, digest: str) -> list[Path]:
        """This upstream's snapshot files for other definitions (and the unkeyed file of old versions)."""
        mine = self.path(server, digest)
        found = [*self.directory.glob(f"{server}.*.json"), self.directory / f"{server}.json"]
        return [path for path in found if path != mine and path.is_file()]

    def _prune(self, server: str, digest: str, now: float | None = None) -> None:
        """Remove this upstream's files of other definitions unused for DEFAULT_MAX_AGE (best effort)."""
        now = time.time() if now is None else now
        for path in self._others(server, digest):
            try:
                if path.name == f"{server}.json" or now - path.stat().st_mtime > DEFAULT_MAX_AGE:
                    path.unlink()
            except OSError:
                continue

    def read(
        self, server: str, digest: str, max_age: float, hide: Callable[[str], bool], now: float | None = None
    ) -> Outcome:
        """The valid snapshot of `server`, or why there is none; logs a warning for a bad file."""
        path = self.path(server, digest)
        try:
            raw = read_regular_file(path, MAX_SNAPSHOT_BYTES)  # a FIFO there must not block initialize
        except FileNotFoundError:
            if self.directory.is_dir() and self._others(server, digest):
                return Outcome(None, stale="definition changed")
            return Outcome(None)
        except OSError as exc:
            return self._bad(server, path, f"unreadable ({exc.strerror or exc})")
        if len(raw) > MAX_SNAPSHOT_BYTES:
            return self._bad(server, path, f"larger than {MAX_SNAPSHOT_BYTES} bytes")
        try:
            data = scrub(json.loads(raw))  # a lone surrogate in a hand-edited or older file
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return self._bad(server, path, f"not valid JSON ({str(exc)[:120]})")
        try:
            catalog, found = decode(data, server, hide)
        except SnapshotError as exc:
            return self._bad(server, path, str(exc))
        if found != digest:
            log.info("snapshot ignored: the upstream's definition changed", upstream=server)
            return Outcome(None, stale="definition changed")
        age = catalog.age(now)
        if age > max_age:
            log.info("snapshot ignored: too old", upstream=server, age_s=round(age), max_age_s=max_age)
            return Outcome(None, stale=f"older than snapshot_max_age ({age / 86400:.1f} days)")
        return Outcome(catalog)

    def _bad(self, server: str, path: Path, reason: str) -> Outcome:
        log.warning("snapshot ignored; the next load rewrites it", upstream=server, path=str(path), reason=reason)
        return Outcome(None, problem=reason)

    def write(self, catalog: Catalog, digest: str) -> Path | None:
        """Write `catalog` atomically; None (and one warning per process) when that is impossible."""
        path = self.path(catalog.server, digest)
        try:
            payload = json.dumps(encode(catalog, digest), ensure_ascii=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            log.warning("snapshot not written: catalog not serializable", upstream=catalog.server, error=str(exc)[:200])
            return None
        try:
            write_atomically(path, payload)
        except OSError as exc:
            with self._warn_lock:
                first, self._warned_unwritable = not self._warned_unwritable, True
            if first:
                log.warning(
                    "catalog snapshots cannot be written; working without them",
                    directory=str(self.directory),
                    error=exc.strerror or str(exc),
                )
            else:
                log.debug("snapshot not written", upstream=catalog.server, error=exc.strerror or str(exc))
            return None
        self._prune(catalog.server, digest)
        return path

    def remove(self, server: str, digest: str) -> None:
        """Delete the snapshot file of `server` for the definition `digest`, if any (best effort)."""
        try:
            self.path(server, digest).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("snapshot not removed", upstream=server, error=exc.strerror or str(exc))
