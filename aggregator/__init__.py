"""aggregator: one MCP entry that fronts many MCP servers."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`__version__`, read on first use: `aggregator connect` must start without importlib.metadata (~25 ms)."""
    if name != "__version__":
        raise AttributeError(f"module 'aggregator' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("aggregator")
    except PackageNotFoundError:  # running from a source tree
        found = "0.0.0"
    globals()["__version__"] = found
    return found
