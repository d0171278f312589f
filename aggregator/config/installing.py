"""A client's config rewritten so that one `aggregator` entry fronts its servers, and back again.

`install` keeps the client's original bytes in ``NAME.aggregator-backup-HASH`` beside the file,
where HASH names the content install wrote: `uninstall` puts the original back byte for byte
when the file is still what install wrote; when the client changed it since, it removes the
aggregator entry and restores the original servers, keeping the later changes. JSON files are
rewritten whole (their comments live on in the backup); Codex's TOML is edited with tomlkit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from aggregator.config.clients import ClientFile, parse_document
from aggregator.config.importing import is_aggregator_entry
from aggregator.config.launcher import launcher_command
from aggregator.config.models import RESERVED_NAME

__all__ = [
    "ABSENT",
    "Backup",
    "aggregator_command",
    "aggregator_entry",
    "backup_path",
    "content_hash",
    "find_backup",
    "replace_servers",
    "restore_text",
    "rewrite",
    "servers_in",
]

ABSENT = ".absent"  # suffix of a backup standing for "there was no file"
_MARKER = ".aggregator-backup-"


def aggregator_command() -> list[str]:
    """The absolute command that starts this aggregator: `aggregator` on PATH, its console script, else
    ``python -m aggregator`` (see `launcher_command`)."""
    return launcher_command()


def aggregator_entry(file: ClientFile, config: Path) -> dict[str, Any]:
    command, *args = aggregator_command()
    entry: dict[str, Any] = {"command": command, "args": [*args, "serve", "--config", str(config.absolute())]}
    if file.client == "vscode":
        entry = {"type": "stdio", **entry}
    return entry


def servers_in(data: Any, file: ClientFile) -> dict[str, Any]:
    section: Any = data
    for key in file.section:
        section = section.get(key) if isinstance(section, Mapping) else None
    return dict(section) if isinstance(section, Mapping) else {}


def rewrite(text: str, file: ClientFile, keep: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """`text` with its servers replaced by the aggregator entry plus the servers in `keep`."""
    servers = {RESERVED_NAME: dict(entry), **{k: v for k, v in keep.items() if k != RESERVED_NAME}}
    return replace_servers(text, file, servers)


def replace_servers(text: str, file: ClientFile, servers: Mapping[str, Any]) -> str:
    """`text` with the servers section set to `servers`; the rest of the document as parsed."""
    if file.format == "toml":
        doc = tomlkit.parse(text)
        table = tomlkit.table(is_super_table=True)
        for name, value in servers.items():
            table[name] = value
        doc[file.section[0]] = table
        return tomlkit.dumps(doc)
    data = parse_document(text, file) if text.strip() else {}
    node = data
    for key in file.section[:-1]:
        node = node.setdefault(key, {})
    node[file.section[-1]] = dict(servers)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Backup:
    path: Path
    installed_hash: str  # the hash of what install wrote
    absent: bool  # there was no file before install


def backup_path(file: Path, installed_hash: str, absent: bool) -> Path:
    return file.with_name(f"{file.name}{_MARKER}{installed_hash}{ABSENT if absent else ''}")


def find_backup(file: Path) -> Backup | None:
    """The backup install left beside `file`, if any."""
    for candidate in sorted(file.parent.glob(f"{file.name}{_MARKER}*")):
        tail = candidate.name[len(file.name) + len(_MARKER) :]
        absent = tail.endswith(ABSENT)
        return Backup(candidate, tail.removesuffix(ABSENT), absent)
    return None


def restore_text(current: str, original: str, file: ClientFile) -> str:
    """The file changed since install: drop the aggregator entry, put the original servers back."""
    keep = {
        name: entry
        for name, entry in servers_in(parse_document(current, file), file).items()
        if not (isinstance(entry, Mapping) and is_aggregator_entry(entry))
    }
    restored = {**(servers_in(parse_document(original, file), file) if original.strip() else {}), **keep}
    return replace_servers(current, file, restored)
