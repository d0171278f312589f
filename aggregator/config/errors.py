"""`ConfigError` (one line: file, line, key, problem, fix) and `Context`, which says where we are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "Context", "KeyPath", "Lines", "dotted", "one_line"]

KeyPath = tuple[Any, ...]
"""A key path inside the file, e.g. ``("upstreams", "git", "args", 0)``."""

Lines = dict[KeyPath, int]
"""The line (1-based) where each key path starts; empty for JSON."""


class ConfigError(Exception):
    """A broken configuration: one line naming the file, the key and the fix.

    ``str(e)`` is ``FILE[:LINE]: KEY: problem. Fix: ...``. The CLI prints it and exits with code 2.
    Messages never contain environment or header values.
    """

    def __init__(self, file: str, key: str | None, problem: str, fix: str, *, line: int | None = None) -> None:
        self.file = file
        self.key = key
        self.problem = one_line(problem).rstrip(".")
        self.fix = one_line(fix).rstrip(".")
        self.line = line
        super().__init__(self.message)

    @property
    def message(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        key = f" {self.key}:" if self.key else ""
        end = "" if self.fix.endswith(("?", "!")) else "."
        return f"{where}:{key} {self.problem}. Fix: {self.fix}{end}"

    def __str__(self) -> str:
        return self.message


class EntryError(ConfigError):
    """A problem confined to one upstream's entry that this machine or the client decides (an unset variable,
    a VS Code ``${input:...}`` prompt, a transport we do not speak): that upstream is disabled with a warning,
    the others serve. Every other problem refuses the whole file."""


def one_line(text: str) -> str:
    """Whitespace runs become one space; other unprintable characters are shown as ``U+XXXX``."""
    return "".join(c if c.isprintable() else f"U+{ord(c):04X}" for c in " ".join(text.split()))


@dataclass(frozen=True)
class Context:
    """One config text being built: its name, key lines, environment and directory."""

    source: str
    lines: Lines
    environ: Mapping[str, str]
    base_dir: Path | None
    strict: bool = False  # an EntryError refuses the whole file too (checks that want every problem)

    def error(self, path: KeyPath, problem: str, fix: str) -> ConfigError:
        return ConfigError(self.source, dotted(path) or None, problem, fix, line=self._line(path))

    def entry_error(self, path: KeyPath, problem: str, fix: str) -> EntryError:
        return EntryError(self.source, dotted(path) or None, problem, fix, line=self._line(path))

    def _line(self, path: KeyPath) -> int | None:
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(str(p) if not isinstance(p, int) else p for p in path[:end]))
            if line is not None:
                return line
        return None


def dotted(path: KeyPath) -> str:
    """``("upstreams", "a", "args", 0)`` → ``upstreams.a.args[0]``; an unprintable key is quoted."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not str(part).isprintable():
            text += f"[{str(part)!r}]"
        else:
            text += f".{part}" if text else str(part)
    return text
