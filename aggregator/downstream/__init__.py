"""The client side: the transports a client reaches the aggregator over (stdio, streamable HTTP)
and the framing of what a client sends. Mirrors `aggregator.upstream`, the other direction."""
