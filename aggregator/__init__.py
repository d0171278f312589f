"""aggregator: one MCP entry that fronts many MCP servers."""

from __future__ import annotations

# The one place the version is written (pyproject.toml reads it from here): no `importlib.metadata` to
# learn it, which `serve` would import for this alone (1.3 MB RSS with email, zipfile and csv; issue 24).
__version__ = "0.1.0"
