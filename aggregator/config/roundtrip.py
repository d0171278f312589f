"""Writing config files without losing what the user wrote: backups, atomic replace, round trips.

aggregator.yaml is edited with ruamel.yaml's round-trip mode (comments, order and quoting kept);
a client's TOML with tomlkit; a client's JSON is rewritten whole (its backup keeps the original
byte for byte).

Every write to a user's file is a compare-and-swap: the caller says what it read, and the file is
re-read just before the rename; if another program (a running editor or client) wrote it since,
nothing is written and `FileChanged` says so. A symlink is written through to its target (the
link stays a link), and the target keeps its mode and, where permitted, its owner.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.config.config_file import read_text
from aggregator.config.errors import ConfigError
from aggregator.files import write_atomically

if TYPE_CHECKING:  # ruamel is imported on first use: `serve` never edits a file (issue 24, start-up)
    from ruamel.yaml import YAML

__all__ = ["FileChanged", "backup", "current_text", "merge_servers_yaml", "write_atomic"]


class FileChanged(ConfigError):
    """The file is no longer what the caller read: another program wrote it meanwhile."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            str(path),
            None,
            "another program changed the file while aggregator was editing it; nothing was written",
            "run the command again (close the client first if it keeps rewriting the file)",
        )


def backup(path: Path) -> Path:
    """Copy `path` beside itself as NAME.bak (NAME.bak.2, ... if taken); returns the copy."""
    candidate, number = path.with_name(path.name + ".bak"), 2
    while candidate.exists():
        candidate, number = path.with_name(f"{path.name}.bak.{number}"), number + 1
    shutil.copy2(path, candidate)
    return candidate


def current_text(path: Path) -> str | None:
    """The file's text as `read_text` gives it, None when it does not exist (through symlinks)."""
    if not path.exists():
        return None
    return read_text(path)


def write_atomic(path: Path, content: str | bytes, *, expected: str | None) -> None:
    """Replace `path` with `content` in one step, if it still holds `expected` (None: no file).

    A reader sees the old file or the new one. Raises `FileChanged` (and writes nothing) when the
    file's text is no longer `expected`.
    """
    target = Path(os.path.realpath(path))  # through symlinks: the link stays, its target changes

    def check(fd: int) -> None:
        _keep_mode_and_owner(fd, target)
        try:
            now = current_text(target)
        except ConfigError:
            raise FileChanged(path) from None
        if now != expected:
            raise FileChanged(path)

    payload = content.encode("utf-8") if isinstance(content, str) else content
    write_atomically(target, payload, before_replace=check)


def _keep_mode_and_owner(fd: int, target: Path) -> None:
    try:
        stat = os.stat(target)
    except FileNotFoundError:
        return
    os.fchmod(fd, stat.st_mode & 0o7777)
    with contextlib.suppress(OSError):  # not ours to give away: the file stays ours, as an editor leaves it
        os.fchown(fd, stat.st_uid, stat.st_gid)


def _yaml() -> YAML:
    from ruamel.yaml import YAML

    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def merge_servers_yaml(text: str, source: str, section: str, additions: Mapping[str, Mapping[str, Any]]) -> str:
    """`text` with `additions` appended under `section`, everything else as the user wrote it."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError

    yaml = _yaml()
    try:
        data = yaml.load(text) if text.strip() else None
    except YAMLError as exc:
        raise ConfigError(source, None, f"cannot edit the YAML ({type(exc).__name__})", "fix the file first") from None
    if data is None:
        data = CommentedMap()
    if not isinstance(data, dict):
        raise ConfigError(source, None, "the top level is not a mapping", "fix the file first")
    servers = data.get(section)
    if servers is None:
        servers = data[section] = CommentedMap()
    for name, entry in additions.items():
        servers[name] = _plain(entry)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _plain(value: Any) -> Any:
    """Nested dicts as CommentedMaps (block style), so ruamel writes them like the rest of the file."""
    from ruamel.yaml.comments import CommentedMap

    if isinstance(value, Mapping):
        mapped = CommentedMap()
        for key, item in value.items():
            mapped[key] = _plain(item)
        return mapped
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
