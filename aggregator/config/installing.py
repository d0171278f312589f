"""A client's config rewritten so that one `aggregator` entry fronts its servers, and back again.

`install` keeps the client's original bytes in ``NAME.aggregator-backup-HASH`` beside the file,
where HASH names the content install wrote, and that content in ``NAME.aggregator-installed-HASH``.
`uninstall` puts the original back byte for byte when the file is still what install wrote; when
the user or the client changed it since, it merges three ways (`merge_back`): the user's latest
file, minus what install changed in its servers. An old backup never overwrites newer edits. JSON
files are rewritten whole (their comments live on in the backup); Codex's TOML is edited with
tomlkit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregator.config.client_files import ClientFile, parse_document
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
    "entry_args",
    "find_backup",
    "installed_path",
    "merge_back",
    "replace_servers",
    "rewrite",
    "servers_in",
]

ABSENT = ".absent"  # suffix of a backup standing for "there was no file"
_MARKER = ".aggregator-backup-"
_INSTALLED = ".aggregator-installed-"
_MISSING = object()


def aggregator_command() -> list[str]:
    """The absolute command that starts this aggregator: `aggregator` on PATH, its console script, else
    ``python -m aggregator`` (see `launcher_command`)."""
    return launcher_command()


def entry_args(config: Path, *, shared: bool = True) -> list[str]:
    """The subcommand of an installed entry: `connect` (the per-user service every client shares), or
    `serve` (a private aggregator, and private upstreams, for this client alone)."""
    return ["connect" if shared else "serve", "--config", str(config.absolute())]


def aggregator_entry(
    file: ClientFile, config: Path, *, shared: bool = True, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The client's one entry for the aggregator; `env`: variables the imported servers' config refers to
    whose values the client's file held (an mcp-remote entry's token), kept in this file rather than the YAML."""
    command, *args = aggregator_command()
    entry: dict[str, Any] = {"command": command, "args": [*args, *entry_args(config, shared=shared)]}
    if env:
        entry["env"] = dict(env)
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
        import tomlkit  # on first use: `serve` never edits a client's file (issue 24, start-up)

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

    def installed(self, file: Path) -> str | None:
        """What install wrote, if its record is there (backups of older versions have none)."""
        try:
            return installed_path(file, self.installed_hash).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def backup_path(file: Path, installed_hash: str, absent: bool) -> Path:
    return file.with_name(f"{file.name}{_MARKER}{installed_hash}{ABSENT if absent else ''}")


def installed_path(file: Path, installed_hash: str) -> Path:
    return file.with_name(f"{file.name}{_INSTALLED}{installed_hash}")


def find_backup(file: Path, current: str | None = None) -> Backup | None:
    """The backup install left beside `file`: the one made for `current` if any, else the newest."""
    found = []
    for candidate in file.parent.glob(f"{file.name}{_MARKER}*"):
        tail = candidate.name[len(file.name) + len(_MARKER) :]
        absent = tail.endswith(ABSENT)
        found.append(Backup(candidate, tail.removesuffix(ABSENT), absent))
    if not found:
        return None
    made_for = content_hash(current) if current is not None else None
    return max(found, key=lambda b: (b.installed_hash == made_for, b.path.stat().st_mtime_ns, b.path.name))


def merge_back(original: str, installed: str | None, current: str, file: ClientFile) -> str:
    """Uninstall of a file changed since install: `current` minus what install changed in its servers.

    Per server name: one the user added, changed or removed since install (it differs from what
    install wrote) keeps the user's version; one untouched since install gets the original's
    version back (the servers install moved return); the aggregator entry goes. Everything outside
    the servers section is `current`'s. Without `installed` (an older backup), every server in
    `current` counts as the user's, except the aggregator entry.
    """
    now = servers_in(parse_document(current, file), file)
    before = servers_in(parse_document(original, file), file) if original.strip() else {}
    if installed is None:
        wrote = {name: entry for name, entry in now.items() if _is_aggregator(entry)}
    else:
        wrote = servers_in(parse_document(installed, file), file)
    merged: dict[str, Any] = {}
    for name in [*before, *(n for n in now if n not in before)]:
        if now.get(name, _MISSING) != wrote.get(name, _MISSING):
            if name in now and not _is_aggregator(now[name]):
                merged[name] = now[name]
        elif name in before:
            merged[name] = before[name]
    return replace_servers(current, file, merged)


def _is_aggregator(entry: Any) -> bool:
    return isinstance(entry, Mapping) and is_aggregator_entry(entry)
