"""Example upstream MCP servers and client configuration snippets for the aggregator.

Each server module runs both as ``python -m aggregator.examples.<module>`` and as
``python examples/<module>.py``:

- ``toolbox``: a stdio / streamable-HTTP / SSE server with ~20 genuinely useful tools (time, text,
  data, math), built with the mcp SDK's ``MCPServer``;
- ``notes``: an in-memory notes store with tools, prompts, resources and a resource template;
- ``testkit``: a standard-library-only, deliberately scriptable server for tests (pagination,
  progress, cancellation, crashes, malformed tool definitions, ``list_changed``).

``clients/`` holds configuration snippets for Claude Desktop, Claude Code, Cursor and VS Code.
"""
