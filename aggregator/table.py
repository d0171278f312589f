"""Plain-text tables for the command line."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def count(number: int, noun: str, plural: str | None = None) -> str:
    """`1 tool`, `2 tools` (`plural` when adding an s is wrong)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
    """Columns padded to their widest cell (the last one left ragged), a dashed rule under the header.

    `right` holds the indexes of right-aligned columns (numbers).
    """
    widths = [max([len(header[i]), *(len(row[i]) for row in rows)]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell if i == len(cells) - 1 else cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])
