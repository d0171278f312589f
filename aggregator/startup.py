"""Start-up: import once, with no garbage collection over what was just imported (issue 24).

Importing the SDK, pydantic and our modules allocates a few hundred thousand long-lived objects
(classes, functions, validators). Each allocation burst triggers a collection that walks them and
frees nothing: two full passes of 60-85 ms right after the imports, one of them while the first
requests wait. `settled_imports` turns the collector off while importing, then moves everything
imported into the permanent generation (`gc.freeze`), which no later collection scans.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def settled_imports() -> Iterator[None]:
    """Import inside this block with the collector off; freeze what exists at its end.

    Nested blocks are fine: only the outermost turns the collector back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
