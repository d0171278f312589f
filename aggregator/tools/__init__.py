"""The aggregator's own MCP tools, one module per family."""
