"""A progress line on stderr for long CLI work, only when stderr is a terminal.

Piped or captured (tests, CI, a client reading our stdio), nothing extra is written. The line is
transient: it disappears when the work ends, leaving the command's real output alone.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["Advance", "ProgressFn", "progress_line", "upstream_progress"]

Advance = Callable[[str], None]
"""Report one item done (its label)."""


@contextmanager
def progress_line(description: str, total: int | None, stream: TextIO | None = None) -> Iterator[Advance]:
    """A spinner (and a count of `total` when known) on `stream` (stderr) while the block runs."""
    stream = getattr(sys.stderr, "unescaped", sys.stderr) if stream is None else stream  # it draws with escapes
    if not stream.isatty():
        yield lambda _label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as progress:
        task = progress.add_task(description, total=total)

        def advance(label: str) -> None:
            progress.update(task, advance=1, description=f"{description}: {label} done")

        yield advance


ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""An upstream's progress notification: (progress, total or None, message or None)."""


@contextmanager
def upstream_progress(description: str, stream: TextIO | None = None) -> Iterator[ProgressFn | None]:
    """A bar drawn from an upstream's progress notifications on `stream` (stderr) while the block runs.

    None when the stream is not a terminal: nothing is drawn and nothing else changes.
    """
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description, total=None)

        async def report(progress: float, total: float | None, message: str | None) -> None:
            text = f"{description}: {message}" if message else description
            bar.update(task, completed=progress, total=total, description=text)

        yield report
