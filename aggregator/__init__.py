"""aggregator: one MCP entry that fronts many MCP servers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aggregator")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
