"""The named indexes of one aggregator process.

`default` (memory) always exists. Persistent indexes live at
`<data_dir>/indexes/<name>.sqlite3`; nothing is listed or read at start-up: a name
not open yet is looked up on disk when first used, and opened then. The data
directory is created only when the first sqlite index is. All methods are
thread-safe (tool handlers call them from worker threads).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from aggregator.textindex.engine import TextIndex
from aggregator.textindex.memory import MemoryIndex
from aggregator.textindex.tokenizer import TokenizerConfig

DEFAULT_INDEX = "default"
BACKENDS = ("memory", "sqlite")
INDEX_DIR = "indexes"
INDEX_SUFFIX = ".sqlite3"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class TextIndexError(Exception):
    """A refusal whose message is the `error` string the caller sees."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_index_name(name: str) -> None:
    if _NAME.fullmatch(name) is None:
        raise TextIndexError(
            f"Invalid index name: {name!r} (use 1 to 64 letters, digits, '_' or '-': ^[A-Za-z0-9_-]{{1,64}}$)"
        )


class IndexRegistry:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._indexes: dict[str, TextIndex] = {DEFAULT_INDEX: MemoryIndex(DEFAULT_INDEX, TokenizerConfig())}

    def path_for(self, name: str) -> Path:
        check_index_name(name)
        return self.data_dir / INDEX_DIR / f"{name}{INDEX_SUFFIX}"

    def create(self, name: str, backend: str, config: TokenizerConfig) -> TextIndex:
        """A new empty index; refuses a bad name or backend and a name taken in memory or on disk."""
        path = self.path_for(name)
        if backend not in BACKENDS:
            raise TextIndexError(f"Unknown backend: {backend} (use one of: {', '.join(BACKENDS)})")
        with self._lock:
            if name in self._indexes or path.exists():
                raise TextIndexError(f"Index already exists: {name}")
            index: TextIndex
            if backend == "memory":
                index = MemoryIndex(name, config)
            else:
                from aggregator.textindex.sqlite import IndexFileExists, SqliteIndex  # sqlite3: 0.9 MB RSS

                try:
                    index = SqliteIndex.create(name, path, config)
                except IndexFileExists:
                    raise TextIndexError(f"Index already exists: {name}") from None
            self._indexes[name] = index
            return index

    def opened(self, name: str) -> TextIndex | None:
        """The index `name` if it is open already: no disk access, safe on the event loop."""
        with self._lock:
            return self._indexes.get(name)

    def get(self, name: str) -> TextIndex:
        """The open index `name`, opening its file on first use; `Index not found: <name>` else."""
        path = self.path_for(name)
        with self._lock:
            found = self._indexes.get(name)
            if found is not None:
                return found
            if not path.is_file():
                raise TextIndexError(f"Index not found: {name}")
            from aggregator.textindex.sqlite import IndexFileError, SqliteIndex  # on first use (issue 24)

            try:
                index = SqliteIndex.open(name, path)
            except IndexFileError as exc:
                raise TextIndexError(f"Index could not be opened: {name}: {exc}") from exc
            self._indexes[name] = index
            return index

    def open_names(self) -> list[str]:
        """Names of the indexes open in this process, sorted."""
        with self._lock:
            return sorted(self._indexes)

    def close(self) -> None:
        """Close every persistent index; they reopen lazily if used again."""
        with self._lock:
            for name in sorted(self._indexes):
                if self._indexes[name].backend != "memory":
                    self._indexes.pop(name).close()
