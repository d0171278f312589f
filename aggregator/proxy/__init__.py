"""The proxy core: the aggregator's MCP server, the names it exposes upstream tools and prompts under,
the pass-through of every other request kind, routing, and the relay of upstream requests to clients."""
