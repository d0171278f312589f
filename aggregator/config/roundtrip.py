"""Writing config files without losing what the user wrote: backups, atomic replace, round trips.

aggregator.yaml is edited with ruamel.yaml's round-trip mode (comments, order and quoting kept);
a client's TOML with tomlkit; a client's JSON is rewritten whole (its backup keeps the original
byte for byte).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.config.errors import ConfigError

if TYPE_CHECKING:  # ruamel is imported on first use: `serve` never edits a file (issue 24, start-up)
    from ruamel.yaml import YAML

__all__ = ["backup", "merge_servers_yaml", "write_atomic"]


def backup(path: Path) -> Path:
    """Copy `path` beside itself as NAME.bak (NAME.bak.2, ... if taken); returns the copy."""
    candidate, number = path.with_name(path.name + ".bak"), 2
    while candidate.exists():
        candidate, number = path.with_name(f"{path.name}.bak.{number}"), number + 1
    shutil.copy2(path, candidate)
    return candidate


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        if path.exists():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
