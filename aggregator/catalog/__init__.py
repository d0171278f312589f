"""The aggregated catalog: cleaned entries, per-upstream stores, search."""
